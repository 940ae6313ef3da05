"""The Slurm engine: a claimed job as an sbatch script whose srun starts torchrun on every node
(`launcher.py`). A config's stage script rendered without a cluster: `scheduler/jobs/slurm_script.py`."""

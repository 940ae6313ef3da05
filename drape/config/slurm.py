"""Config of the Slurm engine (`queue.slurm`, scheduler/engines/slurm/launcher.py): what drape's sbatch scripts ask for."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from drape.config.base import StrictModel, mounted
from drape.config.names import SlurmName  # nothing sbatch or a shell would read as a second option


class SlurmLauncherConfig(StrictModel):
    """Drape's queue places (nodes, GPUs per node); Slurm runs each stage job where it was placed
    (``--nodelist``, ``--gres=gpu[:type]:N``) or refuses it, and the refusal fails the job with why."""

    partition: SlurmName | None = Field(
        default=None,
        description="sbatch --partition; with queue.fleet 'slurm' the fleet is this partition's nodes; unset: the first "
        "partition that holds every placed node (Slurm's default partition when the nodes are not known)",
    )
    account: SlurmName | None = Field(default=None, description="sbatch --account; unset: the user's default")
    gres_types: dict[str, SlurmName] = Field(
        default_factory=dict,
        description="fleet GPU model → the gres type Slurm's gres.conf names it (H100-80GB: h100): a job asks for "
        "--gres=gpu:<type>:N, so Slurm holds it to the model the queue placed it on; a model not listed: --gres=gpu:N",
    )
    gpu_memory_gib: dict[SlurmName, Annotated[float, Field(gt=0, le=4096)]] = Field(
        default_factory=dict,
        description="queue.fleet 'slurm': gres type (gres.conf's Type=, 'gpu' for untyped gres) → one GPU's memory "
        "in GiB, which Slurm does not know (a100: 80, h100: 80); a node whose gres names a type not here is an error "
        "naming the node and the type",
    )
    cpus_per_gpu: int = Field(
        default=8,
        ge=1,
        le=256,
        description="sbatch --cpus-per-task per GPU on a node, cut to the job's share of the smallest placed node's "
        "CPUs (its GPUs' fraction of that node's GPUs) when the nodes are known",
    )
    mem_per_gpu_gib: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="host memory the job needs per GPU (sbatch --mem-per-gpu); a placed node with less per GPU "
        "refuses the job naming the node; unset: memory_fraction of each node's memory per GPU",
    )
    memory_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="unset mem_per_gpu_gib: the share of a node's memory (per its GPUs) a job asks for, so no job takes "
        "a whole node's memory and the node keeps room for its own daemons",
    )
    time_limit_minutes: int = Field(
        default=24 * 60,
        ge=1,
        le=60 * 24 * 30,
        description="sbatch --time, cut to the job's partition's time limit when Slurm is asked (sinfo)",
    )
    signal_seconds: int = Field(
        default=300,
        ge=10,
        le=3600,
        description="--signal=B:USR1@<seconds>: this long before the time limit the batch script tells the trainer "
        "to save a checkpoint, publish it and exit; the job is then requeued and resumes from it",
    )
    requeue: bool = Field(default=True, description="sbatch --requeue: a job on a failed node, or preempted, runs again")
    requeued_start_after_seconds: float | None = Field(
        default=None,
        ge=1,
        le=3600,
        description="lift the start delay Slurm gives a requeued job (the cluster's AuthInfo cred_expire, 120 s by "
        "default) this long after the launcher first sees it waiting; too soon, the run before's revoked credential kills "
        "the new run's batch: prefer a shorter cred_expire. "
        "unset: Slurm's own delay",
    )
    rendezvous_port: int = Field(
        default=29500,
        ge=1024,
        le=65519,
        description="torchrun's c10d port on the first node; run k of a requeued job uses this + k % 16, since the "
        "store of the run before may still hold its port; keep all 16 below the nodes' ephemeral range "
        "(net.ipv4.ip_local_port_range, 32768 up by default), where any outgoing connection may hold one",
    )
    rendezvous_timeout_seconds: int = Field(default=900, ge=30, le=86400, description="how long nodes wait for each other")
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines the batch script runs before srun (module load cuda, a virtualenv's activate); "
        "drape's own interpreter path is used as the job's command, so nodes need drape at the same path",
    )
    accounting: str = Field(
        default="slurmdbd",
        pattern=r"^(slurmdbd|jobcomp|queue)$",
        description="where job times come from: slurmdbd (sacct), jobcomp (sacct -c reads the jobcomp/filetxt log, for "
        "a cluster without slurmdbd), or queue (no Slurm accounting: the queue's own claim-to-release times, which include "
        "the wait in Slurm's queue); the cost report names the source and why",
    )
    pending_timeout_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="a job Slurm keeps pending this long for a reason other than waiting its turn (a node down or "
        "drained, a gres it cannot give) is cancelled and fails with Slurm's reason: the schedulers disagree",
    )
    log_dir: str | None = Field(
        default=None,
        description="where Slurm writes each job's output (sbatch --output): a folder the nodes share with the "
        "dispatcher's node, which relays the lines to the flow; default <root>/queue/logs",
        json_schema_extra=mounted("none", "Slurm's: written by slurmd on a shared file system, never in a pod"),
    )
    script_dir: str | None = Field(
        default=None,
        description="where sbatch scripts are written; default <root>/queue/slurm",
        json_schema_extra=mounted("none", "the dispatcher's: sbatch reads it on the login node, never in a pod"),
    )

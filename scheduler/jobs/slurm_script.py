"""The sbatch script drape writes for a config's stage job, rendered without a queue or a cluster
(`drape queue sbatch`, docs/slurm.md): the job as the pipeline's train task submits it (its
memory profile, estimated from the config), placed on `nodes` whole nodes of `gpus_per_node`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from drape import JobKind, parse_stage
from drape.mounts import job_paths
from drape.storage.handoff import job_key
from drape.storage.store import open_store
from scheduler.policy import GpuState


def stage_script(config, *, stage: str, nodes: int, run_id: str = "RUN_ID", python: str = sys.executable) -> str:
    """The batch script of `stage`'s training job of `run_id` on `nodes` nodes (see scheduler/engines/slurm/launcher.py)."""
    from scheduler.engines.slurm.launcher import batch_script
    from scheduler.jobs.profiles import profile

    stage = parse_stage(stage)
    gpus = config.train.gpus_for(stage)
    if nodes < 1 or gpus % nodes:
        raise ValueError(f"{gpus} GPU(s) of stage {stage} do not split evenly over {nodes} node(s)")
    sized = profile(config, None, JobKind.STAGE_TRAINING, stage, gpus)
    command = [python, "-m", "drape.train", "--job", open_store(config).key_url(job_key(run_id, stage))]
    if config.storage.endpoint_url:
        command += ["--store-endpoint", config.storage.endpoint_url]
    job = {
        "id": f"stage-training-JOB_ID-{stage}",
        "kind": str(JobKind.STAGE_TRAINING),
        "stage": stage,
        "attempts": 1,
        "mem_gib": sized.mem_gib,
        "command": json.dumps(command),
        "env": "{}",
        "labels": json.dumps({"run": run_id, "launch": "torchrun", "mounts": json.dumps(job_paths(config))}),
    }
    placed = _placement(config, nodes, gpus // nodes)
    log = Path(config.paths.root) / "queue" / "logs" / f"{job['id']}.log"
    header = f"# memory profile: {sized.mem_gib:.1f} GiB per GPU ({sized.source}), {gpus} GPU(s), shape {sized.shape}\n"
    return batch_script(job, placed, config.queue.slurm, log).replace("\n", "\n" + header, 1)


def _placement(config, nodes: int, per_node: int) -> list[GpuState]:
    """`per_node` GPUs on each of the first `nodes` nodes of the config's static fleet (else nodes
    gpu-00, gpu-01, … of the GPU model `queue.slurm.gres_types` names first, or H100-80GB)."""
    if config.queue.fleet == "static" and config.queue.inventory:
        from scheduler.queue.inventory import load_fleet

        fleet = load_fleet(config.queue.inventory)
        names = sorted({gpu.node for gpu in fleet})[:nodes]
        placed = [gpu for name in names for gpu in [g for g in fleet if g.node == name][:per_node]]
        if len(names) == nodes and len(placed) == nodes * per_node:
            return placed
        raise ValueError(f"{config.queue.inventory}: fewer than {nodes} node(s) of {per_node} GPU(s)")
    model = next(iter(config.queue.slurm.gres_types), "H100-80GB")
    return [GpuState(f"gpu-{n:02d}/gpu{i}", f"gpu-{n:02d}", model, 80.0) for n in range(nodes) for i in range(per_node)]

"""The sbatch script drape writes for a config's stage job, rendered without a queue or a cluster
(`drape queue sbatch`, docs/slurm.md): the job as the pipeline's train task submits it (its
memory profile, estimated from the config), placed on `nodes` nodes of one GPU model of the fleet
with its GPUs split evenly, its CPU, memory, partition and time requests sized to those nodes as
Slurm has them when Slurm can be asked (scheduler/engines/slurm/requests.py)."""

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
    from scheduler.engines.slurm.fleet import SlurmUnreachable
    from scheduler.engines.slurm.launcher import batch_script
    from scheduler.jobs.profiles import profile

    stage = parse_stage(stage)
    gpus = config.train.gpus_for(stage)
    if nodes < 1 or gpus % nodes:
        raise ValueError(f"{gpus} GPU(s) of stage {stage} do not split evenly over {nodes} node(s)")
    try:
        placed = _placement(config, nodes, gpus // nodes)
        slurm_nodes, limits, said = _from_slurm(config, sorted({gpu.node for gpu in placed}))
    except SlurmUnreachable as error:  # queue.fleet 'slurm' off the cluster: said, not a traceback
        raise ValueError(f"queue.fleet 'slurm' reads the fleet from Slurm, which could not be asked: {error}") from None
    sized = profile(config, None, JobKind.STAGE_TRAINING, stage, gpus)  # after the placement: a fleet error comes first
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
    log = Path(config.paths.root) / "queue" / "logs" / f"{job['id']}.log"
    header = f"# memory profile: {sized.mem_gib:.1f} GiB per GPU ({sized.source}), {gpus} GPU(s), shape {sized.shape}\n{said}\n"
    return batch_script(job, placed, config.queue.slurm, log, slurm_nodes, limits).replace("\n", "\n" + header, 1)


def _fleet(config) -> list[GpuState] | None:
    if config.queue.fleet == "slurm":
        from scheduler.engines.slurm.fleet import slurm_gpus

        return slurm_gpus(config.queue.slurm)
    if config.queue.fleet == "static" and config.queue.inventory:
        from scheduler.queue.inventory import load_fleet

        return load_fleet(config.queue.inventory)
    return None


def _placement(config, nodes: int, per_node: int) -> list[GpuState]:
    """`per_node` GPUs on each of `nodes` nodes of one GPU model of the fleet (Slurm's for `queue.fleet:
    slurm`, the static inventory's; nodes Slurm has drained or down are passed over), the first model
    with enough; without a fleet, nodes gpu-00, gpu-01, … of the model `queue.slurm.gres_types` names
    first, or H100-80GB."""
    fleet = _fleet(config)
    if fleet is None:
        model = next(iter(config.queue.slurm.gres_types), "H100-80GB")
        return [GpuState(f"gpu-{n:02d}/gpu{i}", f"gpu-{n:02d}", model, 80.0) for n in range(nodes) for i in range(per_node)]
    usable = [gpu for gpu in fleet if gpu.observed_used_gib is None]  # a drained or down node's are seen full
    for model in sorted({gpu.model for gpu in usable}):
        by_node: dict[str, list[GpuState]] = {}
        for gpu in usable:
            if gpu.model == model:
                by_node.setdefault(gpu.node, []).append(gpu)
        wide = [name for name in sorted(by_node) if len(by_node[name]) >= per_node][:nodes]
        if len(wide) == nodes:
            return [gpu for name in wide for gpu in by_node[name][:per_node]]
    source = "Slurm's nodes" if config.queue.fleet == "slurm" else config.queue.inventory
    raise ValueError(f"{source}: fewer than {nodes} usable node(s) of one GPU model with {per_node} GPU(s) each")


def _from_slurm(config, names: list[str]):
    """The placed nodes and partition time limits as Slurm has them (requests sized to them), and the
    header line saying where the requests came from; off the cluster, the configured values alone."""
    from scheduler.engines.slurm.fleet import SlurmUnreachable, read_nodes, read_partitions

    try:
        found = read_nodes(names)
        limits = read_partitions()
    except (SlurmUnreachable, ValueError) as error:
        if config.queue.fleet == "slurm":
            raise
        del error  # off the cluster: the preview says so in one fixed line, whatever the client said
        return None, None, "# requests: queue.slurm's values alone (Slurm could not be asked; at launch they fit the nodes)"
    if sorted(node.name for node in found) != names:
        missing = sorted(set(names) - {node.name for node in found})
        raise ValueError(f"node(s) {', '.join(missing)} of the fleet are not nodes of this Slurm cluster")
    return found, limits, "# requests: sized to the placed nodes as Slurm has them (scontrol show node, sinfo)"

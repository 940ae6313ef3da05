"""What a placed job asks Slurm for on its nodes, sized from what each node has (`fit`).

One sbatch request holds on every node of the job (``--cpus-per-task``, ``--mem-per-gpu``), so it is
sized to the smallest of them:
- CPUs: `queue.slurm.cpus_per_gpu` per GPU, but never more than the job's share of a node's CPUs
  (its GPUs' fraction of the node's GPUs; the whole node's for a job without GPUs);
- memory: ``--mem-per-gpu`` of `queue.slurm.mem_per_gpu_gib` (what the job needs per GPU) when set,
  else `queue.slurm.memory_fraction` of each node's memory per GPU: a job never asks for a node's
  whole memory by default, and one that needs more than a node has is refused naming the node;
- partition: `queue.slurm.partition`, else the one partition that holds every placed node (a node
  outside the job's partition is a job Slurm refuses);
- time: `queue.slurm.time_limit_minutes`, cut to the partition's limit (a longer ask pends forever
  with ``PartitionTimeLimit``); the cut is said in the script's header.
Without the nodes (a static fleet previewed off the cluster) only the configured values are used.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.engines.slurm.nodes import SlurmNode


class FitError(ValueError):
    """A placement no Slurm request can run as asked: names the node and what is short."""


@dataclass(frozen=True)
class Fitted:
    cpus_per_task: int
    mem_per_gpu_mib: int | None  # None: a job without GPUs, or no node known and nothing configured
    mem_mib: int | None  # a job without GPUs: --mem
    partition: str | None
    time_minutes: int
    notes: tuple[str, ...] = ()


def _partition(settings, nodes: list[SlurmNode]) -> str | None:
    if settings.partition or not nodes:
        named = settings.partition
        outside = [node.name for node in nodes if named and node.partitions and named not in node.partitions]
        if outside:
            raise FitError(f"node {outside[0]} is not in partition {named} (queue.slurm.partition)")
        return named
    common = set(nodes[0].partitions).intersection(*(node.partitions for node in nodes[1:]))
    if not common:
        raise FitError(f"no partition holds all of nodes {', '.join(node.name for node in nodes)}")
    return next(name for name in nodes[0].partitions if name in common)  # the first the node lists


def _cpus(settings, gpus_per_node: int, nodes: list[SlurmNode]) -> int:
    wanted = settings.cpus_per_gpu * max(gpus_per_node, 1)
    shares = [node.cpus * gpus_per_node // node.num_gpus if gpus_per_node and node.num_gpus else node.cpus for node in nodes]
    if nodes and min(shares) < 1:
        small = nodes[shares.index(min(shares))]
        raise FitError(f"node {small.name} has {small.cpus} CPU(s): none to go with {gpus_per_node} of its GPUs")
    return min([wanted, *shares])


def _memory(settings, gpus_per_node: int, nodes: list[SlurmNode]) -> tuple[int | None, int | None, tuple[str, ...]]:
    need = settings.mem_per_gpu_gib * 1024 if settings.mem_per_gpu_gib else None
    if not nodes:
        return need, None, ()
    per_gpu = {node.name: int(node.memory_mib * settings.memory_fraction) // max(node.num_gpus, 1) for node in nodes}
    smallest = min(per_gpu, key=per_gpu.__getitem__)
    if need is not None and need > per_gpu[smallest]:
        raise FitError(
            f"node {smallest} has {per_gpu[smallest]} MiB of memory per GPU (memory_fraction "
            f"{settings.memory_fraction:g}); queue.slurm.mem_per_gpu_gib asks {need} MiB"
        )
    if not gpus_per_node:
        return None, min(int(node.memory_mib * settings.memory_fraction) for node in nodes), ()
    if need is not None:
        return need, None, ()
    note = f"--mem-per-gpu: {settings.memory_fraction:g} of node {smallest}'s memory per GPU (the smallest share)"
    return per_gpu[smallest], None, (note,)


def fit(settings, gpus_per_node: int, nodes: list[SlurmNode], limits: dict[str, int | None] | None = None) -> Fitted:
    """The request for `gpus_per_node` GPUs on each of `nodes` (see the module docstring); `limits`:
    partition → its time limit in minutes (`parse_partitions`)."""
    partition = _partition(settings, nodes)
    mem_per_gpu, mem, notes = _memory(settings, gpus_per_node, nodes)
    time_minutes = settings.time_limit_minutes
    limit = (limits or {}).get(partition or "")
    if limit is not None and limit < time_minutes:
        notes += (f"--time: {time_minutes} min cut to partition {partition}'s limit of {limit} min",)
        time_minutes = limit
    return Fitted(_cpus(settings, gpus_per_node, nodes), mem_per_gpu, mem, partition, time_minutes, notes)

"""The baselines drape's policy is measured against, and the registry of policies by name.

`fifo-exclusive` (the field's ad hoc baseline): first come first served, head-of-line blocking,
one job per whole GPU, and only the biggest GPUs, whatever a job needs.

`kueue-like` (the common Kubernetes baseline): a requests quota, BestEffortFIFO, whole GPUs,
kube-scheduler's least-allocated node.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.policy.plan import plan_drape
from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, allowed


def plan_fifo_exclusive(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """First come first served, one job per whole GPU, biggest GPUs only; stops at the first job that waits."""
    biggest = max((g.total_gib for g in gpus), default=0.0)
    free_by_node: dict[str, list[str]] = {}
    for gpu in sorted(gpus, key=lambda g: g.uuid):
        if gpu.total_gib == biggest and gpu.jobs == 0:
            free_by_node.setdefault(gpu.node, []).append(gpu.uuid)
    placements = []
    for job in sorted(pending, key=lambda j: (j.submit_s, j.id)):
        node = next((n for n, free in free_by_node.items() if len(free) >= job.gpus and job.mem_gib <= biggest), None)
        if node is None:
            break
        chosen, free_by_node[node] = tuple(free_by_node[node][: job.gpus]), free_by_node[node][job.gpus :]
        placements.append(Placement(job.id, chosen, job.mem_gib))
    return placements


def plan_kueue_like(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """A Kueue-like baseline: a requests quota (the whole fleet) admitting jobs first come first
    served, skipping the ones that do not fit now (BestEffortFIFO), whole GPUs per job on one node,
    the node chosen as kube-scheduler's default scoring does (the least allocated), node affinity
    to the allowed GPU models honoured. No memory profiles, no backfill reservation."""
    free: dict[str, list[GpuState]] = {}
    for gpu in sorted(gpus, key=lambda g: g.uuid):
        if gpu.jobs == 0 and gpu.allocated_gib < 1e-6:
            free.setdefault(gpu.node, []).append(gpu)
    placements = []
    for job in sorted(pending, key=lambda j: (j.submit_s, j.id)):
        best = None
        for node, idle in free.items():
            fitting = [g for g in idle if g.total_gib >= job.mem_gib and allowed(job, g.model)]
            if len(fitting) >= job.gpus and (best is None or len(idle) > best[0]):
                best = (len(idle), node, fitting[: job.gpus])
        if best is None:
            continue
        _, node, chosen = best
        free[node] = [g for g in free[node] if g not in chosen]
        placements.append(Placement(job.id, tuple(g.uuid for g in chosen), job.mem_gib))
    return placements


POLICIES: dict[str, Callable[..., list[Placement]]] = {
    "drape": plan_drape,
    "fifo-exclusive": plan_fifo_exclusive,
    "kueue-like": plan_kueue_like,
}


def get_policy(name: str) -> Callable[..., list[Placement]]:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {sorted(POLICIES)}")
    return POLICIES[name]

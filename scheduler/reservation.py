"""EASY backfill's reservation: when and on which GPUs the first job that cannot start now will
fit, from the running jobs' expected ends. A later job may start before it only if it ends
before that time or does not touch the reserved GPUs (`scheduler/policy.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the policy module imports this one
    from scheduler.policy import GpuState, JobRequest, PolicyConfig, RunningJob


@dataclass
class Reservation:
    time_s: float
    gpus: frozenset[str]


def reserve(
    head: JobRequest, gpus: dict[str, GpuState], running: list[RunningJob], now: float, config: PolicyConfig
) -> Reservation | None:
    """When and where `head` fits as running jobs end in expected order (None: never, as things stand)."""
    from scheduler.policy import GpuState, allowed  # at call time: the policy module imports this one

    future = {
        uuid: GpuState(
            g.uuid,
            g.node,
            g.model,
            g.total_gib,
            g.allocated_gib,
            g.jobs,
            max((g.observed_used_gib or 0.0) - g.allocated_gib, 0.0) or None,
            None,
            g.exclusive,
        )
        for uuid, g in gpus.items()
    }
    by_node: dict[str, list[GpuState]] = {}
    for gpu in future.values():
        by_node.setdefault(gpu.node, []).append(gpu)

    def fits_single(gpu: GpuState) -> bool:
        free = gpu.total_gib - gpu.allocated_gib - (gpu.observed_used_gib or 0.0)
        model_ok = not config.constraints or allowed(head, gpu.model)
        return model_ok and free >= head.mem_gib and (gpu.jobs == 0 or (gpu.jobs < config.max_jobs_per_gpu and not gpu.exclusive))

    def fits_node(node: str) -> tuple[str, ...] | None:
        idle = sorted(
            (g.total_gib, g.uuid)
            for g in by_node[node]
            if g.jobs == 0
            and g.allocated_gib < 1e-6
            and g.total_gib >= head.mem_gib
            and not g.observed_used_gib
            and (not config.constraints or allowed(head, g.model))
        )
        return tuple(u for _, u in idle[: head.gpus]) if len(idle) >= head.gpus else None

    for job in sorted(running, key=lambda r: r.expected_end_s):
        for uuid in job.gpus:
            if uuid in future:
                future[uuid].allocated_gib = max(future[uuid].allocated_gib - job.mem_gib, 0.0)
                future[uuid].jobs = max(future[uuid].jobs - 1, 0)
                future[uuid].exclusive = future[uuid].exclusive and len(job.gpus) == 1
        when = max(job.expected_end_s, now)
        if head.gpus == 1:
            for uuid in job.gpus:
                if uuid in future and fits_single(future[uuid]):
                    return Reservation(when, frozenset({uuid}))
        else:
            for node in {future[u].node for u in job.gpus if u in future}:
                chosen = fits_node(node)
                if chosen:
                    return Reservation(when, frozenset(chosen))
    return None

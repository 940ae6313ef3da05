"""EASY backfill's reservation: when and on which GPUs the first job that cannot start now will
fit, from the running jobs' expected ends. A later job may start before it only if it ends
before that time or does not touch the reserved GPUs (`scheduler/policy/plan.py`). Where the end
of a gang across nodes frees several nodes that would each hold it, the first by name is
reserved: never the order of a set (which moves with Python's hash seed, so the same queue was
planned two ways by two processes), and as `scheduler/policy/clearing.py` breaks the tie."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.policy.gangs import even_split
from scheduler.policy.state import GpuState, JobRequest, PolicyConfig, RunningJob, allowed


@dataclass
class Reservation:
    time_s: float
    gpus: frozenset[str]


def reserve(
    head: JobRequest, gpus: dict[str, GpuState], running: list[RunningJob], now: float, config: PolicyConfig
) -> Reservation | None:
    """When and where `head` fits as running jobs end in expected order (None: never, as things stand)."""
    future = {uuid: future_state(g) for uuid, g in gpus.items()}
    by_node: dict[str, list[GpuState]] = {}
    for gpu in future.values():
        by_node.setdefault(gpu.node, []).append(gpu)

    for job in sorted(running, key=lambda r: r.expected_end_s):
        for uuid in job.gpus:
            if uuid in future:
                future[uuid].allocated_gib = max(future[uuid].allocated_gib - job.mem_gib, 0.0)
                future[uuid].jobs = max(future[uuid].jobs - 1, 0)
                future[uuid].exclusive = future[uuid].exclusive and len(job.gpus) == 1
        when = max(job.expected_end_s, now)
        if head.gpus == 1:
            for uuid in job.gpus:
                if uuid in future and _fits_single(head, future[uuid], config):
                    return Reservation(when, frozenset({uuid}))
        else:
            for node in sorted({future[u].node for u in job.gpus if u in future}):  # a gang's nodes: by name
                chosen = _fits_node(head, by_node[node], config)
                if chosen:
                    return Reservation(when, frozenset(chosen))
    return None


def reserve_walk(
    head: JobRequest,
    gpus: dict[str, GpuState],
    nodes: dict[str, list[str]],
    ending: Iterable[RunningJob],
    now: float,
    config: PolicyConfig,
) -> Reservation | None:
    """`reserve` for a planner that keeps the running jobs in expected-end order (`ending`, ties in
    the order they started) and the fleet's GPUs by node (`nodes`): it copies only the GPUs the
    jobs it walks free, and stops at the first that makes room, so its cost is the jobs walked."""
    future: dict[str, GpuState] = {}

    def get(uuid: str) -> GpuState:
        if uuid not in future:
            future[uuid] = future_state(gpus[uuid])
        return future[uuid]

    for job in ending:
        for uuid in job.gpus:
            if uuid in gpus:
                gpu = get(uuid)
                gpu.allocated_gib = max(gpu.allocated_gib - job.mem_gib, 0.0)
                gpu.jobs = max(gpu.jobs - 1, 0)
                gpu.exclusive = gpu.exclusive and len(job.gpus) == 1
        when = max(job.expected_end_s, now)
        if head.gpus == 1:
            for uuid in job.gpus:
                if uuid in gpus and _fits_single(head, get(uuid), config):
                    return Reservation(when, frozenset({uuid}))
        else:
            for node in sorted({gpus[u].node for u in job.gpus if u in gpus}):  # a gang's nodes: by name
                chosen = _fits_node(head, [get(u) for u in nodes[node]], config)
                if chosen:
                    return Reservation(when, frozenset(chosen))
    return None


def reserve_span(
    head: JobRequest, gpus: dict[str, GpuState], ending: Iterable[RunningJob], now: float, most: int
) -> Reservation | None:
    """When and where multi-GPU `head` fits as k nodes × g GPUs of one model (`scheduler/policy/gangs.py`)
    as the running jobs in `ending` (by expected end) end; `most`: the widest node's GPUs. It reads
    the GPUs of the kinds `head` may use once, then walks the jobs until the freed GPUs hold it."""
    kinds = sorted({(g.total_gib, g.model) for g in gpus.values() if g.total_gib >= head.mem_gib and allowed(head, g.model)})
    free: dict[tuple[float, str], dict[str, set[str]]] = {kind: {} for kind in kinds}
    for g in gpus.values():
        if (g.total_gib, g.model) in free and _is_clear(future_state(g)):
            free[(g.total_gib, g.model)].setdefault(g.node, set()).add(g.uuid)
    counts = {kind: sum(len(uuids) for uuids in nodes.values()) for kind, nodes in free.items()}
    future: dict[str, GpuState] = {}
    for job in ending:
        freed = set()
        for uuid in job.gpus:
            if uuid not in gpus:
                continue
            gpu = future.setdefault(uuid, future_state(gpus[uuid]))
            gpu.allocated_gib = max(gpu.allocated_gib - job.mem_gib, 0.0)
            gpu.jobs = max(gpu.jobs - 1, 0)
            gpu.exclusive = gpu.exclusive and len(job.gpus) == 1
            kind = (gpu.total_gib, gpu.model)
            if kind in free and _is_clear(gpu) and uuid not in free[kind].get(gpu.node, ()):
                free[kind].setdefault(gpu.node, set()).add(uuid)
                counts[kind] += 1
                freed.add(kind)
        for kind in kinds:  # the smallest GPUs that hold it first, as a placement now
            if kind in freed and counts[kind] >= head.gpus:
                found = even_split(head.gpus, {node: sorted(uuids) for node, uuids in free[kind].items()}, most)
                if found is not None:
                    return Reservation(max(job.expected_end_s, now), frozenset(found))
    return None


def earlier(first: Reservation | None, second: Reservation | None) -> Reservation | None:
    """The sooner of two reservations (a tie: `first`)."""
    if first is None or (second is not None and second.time_s < first.time_s):
        return second
    return first


def _is_clear(g: GpuState) -> bool:
    return g.jobs == 0 and g.allocated_gib < 1e-6 and not g.observed_used_gib


def future_state(g: GpuState) -> GpuState:
    """A copy of `g` to run the running jobs' ends on: DCGM's reading kept only for memory the
    ledger does not account for (it stays when they end), utilization dropped."""
    return GpuState(
        g.uuid,
        g.node,
        g.model,
        g.total_gib,
        g.allocated_gib,
        g.jobs,
        max((g.observed_used_gib or 0.0) - g.allocated_gib, 0.0) or None,
        None,
        g.exclusive,
        solo=g.solo,
    )


def _fits_single(head: JobRequest, gpu: GpuState, config: PolicyConfig) -> bool:
    free = gpu.total_gib - gpu.allocated_gib - (gpu.observed_used_gib or 0.0)
    return (
        allowed(head, gpu.model)
        and free >= head.mem_gib
        and (gpu.jobs == 0 or (gpu.jobs < config.max_jobs_per_gpu and not gpu.exclusive))
    )


def _fits_node(head: JobRequest, node: list[GpuState], config: PolicyConfig) -> tuple[str, ...] | None:
    idle = sorted(
        (g.total_gib, g.uuid)
        for g in node
        if g.jobs == 0
        and g.allocated_gib < 1e-6
        and g.total_gib >= head.mem_gib
        and not g.observed_used_gib
        and allowed(head, g.model)
    )
    return tuple(u for _, u in idle[: head.gpus]) if len(idle) >= head.gpus else None

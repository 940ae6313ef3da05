"""The drape placement policy: which waiting job goes on which GPUs now. Pure functions, shared
by the live dispatcher and the trace simulator, so what the simulator measures is what runs (the
baselines it is measured against, and the registry by name: `scheduler/policy/baselines.py`).

- priority with aging: effective priority = priority + `aging_per_hour` × hours waited, so no
  job waits forever; a preempted job's hours count from its requeue (`queued_at`), not its submit
  (+ `short_job_bonus` for a single-GPU job expected to run at most
  `short_job_s`: on a full fleet short jobs start first; 0, off, by default);
- best fit by memory, fullest node first: a single-GPU job goes to the smallest idle GPU model
  whose memory holds its profile, on the node with the fewest idle GPUs, so whole
  nodes stay free for multi-GPU jobs (or, with `fragmentation`, on the node where taking a GPU
  adds least to the idle GPUs the workload's widths cannot use, the fullest among equals:
  `scheduler/policy/fragmentation.py`); only when no idle GPU fits is it co-located, on the GPU with
  the fewest jobs, of those the one whose jobs are expected to end soonest (so a long job is not
  slowed for days beside another long one), where its memory fits (at most `max_jobs_per_gpu`
  jobs per GPU, never beside a multi-GPU or exclusive job);
- declared sharing: a job that declares a `share` under 1 of a GPU's compute goes first beside
  jobs whose declared shares leave room for it (they keep full pace), keeping idle GPUs whole;
  an `exclusive` job runs alone on an idle GPU;
- warm caches: a job naming a `prefer_node` (where its stage's shards are cached) goes there if it fits;
- GPU models: a job that names the models it may run on (`models`, each a part of a model's name)
  is placed on nothing else;
- idle-aware: a GPU is idle only when the ledger has nothing on it and DCGM agrees (no memory in
  use beyond `idle_mem_gib`, utilization under `idle_util_percent`); free memory is the total
  minus the larger of the ledger's allocations and what DCGM sees in use;
- whole GPUs for multi-GPU jobs, all on one node, and nothing beside them while they run; where
  the engine spans nodes (`span_nodes`), one no node holds now takes k nodes × g GPUs of one model
  (`scheduler/policy/gangs.py`), its reservation the sooner of one node and several clearing;
- scarce models: a job naming no model keeps off the kinds waiting constrained jobs need, and long
  ones move off them while such a job finds no GPU (`avoid_scarce`, `scheduler/policy/scarcity.py`);
- preemption: a multi-GPU job waiting `preempt_after_s` takes a node by moving lower-priority
  shareable jobs elsewhere; one waiting `gang_max_wait_s` by stopping lower-priority preemptible
  jobs, which resume from their checkpoints (`scheduler/policy/checkpoints.py`); and idle GPUs take
  back jobs crowded onto a shared GPU (`spread_after_s`; `scheduler/policy/preemption.py`), except the
  GPUs reserved for a waiting multi-GPU job;
- EASY backfill: the first job that cannot start gets a reservation (the earliest time and GPUs
  at which it fits, from the running jobs' expected ends); a later job may start now only if it
  ends before that time or does not touch the reserved GPUs.
"""

from __future__ import annotations

from collections import Counter

from scheduler.policy.checkpoints import backlog_of, overdue
from scheduler.policy.fragmentation import widths_by_size
from scheduler.policy.pool import Pool
from scheduler.policy.preemption import Preemptor, preempt, spread, starves
from scheduler.policy.reservation import Reservation, earlier, reserve, reserve_span
from scheduler.policy.scarcity import rescue, scarce_kinds
from scheduler.policy.state import (
    COLOCATION_WINDOW,
    STARVED_AFTER_S,
    GpuState,
    JobRequest,
    Placement,
    PolicyConfig,
    RunningJob,
    allowed,
    allows,
    effective_priority,
    queued_at,
    static_priority,
)

__all__ = [
    "COLOCATION_WINDOW",
    "STARVED_AFTER_S",
    "GpuState",
    "JobRequest",
    "Placement",
    "PolicyConfig",
    "RunningJob",
    "allowed",
    "allows",
    "effective_priority",
    "plan_drape",
    "queued_at",
    "static_priority",
]


def plan_drape(
    pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], now: float, config: PolicyConfig = PolicyConfig()
) -> list[Placement]:
    """Placements to start now under the drape policy (see the module docstring)."""
    state = {g.uuid: GpuState(**vars(g)) for g in gpus}
    widths = {}
    if config.fragmentation:
        per_node = Counter(g.node for g in gpus)
        shapes = [(j.gpus, j.mem_gib) for j in pending] + [(len(r.gpus), r.mem_gib) for r in running]
        widths = widths_by_size(shapes, {g.total_gib for g in gpus}, max(per_node.values(), default=0))
    clear_at: dict[str, float] = {}  # uuid → when its running jobs are expected to have ended
    for ongoing in running:
        for uuid in ongoing.gpus:
            clear_at[uuid] = max(clear_at.get(uuid, now), ongoing.expected_end_s)
    pool = Pool(state, config, widths=widths, now=now, ends=clear_at)
    if config.avoid_scarce:
        pool.avoid = scarce_kinds([j.models for j in pending], _kinds(gpus))
    stuck: dict[tuple, JobRequest] = {}  # per shape, the first constrained job that found no GPUs
    order = sorted(pending, key=lambda j: (-effective_priority(j, now, config), j.submit_s, j.id))
    placements: list[Placement] = []
    reservation: Reservation | None = None
    blocked = False
    backlog = backlog_of(pending, len(gpus), config)
    starving = any(starves(j, now, config) or overdue(j, now, config, backlog) for j in order)
    preemptor = Preemptor(running, config, backlog=backlog) if starving else None
    for job in order:
        if not pool.idle and not pool.shared:
            if preemptor is None:
                break  # nothing can start until something ends
            if job.gpus == 1:
                continue  # only a starving multi-GPU job can start, by preempting
        choice = pool.best_fit(job)
        if choice is None and preemptor is not None and (taken := preempt(preemptor, job, pool, now)):
            pool.empty(taken[0])
            pool.take(taken[0], job)
            placements.append(Placement(job.id, taken[0], job.mem_gib, taken[1]))
            continue
        if choice is None:
            if job.models and config.avoid_scarce:
                stuck.setdefault((job.gpus, job.mem_gib, job.models, job.exclusive, job.share, job.prefer_node), job)
            if not config.backfill:
                break
            if not blocked:
                blocked = True
                durations = {j.id: j.duration_s for j in order}
                ends = running + [RunningJob(p.job_id, p.gpus, p.mem_gib, now + durations[p.job_id]) for p in placements]
                reservation = reserve(job, state, ends, now, config)
                if config.span_nodes and job.gpus > 1:  # or across nodes, if that is sooner
                    ordered = sorted(ends, key=lambda r: r.expected_end_s)
                    reservation = earlier(reservation, reserve_span(job, state, ordered, now, pool.most))
            continue
        if reservation is not None and now + job.duration_s > reservation.time_s and set(choice) & reservation.gpus:
            choice = pool.best_fit(job, exclude=reservation.gpus)
            if choice is None:
                continue
        pool.take(choice, job)
        placements.append(Placement(job.id, choice, job.mem_gib))
    moves = _rescue(list(stuck.values()), pool, state, running, reservation, placements, now)
    return placements + moves + _spread(pool, pending, placements, running, reservation, now, config)


def _kinds(gpus: list[GpuState]) -> set[tuple[str, float]]:
    return {(g.model, g.total_gib) for g in gpus}


def _rescue(
    blocked: list[JobRequest],
    pool: Pool,
    state: dict[str, GpuState],
    running: list[RunningJob],
    reservation: Reservation | None,
    placements: list[Placement],
    now: float,
) -> list[Placement]:
    """Moves of long unconstrained jobs off the GPUs waiting constrained jobs need (`scarcity.py`)."""
    if not blocked or not pool.avoid:
        return []
    on_gpu: dict[str, list[RunningJob]] = {}
    for job in running:
        for uuid in job.gpus:
            on_gpu.setdefault(uuid, []).append(job)
    ordered = sorted(state)

    def gpus_of(job: JobRequest) -> list[str]:
        return [uuid for uuid in ordered if pool._kind_ok(job, (state[uuid].model, state[uuid].total_gib))]

    exclude = reservation.gpus if reservation is not None else frozenset()
    evicted = frozenset(victim for p in placements for victim in p.evicts)
    return rescue(blocked, pool, gpus_of, lambda uuid: on_gpu.get(uuid, []), now, exclude, evicted)


def _spread(
    pool: Pool,
    pending: list[JobRequest],
    placements: list[Placement],
    running: list[RunningJob],
    reservation: Reservation | None,
    now: float,
    config: PolicyConfig,
) -> list[Placement]:
    """Moves of crowded jobs onto idle GPUs (`scheduler/policy/preemption.py`); while a multi-GPU job
    waits, only off the reserved GPUs, and none when nothing is reserved."""
    if config.spread_after_s is None or not pool.idle:
        return []
    placed = {p.job_id for p in placements}
    if not any(j.gpus > 1 and j.id not in placed for j in pending):
        return spread(pool, running, now, config)
    if reservation is not None:
        return spread(pool, running, now, config, exclude=reservation.gpus)
    return []

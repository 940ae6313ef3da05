"""Scarce GPU models: a job that may run anywhere keeps off the models that constrained jobs need.

A job that names the GPU models it may run on (`JobRequest.models`) can wait for that model alone,
while a job that names none goes to the smallest idle GPU that holds it, whatever its model. On a
fleet where the smallest GPUs are also the ones constrained jobs ask for, unconstrained long-lived
services took that model first and nothing moved them: the constrained jobs starved beside idle
GPUs of other models (issue 66). Two rules, by the queue's demand as it stands, not a fixed list:

- `scarce_kinds`: the GPU kinds (model, size) that some waiting constrained job may run on. An
  unconstrained job takes an idle GPU of another kind when one holds it (the smallest such), and a
  scarce one only when none does (`scheduler/policy/pool.py`). Counting the running constrained
  jobs too kept unconstrained jobs off those kinds while nothing waited for them: on the sharing
  week of `benchmarks/wide_gangs.py` (T4 + A10, seed 1) 0.960 of the bound and 623 starved jobs,
  against 0.990 and 350 counting the waiting ones only (0.989 and 526 with neither rule);
- `rescue`: when a constrained single-GPU job finds no GPU in a pass, an unconstrained job that sits
  alone on a GPU it may use, expected to run `spread_after_s` more (a long one: a move costs the
  work since its last checkpoint and a restart), moves to an idle GPU of a kind no constrained job
  needs, by checkpoint preemption (the same move as spreading: it restarts at once, never waits).
  Of such jobs, the one that loses the least work first, then the one expected to run longest.
  One move per waiting constrained shape a pass; the freed GPU is the constrained job's next pass;
- with `PolicyConfig.rescue_gangs` (off), a constrained multi-GPU job that has waited
  `preempt_after_s` clears a node the same way: of the nodes with enough GPUs it may use, the one
  that would clear soonest if its long unconstrained jobs left, when that is within
  `spread_after_s`; they all move in one pass. On `benchmarks/openb_week.py` it ends a week
  whose 8-GPU jobs may run only on two G3 nodes sooner, and one whose 4-GPU jobs need the one
  V100 node later (medians of three replays: benchmarks/README.md), so it stays off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.policy.checkpoints import lost_s
from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, allowed, allows, queued_at

Kind = tuple[str, float]  # (GPU model, total GiB)


def scarce_kinds(demand: Iterable[tuple[str, ...]], kinds: Iterable[Kind]) -> frozenset[Kind]:
    """The kinds some constrained job of `demand` (the models each waiting job names) may run on."""
    wanted = {models for models in demand if models}
    return frozenset(kind for kind in kinds if any(allows(models, kind[0]) for models in wanted))


def movable(job: RunningJob, now: float, config: PolicyConfig) -> bool:
    """Whether running `job` may leave a scarce GPU: unconstrained, single-GPU, shareable,
    preemptible, moved fewer than `max_preemptions` times, expected to run `spread_after_s` more."""
    long_enough = config.spread_after_s is not None and job.expected_end_s - now >= config.spread_after_s
    return (
        long_enough
        and not job.models
        and len(job.gpus) == 1
        and job.shareable
        and job.preemptible
        and job.preempted < config.max_preemptions
    )


def rescue(
    blocked: list[JobRequest],
    pool,
    gpus_of: Callable[[JobRequest], Iterable[str]],
    occupants: Callable[[str], list[RunningJob]],
    now: float,
    exclude: frozenset[str] = frozenset(),
    evicted: frozenset[str] = frozenset(),
) -> list[Placement]:
    """Moves of unconstrained jobs off the GPUs `blocked` constrained jobs may use (the module
    docstring). `gpus_of(job)`: the GPUs of the kinds a job may run on; `occupants(uuid)`: the running
    jobs on a GPU as the pass began; `exclude`: GPUs not to move onto (a waiting gang job's
    reservation); `evicted`: jobs the pass already stops (never moved as well)."""
    config, moves, moved = pool.config, [], set(evicted)
    for job in blocked:
        if not pool.idle:
            break
        if job.gpus > 1:
            if config.rescue_gangs:
                moves += _clear_for_gang(job, pool, gpus_of, occupants, now, exclude, moved)
            continue
        options = []
        for uuid in gpus_of(job):
            gpu: GpuState = pool.gpus[uuid]
            if gpu.total_gib < job.mem_gib or not allowed(job, gpu.model):
                continue
            if (alone := _alone_movable(gpu, occupants(uuid), now, config, moved)) is not None:
                options.append((lost_s(alone, now), -alone.expected_end_s, uuid, alone))
        for _, _, uuid, victim in sorted(options, key=lambda option: option[:3]):
            move = _move(victim, uuid, pool, now, exclude, moved)
            if move is not None:
                moves.append(move)
            break  # one move a shape; none where no idle GPU of a kind nobody needs takes it
    return moves


def _alone_movable(gpu: GpuState, here: list[RunningJob], now: float, config: PolicyConfig, moved: set[str]) -> RunningJob | None:
    """The job on `gpu` if it is alone there (no memory unaccounted for), not moved in this pass, and
    `movable`; else None."""
    unseen = gpu.observed_used_gib is not None and gpu.observed_used_gib > gpu.allocated_gib + config.idle_mem_gib
    if len(here) == 1 and gpu.jobs == 1 and not unseen and here[0].id not in moved and movable(here[0], now, config):
        return here[0]
    return None


def _move(victim: RunningJob, uuid: str, pool, now: float, exclude: frozenset[str], moved: set[str]) -> Placement | None:
    """`victim` off GPU `uuid` onto an idle GPU of a kind no waiting constrained job needs (not in
    `exclude`), by checkpoint preemption; None where there is none: moving would only crowd another
    scarce GPU."""
    left = max(victim.expected_end_s - now, 0.0)
    probe = JobRequest(victim.id, victim.priority, 0.0, 1, victim.mem_gib, left, share=victim.share)
    target = pool.best_fit(probe, exclude=exclude, colocate=False)
    if target is None or (pool.gpus[target[0]].model, pool.gpus[target[0]].total_gib) in pool.avoid:
        return None
    pool.leave(uuid, probe)
    pool.take(target, probe)
    moved.add(victim.id)
    return Placement(victim.id, target, victim.mem_gib, (victim.id,))


def _clear_for_gang(
    job: JobRequest,
    pool,
    gpus_of: Callable[[JobRequest], Iterable[str]],
    occupants: Callable[[str], list[RunningJob]],
    now: float,
    exclude: frozenset[str],
    moved: set[str],
) -> list[Placement]:
    """Moves that clear a node for waiting constrained gang job `job` (`PolicyConfig.rescue_gangs`):
    of the nodes with `job.gpus` GPUs it may use, the one whose GPUs would clear soonest if the
    movable jobs alone on them (`movable`) left, if that is within `spread_after_s`; those of its
    movable jobs that would still run then move to idle GPUs of a kind no constrained job needs,
    the least work lost first. None while the job has waited less than `preempt_after_s` (it may
    start soon as things stand)."""
    config = pool.config
    if config.preempt_after_s is None or now - queued_at(job) < config.preempt_after_s:
        return []
    by_node: dict[str, list[str]] = {}
    for uuid in gpus_of(job):
        gpu: GpuState = pool.gpus[uuid]
        if gpu.total_gib >= job.mem_gib and allowed(job, gpu.model):
            by_node.setdefault(gpu.node, []).append(uuid)
    horizon = now + (config.spread_after_s if config.spread_after_s is not None else float("inf"))
    best: tuple[float, str, list] | None = None
    for node, uuids in sorted(by_node.items()):
        if len(uuids) < job.gpus:
            continue
        clears = []  # per GPU: when it clears if its movable job (or None) left
        for uuid in uuids:
            here = occupants(uuid)
            alone = _alone_movable(pool.gpus[uuid], here, now, config, moved)
            clears.append((now, uuid, alone) if alone else (max([now, *(r.expected_end_s for r in here)]), uuid, None))
        clears = sorted(clears)[: job.gpus]
        when = clears[-1][0]
        movers = [(lost_s(r, now), -r.expected_end_s, uuid, r) for _, uuid, r in clears if r and r.expected_end_s > when]
        if movers and when <= horizon and (best is None or when < best[0]):
            best = (when, node, movers)
    if best is None:
        return []
    moves = []
    off = exclude | frozenset(by_node[best[1]])
    for _, _, uuid, victim in sorted(best[2], key=lambda option: option[:3]):
        if (move := _move(victim, uuid, pool, now, off, moved)) is None:
            break
        moves.append(move)
    return moves

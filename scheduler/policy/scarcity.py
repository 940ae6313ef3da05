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
  One move per waiting constrained shape a pass; the freed GPU is the constrained job's next pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.policy.checkpoints import lost_s
from scheduler.policy.state import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, allowed, allows

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
) -> list[Placement]:
    """Moves of unconstrained jobs off the GPUs `blocked` constrained jobs may use (the module
    docstring). `gpus_of(job)`: the GPUs of the kinds a job may run on; `occupants(uuid)`: the running
    jobs on a GPU; `exclude`: GPUs not to move onto (a waiting gang job's reservation)."""
    config, moves, moved = pool.config, [], set()
    for job in blocked:
        if not pool.idle:
            break
        options = []
        for uuid in gpus_of(job):
            gpu: GpuState = pool.gpus[uuid]
            here = occupants(uuid)
            if gpu.total_gib < job.mem_gib or gpu.jobs != 1 or len(here) != 1 or here[0].id in moved:
                continue
            if gpu.observed_used_gib is not None and gpu.observed_used_gib > gpu.allocated_gib + config.idle_mem_gib:
                continue
            if movable(here[0], now, config) and allowed(job, gpu.model):
                options.append((lost_s(here[0], now), -here[0].expected_end_s, uuid, here[0]))
        for _, _, uuid, victim in sorted(options, key=lambda option: option[:3]):
            left = max(victim.expected_end_s - now, 0.0)
            probe = JobRequest(victim.id, victim.priority, 0.0, 1, victim.mem_gib, left, share=victim.share)
            target = pool.best_fit(probe, exclude=exclude, colocate=False)
            if target is None or (pool.gpus[target[0]].model, pool.gpus[target[0]].total_gib) in pool.avoid:
                break  # no idle GPU of a kind nobody needs: moving would only crowd another scarce one
            pool.leave(uuid, probe)
            pool.take(target, probe)
            moved.add(victim.id)
            moves.append(Placement(victim.id, target, victim.mem_gib, (victim.id,)))
            break
    return moves

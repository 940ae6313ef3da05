"""The least max wait any policy can give each width class when gangs may span nodes (`class_floors`).

`wide_floor.py` counts whole nodes: a job wider than half a node needs nodes of its own. Where the
engine starts a job across nodes (Slurm: k nodes × g GPUs, `scheduler/policy/gangs.py`) a gang may
take parts of nodes, so the relaxation counts GPUs instead: a class's jobs alone (every other job
dropped), every GPU any of them may use theirs, each job interrupted and moved for free, needing
its GPU count at a time at most. Under it the max-flow test of `wide_floor.shortfall` (Horn, 1974)
tells whether every job can end by submit + duration + W; the floor is the largest W found to fail
by bisection within `precision_s` (below the least that passes), so no policy's max wait for the
class is under it. The 1-GPU class is left out: alone on the fleet its jobs hardly wait, and its
goal is a mean. `together_floor` relaxes the multi-GPU classes together: the max over them is
at least it, so where it passes a class's goal, some class misses its goal under every policy.
"""

from __future__ import annotations

from benchmarks.floors.wide_floor import fcfs_max_wait, shortfall
from scheduler.policy.state import GpuState, allows
from scheduler.sim.model import job_class


def gpu_floor(jobs: list[tuple[float, float, int]], gpus: int, precision_s: float = 60.0) -> float:
    """The floor for `jobs` (submit, duration, GPUs; submit order) on `gpus` interchangeable GPUs."""
    if not jobs:
        return 0.0

    def feasible(wait_s: float) -> bool:
        return shortfall(jobs, wait_s, lambda lo, hi: gpus * (hi - lo)) == 0

    lo, hi = 0.0, fcfs_max_wait(jobs, gpus)
    if feasible(0.0):
        return 0.0
    while hi - lo > precision_s:
        middle = (lo + hi) / 2
        lo, hi = (lo, middle) if feasible(middle) else (middle, hi)
    return lo


def class_floors(trace: list, fleet: list[GpuState], precision_s: float = 60.0) -> dict[str, float]:
    """Per width class but the 1-GPU one: the floor of its jobs alone on the GPUs they may use."""
    floors = {}
    for name in sorted({job_class(j.gpus) for j in trace} - {"1"}):
        jobs = sorted((j for j in trace if job_class(j.gpus) == name), key=lambda j: (j.submit_s, j.job_id))
        usable = sum(1 for g in fleet if any(allows(j.models, g.model) and g.total_gib >= j.peak_mem_gib for j in jobs))
        floors[name] = gpu_floor([(j.submit_s, j.duration_s, j.gpus) for j in jobs], usable, precision_s)
    return floors


def together_floor(trace: list, fleet: list[GpuState], precision_s: float = 60.0) -> float:
    """The floor of the max wait over every multi-GPU job together (all their classes at once, on
    every GPU any may use): some class's max wait is at least this, whatever each class's own floor."""
    jobs = sorted((j for j in trace if j.gpus > 1), key=lambda j: (j.submit_s, j.job_id))
    usable = sum(1 for g in fleet if any(allows(j.models, g.model) and g.total_gib >= j.peak_mem_gib for j in jobs))
    return gpu_floor([(j.submit_s, j.duration_s, j.gpus) for j in jobs], usable, precision_s)

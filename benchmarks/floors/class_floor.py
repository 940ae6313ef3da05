"""Floors per width class that account for every other class of the week (`class_joint_floors`).

`span_floor.class_floors` gives each class its jobs alone: 0 h on every wide-gang week, so a goal
"each class within max(1.25 x floor, 1 h)" asks every class for 1 h, which the floor of all the
multi-GPU classes together (`span_floor.together_floor`, 3.5 h on seed 1) proves out of reach.
This floor keeps the whole week: every multi-GPU job, and the single-GPU jobs as
`joint_floor.py` counts them (running from submit, packed at the densest sharing the model
allows, their mean delay at most `mean_delay_s` freeing a budget of GPU-seconds; None drops them).

The relaxation R (a point of it: a wait W_c per class; every job of class c must end by
submit + duration + W_c): the GPUs any multi-GPU job may use are interchangeable, a job may be
interrupted and moved at no cost and needs its GPU count at a time at most, and the work that
cannot end by its deadline (a max flow, `wide_floor.shortfall`) must fit in the budget. Every
schedule any policy makes (its single-GPU mean delay within `mean_delay_s`) is a point of R with
its class max waits, so a point R refuses is a wait vector no policy achieves. A job's wait is
end - submit - duration, as in `wide_floor.py`: for a job never stopped, its wait to start (the
simulator's figure); a stopped job's first start may come sooner.

The floors are R's leximin point: the vector whose largest wait is least, then its next, and so
on, found level by level. At each level the classes not yet fixed share one wait, bisected to
`precision_s` (`floor_s` fails, `passes_s` passes), the classes fixed before held at their
`passes_s`. A class is fixed at that level:
- `alone` when R refuses it at `floor_s` even with the other unfixed classes given all the time
  they want: every schedule that holds the classes fixed before it within their `passes_s` makes
  some job of this class wait longer than `floor_s`;
- else (no class binds alone: the level's classes bind only together) the widest one, `alone`
  False: some class of `shared_with` waits longer than `floor_s` in every such schedule.
Level 1 is the floor of the max over every multi-GPU class (nothing fixed before): no schedule at
all beats it. The `passes_s` vector is a point of R, so no argument from R rules out goals at or
above it: goals max(1.25 x floor_s, 1 h) are stated against floors that are achievable in R
(not proven achievable by a policy). `tests/unit/test_class_floor.py` checks each statement
against every schedule of small weeks, enumerated exhaustively.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.floors.joint_floor import SCALE, Capacity, weights
from benchmarks.floors.wide_floor import shortfall
from scheduler.policy.state import GpuState, allows
from scheduler.sim.model import CLASSES, job_class


@dataclass(frozen=True)
class ClassFloor:
    floor_s: float  # R refuses this wait (module docstring): no schedule of the kind stated beats it
    passes_s: float  # R admits the floors of every class at their passes_s (within precision of floor_s)
    level: int  # 1: the floor of the max over every multi-GPU class; later levels hold the earlier ones
    alone: bool  # binds this class by itself (else some class of `shared_with` waits this long)
    shared_with: tuple[str, ...]  # the classes that were unfixed at its level


def class_joint_floors(
    trace: list, fleet: list[GpuState], mean_delay_s: float | None = 300.0, precision_s: float = 60.0
) -> dict[str, ClassFloor]:
    """The floor (module docstring) of each multi-GPU width class of `trace` on `fleet`; single-GPU
    jobs' mean delay at most `mean_delay_s` (None: they are dropped, any policy)."""
    if mean_delay_s is not None and not (math.isfinite(mean_delay_s) and mean_delay_s >= 0):
        raise ValueError(f"class_joint_floors: mean_delay_s must be None or finite and >= 0, got {mean_delay_s}")
    if not (math.isfinite(precision_s) and precision_s > 0):
        raise ValueError(f"class_joint_floors: precision_s must be finite and > 0, got {precision_s}")
    multi = sorted((j for j in trace if j.gpus > 1), key=lambda j: (j.submit_s, j.job_id))
    if not multi:
        return {}
    jobs = [(j.submit_s, j.duration_s, j.gpus) for j in multi]
    classes = [job_class(j.gpus) for j in multi]
    usable = sum(1 for g in fleet if any(allows(j.models, g.model) and g.total_gib >= j.peak_mem_gib for j in multi))
    if (widest := max(multi, key=lambda j: j.gpus)).gpus > usable:
        raise ValueError(f"class_joint_floors: job {widest.job_id} is wider ({widest.gpus} GPUs) than the {usable} it may use")
    refuses = _relaxation(trace, fleet, multi, jobs, classes, mean_delay_s)
    relaxed = max(j.submit_s + j.duration_s for j in trace) + sum(d for _, d, _ in jobs) + precision_s
    if refuses({c: relaxed for c in classes}):  # past the last single-GPU job every GPU is free: never
        raise RuntimeError("class_joint_floors: the relaxation refuses every wait")
    return _leximin([c for c in CLASSES if c in classes], refuses, relaxed, precision_s)


def _relaxation(trace, fleet, multi, jobs, classes, mean_delay_s) -> Callable[[dict[str, float]], bool]:
    """R's test: whether it refuses a wait per class (work left over the budget)."""
    by_node: dict[str, list[GpuState]] = {}
    for gpu in fleet:
        by_node.setdefault(gpu.node, []).append(gpu)
    usable = [
        node
        for node, gpus in by_node.items()
        if any(allows(j.models, g.model) and g.total_gib >= j.peak_mem_gib for j in multi for g in gpus)
    ]
    width = max(len(by_node[node]) for node in usable) if usable else 0
    if mean_delay_s is None:
        gpus = len(usable) * width
        capacity, budget = (lambda lo, hi: gpus * (hi - lo) * SCALE), 0
    else:
        weight = weights(trace, fleet)
        capacity = Capacity(trace, fleet, usable, width, whole=False)
        budget = math.floor(SCALE * max(weight.values(), default=0.0) * mean_delay_s * len(weight))
    return lambda waits: shortfall(jobs, [waits[c] for c in classes], capacity, SCALE) > budget


def _leximin(order: list[str], refuses, relaxed: float, precision_s: float) -> dict[str, ClassFloor]:
    """R's leximin point, level by level (module docstring); `order`: the classes, narrowest first."""
    fixed: dict[str, ClassFloor] = {}
    free, level, upper = list(order), 0, relaxed
    while free:
        level += 1
        held = {c: f.passes_s for c, f in fixed.items()}
        lo, hi = _bisect(lambda w, held=held, free=free: refuses({**held, **dict.fromkeys(free, w)}), upper, precision_s)
        others = {**held, **dict.fromkeys(free, relaxed)}
        binding = [c for c in free if refuses({**others, c: lo})] if lo > 0 else []
        group = tuple(free)
        if lo == 0.0:
            chosen, alone = list(free), True  # nobody needs to wait: 0 binds trivially
        elif binding:
            chosen, alone = binding, True
        else:
            chosen, alone = [free[-1]], False
        for c in chosen:
            fixed[c] = ClassFloor(lo, hi, level, alone, group)
        free = [c for c in free if c not in chosen]
        upper = hi
    return {c: fixed[c] for c in order}


def _bisect(refuses: Callable[[float], bool], upper: float, precision_s: float) -> tuple[float, float]:
    """(the largest wait found refused, or 0; the least found admitted), within `precision_s`;
    `upper` is admitted. From 1 h doubling first: the week's floors are hours, `upper` weeks."""
    if not refuses(0.0):
        return 0.0, 0.0
    lo, hi = 0.0, min(upper, 3600.0)
    while hi < upper and refuses(hi):
        lo, hi = hi, min(2 * hi, upper)
    while hi - lo > precision_s:
        middle = (lo + hi) / 2
        lo, hi = (middle, hi) if refuses(middle) else (lo, middle)
    return lo, hi

"""Floors per width class given the whole week (benchmarks/floors/class_floor.py), checked as lower bounds
against every schedule of small weeks.

The exact side: on interchangeable GPUs (a superset of what any engine may do: nodes only add
constraints), every start time, non-preemptive. Each statement the floor makes is about a regular
objective (class max waits, the single-GPU jobs' mean wait: none decreases when a job starts
later), so it suffices to check the active schedules (no job can start sooner without delaying
another; any schedule shifts left into one with no start later), and the serial schedule generation
scheme over every order of the jobs makes every active schedule (Kolisch, EJOR 1996).
"""

from __future__ import annotations

import itertools
import random

import pytest

from benchmarks.floors.class_floor import class_joint_floors
from scheduler.sim import TraceJob
from scheduler.sim.model import job_class
from tests.unit.test_bounds import _fleet  # nodes of 8 GPUs of 80 GiB per model

GPUS = 16  # two nodes of 8
UNIT = 100  # seconds: times are whole units, so whole-second rounding in the floor is small beside them


def _job(name: str, submit: float, duration: float, gpus: int) -> TraceJob:
    # 70 GiB on 80 GiB GPUs: two never share one, so a single-GPU job holds a whole GPU (weight 1)
    return TraceJob(name, submit * UNIT, duration * UNIT, 70.0, gpus, 5, "stage-training")


def _schedules(trace: list[TraceJob]) -> set[tuple]:
    """Each active schedule's outcome: (max wait per multi-GPU class, sorted, as pairs; the single-GPU jobs' total wait)."""
    outcomes = set()
    for order in itertools.permutations(trace):
        usage: dict[int, int] = {}
        waits = {}
        for job in order:  # serial generation: each at its earliest start beside those placed before it
            start, duration = int(job.submit_s) // UNIT, int(job.duration_s) // UNIT
            while any(usage.get(t, 0) + job.gpus > GPUS for t in range(start, start + duration)):
                start += 1
            for t in range(start, start + duration):
                usage[t] = usage.get(t, 0) + job.gpus
            waits[job.job_id] = start * UNIT - job.submit_s
        worst: dict[str, float] = {}
        for job in trace:
            if job.gpus > 1:
                worst[job_class(job.gpus)] = max(worst.get(job_class(job.gpus), 0.0), waits[job.job_id])
        singles = sum(waits[j.job_id] for j in trace if j.gpus == 1)
        outcomes.add((tuple(sorted(worst.items())), singles))
    return outcomes


def _refuted(trace: list[TraceJob], floors: dict, mean_delay_s: float | None, outcomes: set | None = None) -> list[str]:
    """Each floor statement (the module docstring of class_floor.py) that some schedule of `trace`
    breaks (`outcomes`: `_schedules(trace)`, if known)."""
    singles = sum(1 for j in trace if j.gpus == 1)
    broken = []
    for worst_pairs, singles_wait in _schedules(trace) if outcomes is None else outcomes:
        if mean_delay_s is not None and singles_wait > mean_delay_s * singles + 1e-9:
            continue  # not a schedule of the kind the floor speaks of
        worst = dict(worst_pairs)
        for name, floor in floors.items():
            earlier = [c for c, f in floors.items() if f.level < floor.level]
            if any(worst[c] > floors[c].passes_s for c in earlier) or floor.floor_s == 0.0:
                continue
            group = (name,) if floor.alone else floor.shared_with
            if max(worst[c] for c in group) <= floor.floor_s:
                broken.append(f"{name}: {worst} with single-GPU waits {singles_wait} beats {floor}")
    return broken


def _week(rng: random.Random, multi: int, singles: int) -> list[TraceJob]:
    jobs = [_job(f"m{i}", rng.randint(0, 3), rng.randint(1, 4), rng.choice((2, 4, 6, 8, 12, 16))) for i in range(multi)]
    jobs += [_job(f"s{i}", rng.randint(0, 3), rng.randint(1, 4), 1) for i in range(singles)]
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def test_no_schedule_of_small_weeks_beats_a_floor_and_the_floors_are_not_all_zero():
    rng, positive, exact_gaps = random.Random(66), 0, []
    for case in range(30):
        trace = _week(rng, multi=5, singles=1) if case % 5 == 0 else _week(rng, multi=4, singles=case % 3)  # <= 6 jobs
        outcomes = _schedules(trace)
        for delay in (None, 0.0, 100.0) if any(j.gpus == 1 for j in trace) else (None,):
            floors = class_joint_floors(trace, _fleet(("H100", 2)), mean_delay_s=delay, precision_s=1.0)
            assert not _refuted(trace, floors, delay, outcomes), trace
            positive += any(f.floor_s > 0 for f in floors.values())
            if delay is None:  # the level-1 floor against the exact least max wait over every class
                best = min(max(dict(pairs).values()) for pairs, _ in outcomes)
                top = max(f.floor_s for f in floors.values())
                assert top < best or best == top == 0.0
                exact_gaps.append(best - top)
    assert positive >= 15  # the weeks are tight enough that the floors say something
    # and it says much: the median gap to the exact best is under two units (what preemption buys)
    assert sorted(exact_gaps)[len(exact_gaps) // 2] <= 2 * UNIT


def test_the_check_refuses_a_floor_above_what_a_schedule_achieves():
    # 16 GPUs: a 16-GPU job for 4 units at 0, an 8-GPU job for 2 at 1: without preemption one of them
    # waits 3 units (b until a ends at 4, or a until b ends at 3)
    trace = [_job("a", 0, 4, 16), _job("b", 1, 2, 8)]
    floors = class_joint_floors(trace, _fleet(("H100", 2)), mean_delay_s=None, precision_s=1.0)
    assert not _refuted(trace, floors, None)
    # preempting and moving for free, a's 64 GPU-units and b's 16 end by 4 + W and 3 + W: W >= 1 unit,
    # a on 8 GPUs while b runs (a ends at 5); the floor sits within rounding and precision below that
    assert 0.97 * UNIT <= max(f.floor_s for f in floors.values()) < UNIT
    inflated = {name: type(f)(3.5 * UNIT, 3.5 * UNIT, f.level, f.alone, f.shared_with) for name, f in floors.items()}
    assert _refuted(trace, inflated, None)  # a floor above the exact best (3 units) is caught


def test_the_classes_the_week_holds_get_floors_and_bad_input_is_named():
    trace = [_job("a", 0, 4, 16), _job("b", 1, 2, 8), _job("c", 1, 3, 4), _job("s", 0, 2, 1)]
    floors = class_joint_floors(trace, _fleet(("H100", 2)), mean_delay_s=0.0, precision_s=1.0)
    assert sorted(floors) == ["2-4", "5-8", "9-16"]
    assert min(f.level for f in floors.values()) == 1
    with pytest.raises(ValueError, match="mean_delay_s"):
        class_joint_floors(trace, _fleet(("H100", 2)), mean_delay_s=float("nan"))
    with pytest.raises(ValueError, match="wider .32 GPUs. than the 16 it may use"):
        class_joint_floors([_job("w", 0, 4, 32)], _fleet(("H100", 2)), mean_delay_s=None)

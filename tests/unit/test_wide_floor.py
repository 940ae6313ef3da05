"""The policy-independent floor on whole-node jobs' max wait (scheduler/wide_floor.py)."""

from __future__ import annotations

import pytest

from scheduler.policy import GpuState
from scheduler.simulator import TraceJob
from scheduler.wide_floor import fcfs_max_wait, feasible, max_wait_floor


def _fleet(*groups: tuple[str, int]) -> list[GpuState]:
    return [
        GpuState(f"{model}-{node}/gpu{i}", f"{model}-{node}", model, 80.0)
        for model, nodes in groups
        for node in range(nodes)
        for i in range(8)
    ]


def _job(name: str, submit: float, duration: float, gpus: int = 8, models: tuple[str, ...] = ()) -> TraceJob:
    return TraceJob(name, submit, duration, 70.0, gpus, 5, "stage-training", models)


def test_a_short_job_behind_a_long_one_on_one_node_waits_the_long_ones_slack_at_least():
    trace = [_job("a", 0.0, 100.0), _job("b", 10.0, 10.0)]
    floor = max_wait_floor(trace, _fleet(("H100", 1)), precision_s=1.0)
    assert floor.fcfs_s == 90.0  # b starts when a ends
    # interrupting a for b, 110 s of work end no sooner than 110: someone waits 10 s; nothing does better
    assert 8.0 <= floor.floor_s < 10.0  # bisection to 1 s; deadlines rounded up to whole seconds relax by < 1 s
    assert (floor.jobs, floor.nodes) == (2, 1)


def test_narrow_jobs_and_nodes_the_wide_jobs_may_not_use_do_not_count():
    trace = [_job("a", 0.0, 100.0, models=("H100",)), _job("b", 0.0, 100.0, models=("H100",)), _job("n", 0.0, 50.0, gpus=4)]
    floor = max_wait_floor(trace, _fleet(("H100", 1), ("L40S", 3)), precision_s=1.0)
    assert (floor.jobs, floor.nodes, floor.fcfs_s) == (2, 1, 100.0)
    assert 98.0 <= floor.floor_s < 100.0  # 200 s of work on one node: one of them ends at 200
    assert max_wait_floor(trace, _fleet(("H100", 2))).floor_s == 0.0


def test_jobs_wider_than_a_node_need_that_many_nodes_at_once_in_fcfs():
    jobs = [(0.0, 100.0, 2), (1.0, 50.0, 1), (2.0, 10.0, 1)]
    assert fcfs_max_wait(jobs, 3) == 49.0  # the second takes the free node, the third waits for it (until 51)
    assert not feasible(jobs, 3, 0.0)  # three nodes busy at 2 s: the third job cannot start on time
    # the relaxation lets the 2-node job run on one node for a while: it and the 50 s job share the
    # 10 s the third needs, x and 10 - x, done late by x / 2 and 10 - x: at best 10/3 s each
    assert feasible(jobs, 3, 4.0) and not feasible(jobs, 3, 3.0)
    assert not feasible([(0.0, 100.0, 2), (0.0, 100.0, 2)], 3, 30.0)  # 400 s of node work on 3 nodes ends past 133


def test_a_job_wider_than_the_fleet_is_an_error():
    with pytest.raises(ValueError, match="more nodes"):
        max_wait_floor([_job("w", 0.0, 1.0, gpus=16)], _fleet(("H100", 1)))

"""Floors on whole-node jobs' max wait: alone (benchmarks/floors/wide_floor.py), beside single-GPU jobs (joint_floor.py)."""

from __future__ import annotations

import pytest

from benchmarks.floors.joint_floor import joint_floor, lacking_node_s, weights
from benchmarks.floors.wide_floor import fcfs_max_wait, feasible, max_wait_floor
from scheduler.sim import TraceJob
from tests.unit.test_bounds import _fleet  # nodes of 8 GPUs of 80 GiB per model


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


def _single(name: str, submit: float, duration: float, mem: float = 20.0, exclusive: bool = False) -> TraceJob:
    return TraceJob(name, submit, duration, mem, 1, 3, "gate-eval", (), exclusive=exclusive)


def test_beside_a_single_gpu_job_the_gang_waits_for_its_node_or_for_its_share_of_a_node():
    # one node; an 8-GPU job of 100 s and a single-GPU job that runs alone on a GPU, both at 0
    trace = [_job("g", 0.0, 100.0), _single("s", 0.0, 50.0, exclusive=True)]
    fleet = _fleet(("H100", 1))
    floor = joint_floor(trace, fleet, mean_delay_s=0.0, precision_s=1.0)
    assert floor.alone_s == 0.0  # alone, the gang starts at once
    # the single holds the node until 50, so the gang ends at 150 at best: waits of 49 s and less fail
    # (deadlines rounded up), and the bisection stops within 1 s of the least that passes
    assert 48.0 <= floor.arrival_s <= 49.0
    # fractionally the single holds 1/8 node for 50 s: 100 node-s of gang work end by 106.25, a wait
    # of 6.25 s; deadlines rounded up to whole seconds make it the least wait over 6 s
    assert 5.0 <= floor.joint_s <= 6.0
    # 8 s of mean delay for the one single frees 8/8 node-s: 5.25 s, over 5 s in whole seconds
    delayed = joint_floor(trace, fleet, mean_delay_s=8.0, precision_s=1.0)
    assert delayed.budget_node_s == 1.0 and 4.0 <= delayed.joint_s <= 5.0
    assert lacking_node_s(trace, fleet, 0.0) == pytest.approx(100 - (100 - 50 / 8), abs=0.01)


def test_single_gpu_jobs_count_at_the_tightest_packing_memory_allows_and_off_the_gangs_nodes_first():
    # the smallest job sets the packing: 20 GiB, four to an 80 GiB GPU at pace 1.21 / 4 each; 40 GiB: two at 1.07 / 2
    assert weights([_single("a", 0.0, 1.0), _single("b", 0.0, 1.0, mem=30.0)], _fleet(("H100", 1))) == {
        "a": pytest.approx(1 / 1.21),
        "b": pytest.approx(1 / 1.21),
    }
    assert weights([_single("a", 0.0, 1.0, mem=40.0)], _fleet(("H100", 1)))["a"] == pytest.approx(1 / 1.07)
    # a single that may run on the L40S node does, and leaves the H100-only gang its node
    trace = [_job("g", 0.0, 100.0, models=("H100",)), _single("s", 0.0, 50.0, exclusive=True)]
    assert joint_floor(trace, _fleet(("H100", 1), ("L40S", 1)), mean_delay_s=0.0).arrival_s == 0.0
    # a 5-GPU job leaves three GPUs of its node: the single runs beside it, nobody waits
    narrow = [_job("g", 0.0, 100.0, gpus=5), _single("s", 0.0, 50.0, exclusive=True)]
    assert joint_floor(narrow, _fleet(("H100", 1)), mean_delay_s=0.0).arrival_s == 0.0
    with pytest.raises(ValueError, match="mean_delay_s"):
        joint_floor(trace, _fleet(("H100", 1)), mean_delay_s=-1.0)

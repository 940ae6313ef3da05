"""The whole-node jobs' floor beside single-GPU jobs that start on arrival (benchmarks/floors/gang_floor.py)."""

from __future__ import annotations

import pytest

from benchmarks.floors.gang_floor import gang_floor
from scheduler.policy import GpuState
from scheduler.sim import TraceJob


def _fleet(*groups: tuple[str, int]) -> list[GpuState]:
    return [
        GpuState(f"{model}-{node}/gpu{i}", f"{model}-{node}", model, 80.0)
        for model, nodes in groups
        for node in range(nodes)
        for i in range(8)
    ]


def _singles(count: int, end: float, models: tuple[str, ...] = ()) -> list[TraceJob]:
    return [TraceJob(f"s{i}", 0.0, end, 30.0, 1, 3, "service", models) for i in range(count)]


def _gang(name: str, submit: float, duration: float, models: tuple[str, ...] = ()) -> TraceJob:
    return TraceJob(name, submit, duration, 70.0, 8, 5, "stage-training", models)


def test_nine_single_jobs_fill_two_nodes_until_they_end_and_two_to_a_gpu_fill_one():
    trace = [*_singles(9, 100.0), _gang("g", 10.0, 50.0)]
    alone = gang_floor(trace, _fleet(("H100", 2)))
    assert alone.waits_s == [90.0]  # 9 jobs need 2 nodes of 8 GPUs: the gang waits for them to end
    shared = gang_floor(trace, _fleet(("H100", 2)), per_gpu=2)
    assert shared.waits_s == [0.0]  # 5 GPUs hold the 9: one node is free at once
    assert (alone.mean_s, alone.max_s, alone.over(60.0), alone.over(90.0)) == (90.0, 90.0, 1, 0)


def test_whole_node_jobs_take_free_nodes_in_submission_order():
    trace = [_gang("a", 0.0, 100.0), _gang("b", 5.0, 10.0), _gang("c", 6.0, 10.0)]
    floor = gang_floor(trace, _fleet(("H100", 2)))
    assert floor.waits_s == [0.0, 0.0, 9.0]  # c starts when b ends at 15


def test_single_jobs_that_allow_the_other_model_fill_its_nodes_first():
    trace = [*_singles(8, 100.0), *_singles(4, 100.0, ("H100",)), _gang("g", 1.0, 10.0, ("H100",))]
    fleet = _fleet(("H100", 1), ("L40S", 1))
    assert gang_floor(trace, fleet).waits_s == [99.0]  # the 4 H100-only jobs hold the one H100 node
    flexible = [*_singles(12, 100.0), _gang("g", 1.0, 10.0, ("H100",))]
    assert gang_floor(flexible, fleet).waits_s == [99.0]  # 8 fill the L40S node, 4 spill onto the H100 node
    fewer = [*_singles(8, 100.0), _gang("g", 1.0, 10.0, ("H100",))]
    assert gang_floor(fewer, fleet).waits_s == [0.0]  # all 8 fit on the L40S node
    away = [*_singles(4, 100.0, ("L40S",)), *_singles(8, 100.0), _gang("g", 1.0, 10.0, ("H100",))]
    assert gang_floor(away, fleet).waits_s == [99.0]  # 4 L40S-only jobs leave room there for 4: 4 spill
    apart = [*_singles(12, 100.0, ("L40S",)), _gang("g", 1.0, 10.0, ("H100",))]
    assert gang_floor(apart, fleet).waits_s == [0.0]  # more than the L40S node holds, yet they never hold an H100


def test_a_floor_needs_one_model_set_and_a_fleet_wide_enough():
    with pytest.raises(ValueError, match="different GPU models"):
        gang_floor([_gang("a", 0.0, 1.0, ("H100",)), _gang("b", 0.0, 1.0)], _fleet(("H100", 1)))
    with pytest.raises(ValueError, match="per_gpu"):
        gang_floor([], _fleet(("H100", 1)), per_gpu=0)
    wide = TraceJob("w", 0.0, 1.0, 70.0, 16, 5, "stage-training")
    with pytest.raises(RuntimeError, match="wider than the fleet"):
        gang_floor([wide], _fleet(("H100", 1)))
    assert gang_floor(_singles(3, 5.0), _fleet(("H100", 1))).waits_s == []

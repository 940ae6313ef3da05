"""Floors per width class when gangs may span nodes (benchmarks/floors/span_floor.py): GPUs, not nodes."""

from __future__ import annotations

from benchmarks.floors.span_floor import class_floors, gpu_floor, together_floor
from scheduler.sim import TraceJob
from tests.unit.test_bounds import _fleet  # nodes of 8 GPUs of 80 GiB per model


def _job(name: str, submit: float, duration: float, gpus: int) -> TraceJob:
    return TraceJob(name, submit, duration, 70.0, gpus, 5, "stage-training")


def test_a_gang_wider_than_the_free_gpus_waits_its_share_and_classes_alone_hardly_wait():
    # 16 GPUs: a 12-GPU job for 100 s, then an 8-GPU job at 10 s, each waiting at most W: by 100 + W the
    # first needs its 1,080 GPU-s left after 10 s and the second at least 800 - 8 × 10 (it runs on 8
    # at most after): 1,800 GPU-s in 90 + W seconds on 16 GPUs, so W >= 22.5 s
    assert 20.0 <= gpu_floor([(0.0, 100.0, 12), (10.0, 100.0, 8)], 16, precision_s=1.0) < 22.5
    trace = [_job("a", 0.0, 100.0, 12), _job("b", 10.0, 100.0, 8)]
    fleet = _fleet(("H100", 2))
    assert class_floors(trace, fleet, precision_s=1.0) == {"5-8": 0.0, "9-16": 0.0}  # each class alone: none
    assert 20.0 <= together_floor(trace, fleet, precision_s=1.0) < 22.5  # together: one of them waits

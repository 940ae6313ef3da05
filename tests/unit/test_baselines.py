"""The references drape is measured against (`scheduler/policy/baselines.py`): FIFO + EASY backfill,
the same in priority order, and whole-GPU FIFO + greedy backfill, on one node or across nodes."""

from dataclasses import replace

from scheduler.policy import GpuState, JobRequest, PolicyConfig, RunningJob
from scheduler.policy.baselines import POLICIES, SPANS_ITSELF, plan_fifo_backfill, plan_fifo_easy, plan_priority_easy


def _fleet() -> list[GpuState]:
    gpus = [GpuState(f"n{n}/gpu{i}", f"n{n}", "H100", 80.0) for n in range(2) for i in range(2)]
    for gpu in (gpus[1], gpus[2]):  # n0/gpu1 ends at 100 (n0 clears first), n1/gpu0 at 200
        gpu.jobs, gpu.allocated_gib = 1, 10.0
    return gpus


RUNNING = [RunningJob("a", ("n0/gpu1",), 10.0, 100.0), RunningJob("b", ("n1/gpu0",), 10.0, 200.0)]
WIDE = JobRequest("wide", 5, 0.0, 2, 70.0, 1000.0)


def _placed(plan, jobs, config=PolicyConfig()) -> dict[str, tuple[str, ...]]:
    return {p.job_id: p.gpus for p in plan(jobs, _fleet(), RUNNING, 0.0, config)}


def test_easy_backfill_keeps_a_long_job_off_the_head_s_reservation_and_greedy_does_not():
    long = JobRequest("long", 3, 1.0, 1, 10.0, 5000.0)
    short = JobRequest("short", 3, 2.0, 1, 10.0, 50.0)
    # the head (2 GPUs) fits nowhere now; n0 clears at 100: its GPUs are reserved
    assert _placed(plan_fifo_easy, [WIDE, long]) == {"long": ("n1/gpu1",)}  # off the reservation
    assert _placed(plan_fifo_backfill, [WIDE, long]) == {"long": ("n0/gpu0",)}  # the smallest, first node
    assert _placed(plan_fifo_easy, [WIDE, short]) == {"short": ("n0/gpu0",)}  # ends before 100: may use it
    early = replace(long, submit_s=-1.0)  # first come, first served: before the head, it goes where it fits best
    assert _placed(plan_fifo_easy, [WIDE, early]) == {"long": ("n0/gpu0",)}


def test_across_nodes_where_the_engine_spans_them():
    spans = PolicyConfig(span_nodes=True)
    assert _placed(plan_fifo_easy, [WIDE], spans) == {"wide": ("n0/gpu0", "n1/gpu1")}  # 2 nodes × 1
    assert _placed(plan_fifo_backfill, [WIDE]) == {}
    assert {"fifo-easy", "fifo-backfill"} <= POLICIES.keys()


def test_priority_easy_reserves_for_the_highest_priority_job_that_waits_not_the_first_come():
    low = JobRequest("low", 1, -10.0, 1, 10.0, 5000.0)  # before the 2-GPU head, of a lower priority
    # first come first served: the low job is first and fits now, on the best-fitting GPU
    assert _placed(plan_fifo_easy, [WIDE, low]) == {"low": ("n0/gpu0",)}
    # priority order: the 2-GPU job of priority 5 is first, waits, and holds n0 from 100; the long low job
    # would delay it there, so it goes off the reservation
    assert _placed(plan_priority_easy, [WIDE, low]) == {"low": ("n1/gpu1",)}
    short = replace(low, duration_s=50.0)  # ends before 100: it may use the reserved GPU
    assert _placed(plan_priority_easy, [WIDE, short]) == {"low": ("n0/gpu0",)}
    # one priority for all: the same as fifo-easy
    same = replace(low, priority=5)
    assert _placed(plan_priority_easy, [WIDE, same]) == _placed(plan_fifo_easy, [WIDE, same])
    assert "priority-easy" in POLICIES and "priority-easy" in SPANS_ITSELF

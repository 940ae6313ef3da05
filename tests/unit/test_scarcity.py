"""Scarce GPU models (`scheduler/policy/scarcity.py`): jobs that may run anywhere keep off the model
constrained jobs need, and long ones move off it while such a job waits."""

from dataclasses import replace

from scheduler.policy import GpuState, JobRequest, PolicyConfig, RunningJob, plan_drape
from scheduler.policy.scarcity import scarce_kinds
from scheduler.sim import simulate
from tests.unit.test_planner import scarce_days, scarce_fleet


def test_the_scarce_kinds_are_those_constrained_jobs_name_now():
    kinds = [("T4-16GB", 16.0), ("A10-24GB", 24.0), ("H100-80GB", 80.0)]
    assert scarce_kinds([(), ("t4",), ()], kinds) == {("T4-16GB", 16.0)}
    assert scarce_kinds([("A10", "H100")], kinds) == {("A10-24GB", 24.0), ("H100-80GB", 80.0)}
    assert scarce_kinds([(), ()], kinds) == frozenset()


def _fleet() -> list[GpuState]:
    return [GpuState("t/gpu0", "t", "T4-16GB", 16.0), GpuState("a/gpu0", "a", "A10-24GB", 24.0)]


def test_an_unconstrained_job_takes_another_model_while_a_constrained_job_needs_the_smallest():
    small = JobRequest("small", 3, 0.0, 1, 8.0, 3600.0)
    pinned = JobRequest("pinned", 3, 5.0, 1, 8.0, 3600.0, models=("T4",))
    placed = {p.job_id: p.gpus for p in plan_drape([small], _fleet(), [], 10.0)}
    assert placed == {"small": ("t/gpu0",)}  # nobody needs the T4: the smallest GPU that holds it
    running = [RunningJob("other", ("x/gpu0",), 8.0, 5000.0, models=("T4",))]  # one that runs asks nothing more
    assert {p.job_id: p.gpus for p in plan_drape([small], _fleet(), running, 10.0)} == {"small": ("t/gpu0",)}
    placed = {p.job_id: p.gpus for p in plan_drape([small, pinned], _fleet(), [], 10.0)}
    assert placed == {"small": ("a/gpu0",), "pinned": ("t/gpu0",)}
    off = PolicyConfig(avoid_scarce=False)  # as before: the smallest GPU first; the T4 job shares it, at shared pace
    placed = {p.job_id: p.gpus for p in plan_drape([small, pinned], _fleet(), [], 10.0, off)}
    assert placed == {"small": ("t/gpu0",), "pinned": ("t/gpu0",)}


def test_a_long_unconstrained_job_on_the_scarce_model_moves_for_a_waiting_constrained_job():
    gpus = _fleet()
    gpus[0].jobs, gpus[0].allocated_gib, gpus[0].shares = 1, 12.0, 1.0
    service = RunningJob("service", ("t/gpu0",), 12.0, 90_000.0, shareable=True, started_s=0.0)
    pinned = JobRequest("pinned", 3, 5.0, 1, 14.0, 3600.0, models=("T4",))
    moves = plan_drape([pinned], gpus, [service], 100.0)
    assert [(p.job_id, p.gpus, p.evicts) for p in moves] == [("service", ("a/gpu0",), ("service",))]
    ending = replace(service, expected_end_s=1000.0)  # ends within spread_after_s: not worth a move
    assert plan_drape([pinned], gpus, [ending], 100.0) == []
    assert plan_drape([pinned], gpus, [service], 100.0, PolicyConfig(avoid_scarce=False)) == []


def test_on_sharing_days_only_unconstrained_jobs_move_off_the_t4s_and_nothing_runs_where_it_may_not():
    """~1 s: services move off the T4s to A10s; no T4-only job leaves one (the measured effect on
    waits: `benchmarks/wide_gangs.py`'s sharing week)."""
    trace, fleet = scarce_days(2, 3), scarce_fleet()
    constrained = {j.job_id for j in trace if j.models}
    record: list = []
    result = simulate(trace, fleet, "drape", PolicyConfig(), record=record)
    where: dict[str, tuple[str, ...]] = {}
    moves = []
    for _, job, gpus, evicted in record:
        if evicted == (job,) and where[job][0].startswith("t"):
            moves.append((job, gpus))
        where[job] = gpus
    off = [job for job, gpus in moves if gpus[0].startswith("a")]  # T4 to T4: spreading a crowded GPU
    assert len(off) >= 3 and not constrained.intersection(off)
    assert result.violations == 0


def _g3_node_and_a10s() -> list[GpuState]:
    """Two nodes shaped unlike the others here: 4 G3s (`rack2.g3-x`), 2 A10s (`edge-a10`)."""
    return [GpuState(f"rack2.g3-x/{i}", "rack2.g3-x", "G3", 32.0) for i in range(4)] + [
        GpuState(f"edge-a10/{i}", "edge-a10", "A10", 24.0) for i in range(2)
    ]


def test_with_rescue_gangs_a_waiting_constrained_gang_clears_its_node_of_long_unconstrained_jobs():
    gpus = _g3_node_and_a10s()
    for gpu in gpus[:2]:
        gpu.jobs, gpu.allocated_gib, gpu.shares = 1, 10.0, 1.0
    # of the gang's priority, so it cannot preempt them: only the move clears the node
    long = RunningJob("service", ("rack2.g3-x/0",), 10.0, 90_000.0, 3, shareable=True, started_s=0.0)
    ending = RunningJob("gate", ("rack2.g3-x/1",), 10.0, 2_000.0, 3, shareable=True, started_s=0.0)  # clears within the hour
    gang = JobRequest("g3-train", 3, 0.0, 4, 20.0, 3600.0, models=("G3",))
    on = PolicyConfig(rescue_gangs=True)
    moves = plan_drape([gang], gpus, [long, ending], 1500.0, on)
    assert [(p.job_id, p.gpus, p.evicts) for p in moves] == [("service", ("edge-a10/0",), ("service",))]
    assert plan_drape([gang], gpus, [long, ending], 1500.0) == []  # off by default
    assert plan_drape([gang], gpus, [long, ending], 600.0, on) == []  # waited less than preempt_after_s (20 min)
    held = replace(ending, models=("G3",), expected_end_s=50_000.0)  # the node clears only in 13 h: no move
    assert plan_drape([gang], gpus, [long, held], 1500.0, on) == []
    pinned = replace(long, models=("G3",))  # a constrained job never moves
    assert plan_drape([gang], gpus, [pinned, ending], 1500.0, on) == []

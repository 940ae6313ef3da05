"""Gang waits bounded by checkpoint preemption (`scheduler/policy/checkpoints.py`): which jobs an overdue gang
job stops, in `plan_drape` and the `Planner` alike, and the fields that declare it (all under 0.1 s)."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from scheduler.policy import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, effective_priority, plan_drape
from scheduler.policy.planner import Planner
from scheduler.queue.schema import QueueError, job_request, running_job
from scheduler.queue.store import JobSpec

BOUNDED = PolicyConfig(preempt_after_s=None, gang_max_wait_s=3600.0)
NOW = 10_000.0


def full_fleet() -> tuple[list[GpuState], list[RunningJob]]:
    """Two nodes of two H100s, each GPU running one single-GPU job: node a's started 300 s into a
    10-min checkpoint (300 s of work to lose each), node b's 650 s ago (50 s each)."""
    gpus, running = [], []
    for node, started in (("a", NOW - 300), ("b", NOW - 650)):
        for index in range(2):
            gpu = GpuState(f"{node}/gpu{index}", node, "H100", 80.0, allocated_gib=30.0, jobs=1, shares=1.0)
            gpus.append(gpu)
            running.append(RunningJob(f"{node}{index}", (gpu.uuid,), 30.0, NOW + 36000, 3, True, started_s=started))
    return gpus, running


def gang(submit: float = NOW - 2 * 3600, priority: int = 5, queued_s: float | None = None) -> JobRequest:
    return JobRequest("gang", priority, submit, 2, 70.0, 3600.0, queued_s=queued_s)


def both(pending: list[JobRequest], gpus: list[GpuState], running: list[RunningJob], config=BOUNDED) -> list[Placement]:
    """`plan_drape`'s placements, checked to be the `Planner`'s too."""
    placed = plan_drape(pending, gpus, running, NOW, config)
    planner = Planner([GpuState(g.uuid, g.node, g.model, g.total_gib) for g in gpus], config)
    for job in running:  # each started as the caller knows it (priority, cadence, preemptions, when)
        duration = job.expected_end_s - job.started_s
        submit = job.started_s - job.waited_s  # so the planner counts the wait the caller gives it
        request = JobRequest(job.id, job.priority, submit, len(job.gpus), job.mem_gib, duration, preempted=job.preempted)
        planner.submit(dataclasses.replace(request, preemptible=job.preemptible, checkpoint_every_s=job.checkpoint_every_s))
        planner.start(Placement(job.id, job.gpus, job.mem_gib), job.started_s)
    for job in pending:
        planner.submit(job)
    assert planner.plan(NOW) == placed
    return placed


def test_an_overdue_gang_job_stops_the_jobs_that_lose_least_work():
    gpus, running = full_fleet()
    (placement,) = both([gang()], gpus, running)
    assert placement.gpus == ("b/gpu0", "b/gpu1") and placement.evicts == ("b0", "b1")
    assert both([gang(submit=NOW - 1800)], gpus, running) == []  # not waited the bound yet
    assert both([gang()], gpus, running, PolicyConfig(preempt_after_s=None)) == []  # no bound: never


def test_what_an_overdue_gang_job_never_stops():
    gpus, running = full_fleet()
    pinned = [
        RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, 3, True, preemptible=r.id != "b0", started_s=r.started_s)
        for r in running
    ]
    (placement,) = both([gang()], gpus, pinned)
    assert placement.evicts == ("a0", "a1")  # a job that may not be preempted keeps its node
    tired = [RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, 3, True, preempted=4, started_s=r.started_s) for r in running]
    assert both([gang()], gpus, tired) == []  # preempted gang_max_preemptions times already
    assert both([gang(priority=3)], gpus, running) == []  # jobs of its own priority (or higher) run on
    wide = [RunningJob("w", ("b/gpu0", "b/gpu1"), 30.0, NOW + 36000, 3, False, started_s=NOW - 300)]
    (placement,) = both([gang()], gpus[2:], wide)
    assert placement.evicts == ("w",)  # a lower-priority multi-GPU job may be stopped
    # a gang job of its priority runs on, even one started after this one was submitted: stopping
    # younger ones would restore first-come-first-served among gang jobs, which the benchmark never
    # lacked (scheduler/policy/checkpoints.py)
    younger = [dataclasses.replace(wide[0], priority=5, started_s=NOW - 60)]
    assert both([gang()], gpus[2:], younger) == []


def test_with_longer_a_gang_job_stops_one_of_its_priority_with_that_many_times_its_run_left():
    """Node b runs a 2-GPU job of the gang's priority with 10 h left; the waiting gang runs 1 h."""
    gpus, _ = full_fleet()
    held = [RunningJob("w", ("b/gpu0", "b/gpu1"), 30.0, NOW + 36000, 5, False, started_s=NOW - 300)]
    longer = dataclasses.replace(BOUNDED, gang_stops_longer=4.0)
    (placement,) = both([gang()], gpus[2:], held, longer)
    assert placement.evicts == ("w",)  # 10 h left >= 4 x 1 h: shortest work first among equals
    assert both([gang()], gpus[2:], held, dataclasses.replace(BOUNDED, gang_stops_longer=20.0)) == []  # 10 h < 20 x 1 h
    assert both([gang(submit=NOW - 1800)], gpus[2:], held, longer) == []  # not waited the bound yet
    assert both([gang(priority=6)], gpus[2:], held, longer)[0].evicts == ("w",)  # lower priority: stopped as before
    tired = [dataclasses.replace(held[0], preempted=4)]
    assert both([gang()], gpus[2:], tired, longer) == []  # the stop cap holds for equals too
    # the job it stopped, requeued with its 10 h and overdue in turn, never stops it back (1 h left < 4 x 10 h)
    stopped = JobRequest("w", 5, NOW - 2 * 3600, 2, 30.0, 36000.0)
    short = [RunningJob("gang", ("b/gpu0", "b/gpu1"), 70.0, NOW + 3600, 5, False, started_s=NOW - 60)]
    assert both([stopped], gpus[2:], short, longer) == []
    single = [RunningJob("s", ("b/gpu0",), 30.0, NOW + 36000, 5, True, started_s=NOW - 300)]
    assert both([gang()], gpus[2:3], single, longer) == []  # equals are stopped only when they are gang jobs


def test_with_waited_a_gang_job_stops_one_of_its_priority_that_waited_that_much_less():
    """Node b runs a 2-GPU job of the gang's priority that waited 10 min before it started 5 min ago
    (10 h left); the gang job waiting for a node has waited 2 h. No bound on waits is set."""
    gpus, running = full_fleet()
    held = [RunningJob("w", ("b/gpu0", "b/gpu1"), 30.0, NOW + 36000, 5, False, started_s=NOW - 300, waited_s=600.0)]
    waited = PolicyConfig(preempt_after_s=None, gang_stops_waited=3600.0, gang_bound_whole_wait=True)
    (placement,) = both([gang()], gpus[2:], held, waited)
    assert placement.evicts == ("w",)  # 2 h >= 10 min + 1 h
    assert both([gang(submit=NOW - 4000)], gpus[2:], held, waited) == []  # 4,000 s < 600 s + 3,600 s
    assert both([gang()], gpus[2:], [dataclasses.replace(held[0], waited_s=5000.0)], waited) == []  # it waited long too
    assert both([gang()], gpus[2:], held, dataclasses.replace(waited, gang_stops_waited=7200.0)) == []  # 2 h < 10 min + 2 h
    assert both([gang()], gpus[2:], [dataclasses.replace(held[0], preempted=4)], waited) == []  # the stop cap holds
    assert both([gang(priority=4)], gpus[2:], held, waited) == []  # a higher priority is never stopped
    # nor a lower one, nor single-GPU jobs, while the gang job is within its bound: only equal gang jobs
    assert both([gang(priority=6)], gpus[2:], held, waited) == []
    assert both([gang()], gpus, running, waited) == []
    bounded = dataclasses.replace(waited, gang_max_wait_s=3600.0)  # past a bound, as before
    assert both([gang()], gpus, running, bounded)[0].evicts == ("b0", "b1")
    # the waits are whole: a requeued gang job counts its wait before the requeue (1.5 h) and since (20 min)
    requeued = dataclasses.replace(gang(queued_s=NOW - 1200), waited_s=5400.0)
    assert both([requeued], gpus[2:], held, waited)[0].evicts == ("w",)
    # of two equals that waited less, the one that waited least; the one stopped never stops it back at once
    gpus = [GpuState(f"{n}/gpu{i}", n, "H100", 80.0) for n in ("b", "c") for i in range(2)]
    two = [
        RunningJob("w", ("b/gpu0", "b/gpu1"), 30.0, NOW + 36000, 5, False, started_s=NOW - 300, waited_s=600.0),
        RunningJob("v", ("c/gpu0", "c/gpu1"), 30.0, NOW + 36000, 5, False, started_s=NOW - 300, waited_s=60.0),
    ]
    gpus = [dataclasses.replace(g, jobs=1, allocated_gib=30.0, exclusive=True, shares=1.0) for g in gpus]
    (placement,) = both([gang()], gpus, two, waited)
    assert placement.evicts == ("v",) and placement.gpus == ("c/gpu0", "c/gpu1")
    stopped = dataclasses.replace(JobRequest("v", 5, NOW - 600, 2, 30.0, 36000.0, queued_s=NOW - 60), waited_s=60.0)
    took = RunningJob("gang", ("c/gpu0", "c/gpu1"), 70.0, NOW + 3600, 5, False, started_s=NOW - 60, waited_s=7140.0)
    assert both([stopped], gpus, [two[0], took], waited) == []  # it waited 2 min; "w" waited 10 min, "gang" 2 h


def test_the_replays_wake_when_a_wait_passes_a_running_gang_jobs_by_the_gap():
    """`waited_wake`: the first time past `clock` a waiting gang job's wait (from its `bound_start`)
    reaches a running gang job's wait at its start plus `gang_stops_waited`; always past `clock`,
    whatever the last digit of the sum (a wake at `clock` would never let the replay move on)."""
    import random

    from scheduler.policy.checkpoints import waited_wake

    waited = PolicyConfig(gang_stops_waited=600.0, gang_bound_whole_wait=True)
    assert waited_wake([1000.0], [0.0, 300.0], waited, 1500.0) == 1600.0  # 1000 + 600 + 0
    assert waited_wake([1000.0], [0.0, 300.0], waited, 1600.0) == 1900.0  # then + 300
    assert waited_wake([1000.0, 1200.0], [300.0], waited, 1850.0) == 1900.0  # the soonest of the waiting jobs
    assert waited_wake([1000.0], [0.0], waited, 1600.0) == float("inf")  # passed every running one already
    assert waited_wake([1000.0], [], waited, 0.0) == float("inf")  # no gang job runs
    assert waited_wake([1000.0], [0.0], PolicyConfig(), 0.0) == float("inf")  # off
    rng = random.Random(3)
    for _ in range(20_000):
        since, wait = rng.uniform(0, 1e5), rng.uniform(0, 1e4)
        clock = since + 600.0 + wait - rng.choice((0.0, 1e-12, 1e-11))
        assert waited_wake([since], [wait], waited, clock) > clock


def test_waited_needs_whole_waits_and_a_sane_gap():
    with pytest.raises(ValueError, match="gang_bound_whole_wait"):
        PolicyConfig(gang_stops_waited=3600.0)
    for bad in (0.0, 30.0, float("nan"), float("inf"), 8 * 86400.0):
        with pytest.raises(ValueError, match="gang_stops_waited"):
            PolicyConfig(gang_stops_waited=bad, gang_bound_whole_wait=True)
    with pytest.raises(ValueError, match="gang_stops_waited and gang_stops_longer"):
        PolicyConfig(gang_stops_waited=3600.0, gang_bound_whole_wait=True, gang_stops_longer=2.0)


def test_with_rehome_and_longer_a_stopped_equal_need_not_restart_at_once():
    """A 4-GPU gang spanning nodes a and b: a 2-GPU job of its priority with 10 h left on a, two
    single-GPU jobs on b that restart at once on c's idle 40-GiB GPUs (too small for the gang; without
    c, nowhere)."""
    gpus, running = full_fleet()
    held = [RunningJob("w", ("a/gpu0", "a/gpu1"), 30.0, NOW + 36000, 5, False, started_s=NOW - 300)]
    singles = [r for r in running if r.id.startswith("b")]
    room = [GpuState(f"c/gpu{i}", "c", "A100", 40.0) for i in range(2)]
    wide = JobRequest("gang", 5, NOW - 2 * 3600, 4, 70.0, 3600.0)
    rehome = dataclasses.replace(BOUNDED, span_nodes=True, gang_stops_rehome=True, gang_stops_longer=4.0)
    gpus = [dataclasses.replace(g, jobs=1, allocated_gib=30.0, exclusive=g.node == "a") for g in gpus]
    (placement,) = both([wide], gpus + room, held + singles, rehome)
    assert set(placement.evicts) == {"w", "b0", "b1"} and set(placement.gpus) == {g.uuid for g in gpus}
    assert both([wide], gpus, held + singles, rehome) == []  # b's single-GPU jobs could not restart at once


def test_an_overdue_gang_job_stops_first_where_its_victims_restart_at_once_then_the_fewest():
    """Node a: two single-GPU jobs (300 s to lose each); node b: one 2-GPU fine-tune (500 s a GPU); node c
    runs a job of the gang's priority on one GPU and a single-GPU job on the other, so it is never
    taken, but each of its GPUs has room for one more 30-GiB job."""

    def gpu(uuid: str, jobs: int = 1, exclusive: bool = False) -> GpuState:
        return GpuState(uuid, uuid.split("/")[0], "H100", 80.0, allocated_gib=30.0, jobs=jobs, exclusive=exclusive, shares=1.0)

    gpus = [gpu("a/gpu0"), gpu("a/gpu1"), gpu("b/gpu0", exclusive=True), gpu("b/gpu1", exclusive=True)]
    running = [
        RunningJob("a0", ("a/gpu0",), 30.0, NOW + 36000, 3, True, started_s=NOW - 300),
        RunningJob("a1", ("a/gpu1",), 30.0, NOW + 36000, 3, True, started_s=NOW - 300),
        RunningJob("w", ("b/gpu0", "b/gpu1"), 30.0, NOW + 36000, 4, False, started_s=NOW - 500),
    ]
    room = [gpu("c/gpu0"), gpu("c/gpu1")]
    beside = [
        RunningJob("c0", ("c/gpu0",), 30.0, NOW + 36000, 5, True, started_s=NOW - 10),
        RunningJob("c1", ("c/gpu1",), 30.0, NOW + 36000, 3, True, started_s=NOW - 10),
    ]
    (placement,) = both([gang()], gpus + room, running + beside)
    assert placement.evicts == ("a0", "a1")  # both restart at once beside c's jobs; the fine-tune could not
    (placement,) = both([gang()], gpus, running)
    assert placement.evicts == ("w",)  # nowhere to restart either way: one job stopped, not two (though it loses more)
    rehome = dataclasses.replace(BOUNDED, gang_stops_rehome=True)
    (placement,) = both([gang()], gpus + room, running + beside, rehome)
    assert placement.evicts == ("a0", "a1")  # they restart at once: stopped as before
    assert both([gang()], gpus, running, rehome) == []  # nowhere to restart: it waits on rather than stop them


def test_with_rehome_a_gang_spanning_nodes_stops_only_jobs_that_all_restart_at_once():
    """A 4-GPU gang on an engine that spans nodes, over nodes a and b (two GPUs each, a 30-GiB
    single-GPU job on each GPU); node c's two GPUs run 10-GiB jobs of the gang's priority."""
    gpus, running = full_fleet()
    room = [GpuState(f"c/gpu{i}", "c", "H100", 80.0, allocated_gib=10.0, jobs=1, shares=1.0) for i in range(2)]
    beside = [RunningJob(f"c{i}", (f"c/gpu{i}",), 10.0, NOW + 36000, 5, True, started_s=NOW - 10) for i in range(2)]
    wide = JobRequest("gang", 5, NOW - 2 * 3600, 4, 70.0, 3600.0)
    spans = dataclasses.replace(BOUNDED, span_nodes=True)
    rehome = dataclasses.replace(spans, gang_stops_rehome=True)
    (placement,) = both([wide], gpus + room, running + beside, rehome)
    assert placement.evicts == ("a0", "a1", "b0", "b1")  # two 30-GiB jobs beside each 10-GiB one on c
    assert both([wide], gpus + room[:1], running + beside[:1], rehome) == []  # room for two of the four only
    (placement,) = both([wide], gpus + room[:1], running + beside[:1], spans)
    assert placement.evicts == ("a0", "a1", "b0", "b1")  # without rehome: stopped all the same


def test_of_equal_nodes_it_stops_the_jobs_with_least_work_left():
    gpus, running = full_fleet()  # node a's jobs lose 300 s each, node b's 50 s
    ending = [dataclasses.replace(r, expected_end_s=NOW + (600 if r.id.startswith("a") else 36000)) for r in running]
    (placement,) = both([gang()], gpus, ending)
    assert placement.evicts == ("a0", "a1")  # 10 min left each against 10 h: the week's end is not pushed back


def test_short_single_gpu_jobs_rank_higher_by_the_bonus_and_aging_still_counts():
    short = JobRequest("short", 3, NOW, 1, 50.0, 1800.0)  # two of 50 GiB never share an 80-GiB GPU
    long = JobRequest("long", 3, NOW - 3 * 3600, 1, 50.0, 86400.0)
    first = PolicyConfig(short_job_bonus=6.0)
    assert effective_priority(short, NOW, first) == 9.0 and effective_priority(long, NOW, first) == 6.0
    assert effective_priority(short, NOW, PolicyConfig()) == 3.0  # off by default
    wide = dataclasses.replace(short, gpus=2)
    assert effective_priority(wide, NOW, first) == 3.0  # single-GPU jobs only
    gpus = [GpuState("x/gpu0", "x", "H100", 80.0)]
    assert [p.job_id for p in both([long, short], gpus, [], first)] == ["short"]
    assert [p.job_id for p in both([long, short], gpus, [], PolicyConfig())] == ["long"]


def test_the_bound_is_checked_at_load():
    for bad in (-1.0, float("inf"), float("nan"), 30 * 86400.0):
        with pytest.raises(ValueError, match="gang_max_wait_s"):
            PolicyConfig(gang_max_wait_s=bad)
    for bad in (-1.0, float("nan"), 1000.0):
        with pytest.raises(ValueError, match="short_job_bonus"):
            PolicyConfig(short_job_bonus=bad)
    with pytest.raises(ValueError, match="short_job_s"):
        PolicyConfig(short_job_s=float("inf"))
    for bad in (0.5, float("inf"), float("nan"), 5000.0):
        with pytest.raises(ValueError, match="gang_stops_longer"):
            PolicyConfig(gang_stops_longer=bad)
    for bad in (-0.1, float("inf"), float("nan"), 10.5):
        with pytest.raises(ValueError, match="gang_bound_backlog"):
            PolicyConfig(gang_bound_backlog=bad)


def test_with_the_backlog_the_bound_rises_to_k_times_the_waiting_work_over_the_fleet():
    """~0.01 s. `gang_bound_backlog` k: the bound is max(gang_max_wait_s, k x backlog), at most a week;
    the backlog is the waiting jobs' GPU-seconds over the fleet's GPUs, the same sum in any order."""
    from scheduler.policy.checkpoints import MAX_GANG_WAIT_S, backlog_s, gang_bound, work_of

    rising = dataclasses.replace(BOUNDED, gang_bound_backlog=0.5)
    assert gang_bound(BOUNDED, 50_000.0) == 3600.0  # off: the bound as set, whatever waits
    assert gang_bound(rising, 5_000.0) == 3600.0 and gang_bound(rising, 10_000.0) == 5000.0
    assert gang_bound(rising, 1e9) == MAX_GANG_WAIT_S and gang_bound(PolicyConfig(gang_bound_backlog=1.0), 1e6) is None
    jobs = [JobRequest(f"j{n}", 3, 0.0, gpus, 30.0, run) for n, (gpus, run) in enumerate([(1, 0.1), (8, 3600.3), (2, 1e5 / 3)])]
    assert sum(map(work_of, jobs)) == sum(map(work_of, reversed(jobs))) == 100 + 28_802_400 + 66_666_667
    assert backlog_s(sum(map(work_of, jobs)), 4) == pytest.approx((0.1 + 8 * 3600.3 + 2e5 / 3) / 4, abs=1e-3)
    assert backlog_s(5, 0) == 0.0
    # a run read from the queue is bounded: huge or infinite counts as a year, not a number as nothing
    year = 2 * 365 * 86400 * 1000
    for run, work in ((1e308, year), (float("inf"), year), (float("nan"), 0), (-5.0, 0)):
        assert work_of(JobRequest("x", 3, 0.0, 2, 30.0, run)) == work, run
    planner = Planner([GpuState("x/gpu0", "x", "H100", 80.0)], dataclasses.replace(BOUNDED, gang_bound_backlog=1.0))
    planner.submit(JobRequest("huge", 3, 0.0, 1, 30.0, 1e308))
    assert planner.backlog() == 365 * 86400 and planner.next_overdue(0.0) == float("inf")  # no gang job waits
    # a gang job waiting 2 h (`gang`) beside a queue of 40,000 GPU-s on the four GPUs: backlog
    # (40,000 + 2 x 3,600) / 4 = 11,800 s; with k = 1 that is its bound, and it is not overdue yet.
    # Beside half that queue the bound is 6,800 s, and at 7,200 s it is
    gpus, running = full_fleet()
    queue = [JobRequest(f"w{n}", 3, NOW - 60, 1, 80.0, 10_000.0) for n in range(4)]
    whole = dataclasses.replace(BOUNDED, gang_bound_backlog=1.0)
    assert [p.job_id for p in both([gang(), *queue], gpus, running)] == ["gang"]  # the bound as set: 1 h
    assert both([gang(), *queue], gpus, running, whole) == []
    assert [p.job_id for p in both([gang(), *queue[:2]], gpus, running, whole)] == ["gang"]
    assert both([gang(submit=NOW - 6799), *queue[:2]], gpus, running, whole) == []


def test_a_job_declares_whether_it_may_be_stopped_and_how_often_it_checkpoints():
    spec = JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, preemptible=False, checkpoint_every_s=900)
    labels = json.dumps(spec.stored_labels())
    request = job_request(("j", 3, 0.0, 1, 10.0, 60.0, labels))
    assert not request.preemptible and request.checkpoint_every_s == 900.0
    row = SimpleNamespace(
        id="j", assigned='["a/gpu0"]', mem_gib=10.0, start_s=50.0, duration_s=60.0, priority=3, labels=labels, submit_s=20.0
    )
    running = running_job(row)
    assert not running.preemptible and running.checkpoint_every_s == 900.0 and running.started_s == 50.0
    assert running.waited_s == 30.0  # submitted at 20 s, started at 50 s, never requeued
    # requeued at 30 s after waiting 8 s, started again at 50 s: 28 s in all; a label that claims more
    # than the time since its submit buys no more (the store is untrusted)
    for claimed, whole in (("8", 28.0), ("1e9", 30.0), ("nan", 20.0)):
        requeued = json.loads(labels) | {"requeued_s": "30", "waited_s": claimed}
        assert running_job(SimpleNamespace(**{**vars(row), "labels": json.dumps(requeued)})).waited_s == whole, claimed
    plain = job_request(
        (
            "k",
            3,
            0.0,
            1,
            10.0,
            60.0,
            json.dumps(JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60).stored_labels()),
        )
    )
    assert plain.preemptible and plain.checkpoint_every_s == 600.0  # by default: preemptible, every 10 min
    exclusive = json.dumps(JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, exclusive=True).stored_labels())
    assert not job_request(("x", 3, 0.0, 1, 10.0, 60.0, exclusive)).preemptible  # an exclusive job never is
    for bad in (0, -5, float("inf"), 10**9):
        with pytest.raises(QueueError, match="checkpoint_every_s"):
            JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, checkpoint_every_s=bad)


def test_a_job_that_may_not_be_stopped_is_not_moved_either():
    """Preemption to defragment (a job restarts at once on an idle GPU elsewhere) stops a job too."""
    gpus = [GpuState(f"{node}/gpu{i}", node, "H100", 80.0) for node in ("a", "b") for i in range(2)]
    running = [RunningJob(uuid, (uuid,), 30.0, NOW + 36000, 3, True, started_s=NOW - 300) for uuid in ("a/gpu0", "b/gpu0")]
    for gpu in (gpus[0], gpus[2]):  # one job on each node; a/gpu1 and b/gpu1 idle
        gpu.jobs, gpu.allocated_gib, gpu.shares = 1, 30.0, 1.0
    moving = PolicyConfig(preempt_after_s=1200.0)
    (placement,) = both([gang()], gpus, running, moving)
    assert len(placement.evicts) == 1 and set(placement.gpus) >= set(placement.evicts)  # moved to the other node
    pinned = [dataclasses.replace(job, preemptible=False) for job in running]
    assert both([gang()], gpus, pinned, moving) == []


def test_the_queue_config_sets_short_jobs_first_and_the_stop_cap():
    """~0.01 s. `queue.short_job_bonus`, `short_job_seconds`, `gang_max_preemptions` and the gang
    options (`rescue_gangs` among them) reach the policy; out of bounds they fail at load, naming the field."""
    from pydantic import ValidationError

    from drape.config.ops import QueueConfig
    from scheduler.dispatch.fleet import policy_config

    queue = QueueConfig(
        gang_max_wait_seconds=10800,
        short_job_bonus=6,
        short_job_seconds=1800,
        gang_max_preemptions=10,
        gang_stops_rehome=True,
        gang_stops_longer=4,
        gang_bound_whole_wait=True,
        gang_bound_backlog=0.5,
        rescue_gangs=True,
    )
    policy = policy_config(SimpleNamespace(queue=queue))
    waited = QueueConfig(gang_stops_waited_seconds=7200, gang_bound_whole_wait=True)
    assert policy_config(SimpleNamespace(queue=waited)).gang_stops_waited == 7200.0 and policy.gang_stops_waited is None
    assert policy.rescue_gangs and not policy_config(SimpleNamespace(queue=QueueConfig())).rescue_gangs
    assert policy.gang_bound_backlog == 0.5 and policy_config(SimpleNamespace(queue=QueueConfig())).gang_bound_backlog == 0
    assert policy.gang_bound_whole_wait and not policy_config(SimpleNamespace(queue=QueueConfig())).gang_bound_whole_wait
    assert policy.gang_stops_longer == 4.0 and policy_config(SimpleNamespace(queue=QueueConfig())).gang_stops_longer is None
    assert (policy.short_job_bonus, policy.short_job_s, policy.gang_max_preemptions) == (6.0, 1800.0, 10)
    assert policy.gang_stops_rehome and not policy_config(SimpleNamespace(queue=QueueConfig())).gang_stops_rehome
    assert (policy_config(SimpleNamespace(queue=QueueConfig())).short_job_bonus, PolicyConfig().short_job_bonus) == (0.0, 0.0)
    short = JobRequest("short", 3, NOW, 1, 50.0, 1800.0)
    assert effective_priority(short, NOW, policy) == 9.0
    for field, bad in (("short_job_bonus", -1), ("short_job_bonus", 101), ("short_job_bonus", float("nan"))):
        with pytest.raises(ValidationError, match=field):
            QueueConfig(**{field: bad})
    for field, bad in (
        ("short_job_seconds", -1),
        ("short_job_seconds", 8 * 86400.0),
        ("gang_max_preemptions", 101),
        ("gang_stops_longer", 0.5),
        ("gang_stops_longer", -1),
        ("gang_stops_longer", float("inf")),
        ("gang_bound_backlog", -0.1),
        ("gang_bound_backlog", 11),
        ("gang_bound_backlog", float("nan")),
        ("gang_stops_waited_seconds", 30),
        ("gang_stops_waited_seconds", -1),
        ("gang_stops_waited_seconds", 8 * 86400.0),
    ):
        with pytest.raises(ValidationError, match=field):
            QueueConfig(**{field: bad, "gang_bound_whole_wait": True})
    with pytest.raises(ValidationError, match="gang_stops_waited_seconds.*gang_bound_whole_wait"):
        QueueConfig(gang_stops_waited_seconds=3600)  # whole waits are what it compares
    with pytest.raises(ValidationError, match="gang_stops_waited_seconds and queue.gang_stops_longer"):
        QueueConfig(gang_stops_waited_seconds=3600, gang_bound_whole_wait=True, gang_stops_longer=2)


def test_a_stopped_job_ages_from_its_requeue_and_a_stopped_gang_waits_its_bound_again():
    """~0.01 s. A day-long service submitted two days ago and stopped 10 min ago ranks by those 10
    min, not by two days: a job that never started, waiting an hour, goes first. Its submit still
    orders equals and counts the wait; a stopped multi-GPU job may stop others only once it has
    waited the bound again since its requeue."""
    from scheduler.policy import queued_at

    stopped = JobRequest("svc", 3, NOW - 2 * 86400, 1, 50.0, 86400.0, preempted=1, queued_s=NOW - 600)
    fresh = JobRequest("eval", 3, NOW - 3600, 1, 50.0, 86400.0)
    assert queued_at(stopped) == NOW - 600 and queued_at(fresh) == NOW - 3600
    assert effective_priority(stopped, NOW, PolicyConfig()) == pytest.approx(3 + 600 / 3600)
    gpus = [GpuState("x/gpu0", "x", "H100", 80.0)]
    assert [p.job_id for p in both([stopped, fresh], gpus, [])] == ["eval"]
    never = dataclasses.replace(stopped, queued_s=None)  # as before: its two days of aging rank it first
    assert [p.job_id for p in both([never, fresh], gpus, [])] == ["svc"]
    gpus, running = full_fleet()
    assert both([gang(queued_s=NOW - 600)], gpus, running) == []  # requeued 10 min ago: not overdue again yet
    assert [p.job_id for p in both([gang(queued_s=NOW - 3600)], gpus, running)] == ["gang"]
    # the bound on the whole wait: 50 min before its last start and 10 min since its requeue are its hour
    whole, waited = (
        dataclasses.replace(BOUNDED, gang_bound_whole_wait=True),
        dataclasses.replace(gang(queued_s=NOW - 600), waited_s=3000.0),
    )
    assert both([waited], gpus, running) == []  # counted from the requeue, as before
    assert [p.job_id for p in both([waited], gpus, running, whole)] == ["gang"]
    assert both([dataclasses.replace(waited, waited_s=2999.0)], gpus, running, whole) == []
    # never before its submit: a stored label of days cannot make a job submitted 20 min ago overdue
    recent = JobRequest("gang", 5, NOW - 1200, 2, 70.0, 3600.0, queued_s=NOW - 600, waited_s=86400.0)
    assert both([recent], gpus, running, whole) == []


def test_with_gang_aging_whole_wait_a_stopped_gang_job_ranks_by_all_it_has_waited():
    """~0.01 s. `gang_aging_whole_wait`: a 2-GPU job that waited 3 h before it was stopped 10 min ago
    ranks by those 3 h 10 min, before a 2-GPU job that has waited 1 h; a stopped single-GPU job still
    ages from its requeue; and a stored wait longer than the job has existed buys it nothing."""
    from drape.config.ops import QueueConfig
    from scheduler.dispatch.fleet import policy_config
    from scheduler.policy import static_priority

    aged = PolicyConfig(preempt_after_s=None, gang_aging_whole_wait=True)
    stopped = JobRequest("stopped", 3, NOW - 5 * 3600, 2, 70.0, 3600.0, preempted=1, queued_s=NOW - 600, waited_s=3 * 3600.0)
    fresh = JobRequest("fresh", 3, NOW - 3600, 2, 70.0, 3600.0)
    assert effective_priority(stopped, NOW, aged) == pytest.approx(3 + (3 * 3600 + 600) / 3600)
    assert effective_priority(stopped, NOW, PolicyConfig()) == pytest.approx(3 + 600 / 3600)  # off: from the requeue
    gpus = [GpuState("x/gpu0", "x", "H100", 80.0), GpuState("x/gpu1", "x", "H100", 80.0)]
    assert [p.job_id for p in both([stopped, fresh], gpus, [], aged)] == ["stopped"]
    assert [p.job_id for p in both([stopped, fresh], gpus, [], PolicyConfig(preempt_after_s=None))] == ["fresh"]
    # the order is kept, not re-sorted: the static key orders as the effective priority does at any later clock
    for later in (NOW, NOW + 86400):
        by_effective = sorted((stopped, fresh), key=lambda j: -effective_priority(j, later, aged))
        assert by_effective == sorted((stopped, fresh), key=lambda j: -static_priority(j, aged))
    single = dataclasses.replace(stopped, gpus=1, mem_gib=30.0)
    assert effective_priority(single, NOW, aged) == pytest.approx(3 + 600 / 3600)  # single-GPU jobs: as before
    liar = dataclasses.replace(stopped, submit_s=NOW - 1200, waited_s=86400.0)  # no more than since its submit
    assert effective_priority(liar, NOW, aged) == pytest.approx(3 + 1200 / 3600)
    assert QueueConfig(gang_aging_whole_wait=True).gang_aging_whole_wait
    assert policy_config(SimpleNamespace(queue=QueueConfig(gang_aging_whole_wait=True))).gang_aging_whole_wait


def test_the_requeue_time_is_read_from_the_labels_and_a_bad_one_is_ignored():
    """~0.01 s. The store's preemption writes `requeued_s` into a job's labels (`scheduler/queue/leases.py`)."""
    row = ("j", 3, NOW - 86400, 1, 20.0, 600.0, json.dumps({"preempted": "1", "requeued_s": f"{NOW:.3f}"}))
    assert job_request(row).queued_s == NOW
    for bad in ("soon", "nan", "inf", "-5", None):
        labels = json.dumps({"preempted": "1", "requeued_s": bad})
        assert job_request((*row[:6], labels)).queued_s is None, bad
        assert job_request((*row[:6], json.dumps({"preempted": "1", "waited_s": bad}))).waited_s == 0.0, bad
    assert job_request((*row[:6], json.dumps({"preempted": "1", "waited_s": "1800.5"}))).waited_s == 1800.5


def test_a_preempted_job_keeps_what_it_waited_before_its_start_in_its_labels(tmp_path):
    """~0.1 s. The store's preemption adds the wait that ended at the job's start (from its submit,
    or its last requeue) to `waited_s`, which the gang bound counts with `gang_bound_whole_wait`."""
    from scheduler.policy import Placement
    from scheduler.queue.schema import JobSpec
    from scheduler.queue.store import JobStore

    store = JobStore(f"sqlite:///{tmp_path}/queue.db")
    store.register_gpus([GpuState("n/gpu0", "n", "H100", 80.0), GpuState("n/gpu1", "n", "H100", 80.0)])
    job = store.submit(JobSpec(kind="stage-training", command=["true"], mem_gib=70, duration_s=3600, gpus=2), now=1000.0)
    for start, stop, waited in ((1600.0, 2000.0, 600.0), (2900.0, 3000.0, 600.0 + 900.0)):
        assert store.claim(Placement(job, ("n/gpu0", "n/gpu1"), 70.0), "d", 60, 4, now=start)
        store.preempt(job, "other", now=stop)
        (request,) = store.pending()
        assert (request.waited_s, request.queued_s) == (waited, stop)

"""Placement policy: best fit by memory, idle-awareness, whole GPUs, aging, EASY backfill, the baseline."""

from scheduler.policy import GpuState, JobRequest, PolicyConfig, RunningJob, plan_drape, plan_fifo_exclusive


def fleet(h100=2, l40s=2, per_node=2):
    gpus = [GpuState(f"h{i // per_node}/gpu{i % per_node}", f"h{i // per_node}", "H100", 80.0) for i in range(h100)]
    gpus += [GpuState(f"l{i // per_node}/gpu{i % per_node}", f"l{i // per_node}", "L40S", 48.0) for i in range(l40s)]
    return gpus


def job(job_id, mem, gpus=1, priority=3, submit=0.0, duration=600.0):
    return JobRequest(job_id, priority, submit, gpus, mem, duration)


def test_small_jobs_go_to_the_smallest_idle_gpu_that_fits():
    placed = {p.job_id: p.gpus for p in plan_drape([job("a", 10), job("b", 60)], fleet(), [], now=0)}
    assert placed["a"][0].startswith("l") and placed["b"][0].startswith("h")


def test_colocation_only_when_no_idle_gpu_fits():
    gpus = fleet(h100=1, l40s=0)
    placed = plan_drape([job("a", 30), job("b", 30), job("c", 30)], gpus, [], now=0)
    assert [p.gpus for p in placed] == [("h0/gpu0",), ("h0/gpu0",)]  # the third would exceed 80 GiB


def test_dcgm_usage_makes_a_gpu_busy_and_shrinks_its_free_memory():
    gpus = fleet(h100=1, l40s=1)
    gpus[1].observed_used_gib, gpus[1].observed_util = 30.0, 90.0  # someone outside the queue uses the L40S
    placed = plan_drape([job("a", 10), job("b", 20)], gpus, [], now=0)
    on = {p.job_id: p.gpus[0] for p in placed}
    assert on["a"] == "h0/gpu0"  # the L40S is not idle: the idle H100 comes first
    assert on["b"] == "h0/gpu0"  # 18 GiB left on the L40S is too little; the H100 takes it
    assert not plan_drape([job("c", 2, gpus=2)], gpus, [], now=0)  # multi-GPU needs two idle GPUs on one node


def test_multi_gpu_jobs_take_whole_idle_gpus_on_one_node():
    gpus = fleet(h100=4, l40s=0, per_node=2)
    gpus[0].jobs, gpus[0].allocated_gib = 1, 10.0
    (placement,) = plan_drape([job("big", 70, gpus=2)], gpus, [], now=0)
    assert placement.gpus == ("h1/gpu0", "h1/gpu1")


def test_aging_lets_an_old_low_priority_job_overtake():
    gpus = fleet(h100=1, l40s=0)
    old, new = job("old", 70, priority=1, submit=0.0), job("new", 70, priority=3, submit=9 * 3600.0)
    now = 9 * 3600.0 + 1
    # slow aging: 1 + 0.9 < 3, priority wins; 1 per hour: 1 + 9 > 3, the old job goes first
    assert plan_drape([old, new], gpus, [], now=now, config=PolicyConfig(aging_per_hour=0.1))[0].job_id == "new"
    assert plan_drape([old, new], gpus, [], now=now, config=PolicyConfig(aging_per_hour=1.0))[0].job_id == "old"


def test_easy_backfill_never_delays_the_head_job():
    gpus = fleet(h100=2, l40s=0, per_node=2)
    gpus[0].jobs, gpus[0].allocated_gib = 1, 70.0
    running = [RunningJob("r", ("h0/gpu0",), 70.0, expected_end_s=1000.0)]
    head = job("head", 70, gpus=2, priority=9)  # needs both GPUs of h0: reserved at t=1000
    long_small = job("long", 20, priority=1, duration=5000.0)
    short_small = job("short", 20, priority=1, duration=500.0)
    placed = {p.job_id for p in plan_drape([head, long_small, short_small], gpus, running, now=0.0)}
    assert placed == {"short"}  # ends before 1000: backfilled; "long" would delay head
    no_backfill = plan_drape([head, short_small], gpus, running, now=0.0, config=PolicyConfig(backfill=False))
    assert no_backfill == []


def test_fifo_exclusive_uses_only_the_biggest_gpus_and_blocks_at_the_head():
    placed = plan_fifo_exclusive([job("a", 10, submit=0), job("b", 10, submit=1), job("c", 10, submit=2)], fleet(), [], now=5)
    assert [p.gpus[0][0] for p in placed] == ["h", "h"]  # two H100s; the L40S stay idle, "c" waits
    blocked = plan_fifo_exclusive([job("x", 10, gpus=4, submit=0), job("y", 10, submit=1)], fleet(), [], now=5)
    assert blocked == []


def test_queue_database_errors_name_the_url_without_its_password(tmp_path):
    import pytest

    from scheduler.store import JobStore, QueueError

    with pytest.raises(QueueError, match=r"postgresql://drape:\*\*\*@db:5432/drape(: its database driver| unreachable)") as error:
        JobStore("postgresql://drape:s3cret@db:5432/drape")
    assert "s3cret" not in str(error.value)
    (tmp_path / "file").write_text("")
    with pytest.raises(QueueError, match="cannot create the folder"):
        JobStore(f"sqlite:///{tmp_path}/file/sub/queue.db")


def test_single_gpu_jobs_fill_the_fullest_node_and_keep_whole_nodes_free():
    gpus = fleet(h100=8, l40s=0, per_node=4)  # two 4-GPU nodes
    gpus[0].jobs, gpus[0].allocated_gib = 1, 20.0  # h0 already holds a job
    placed = plan_drape([job("a", 20, submit=0), job("b", 20, submit=1)], gpus, [], now=5)
    assert {p.gpus[0].split("/")[0] for p in placed} == {"h0"}  # h1 stays whole for a 4-GPU job
    (gang,) = plan_drape([job("gang", 70, gpus=4)], gpus, [], now=5)
    assert {g.split("/")[0] for g in gang.gpus} == {"h1"}
    first_idle = plan_drape([job("a", 20)], gpus, [], now=5, config=PolicyConfig(pack_nodes=False))
    assert first_idle[0].gpus == ("h0/gpu1",)  # by name: the same here; packing is the tie-break among equals
    spread = fleet(h100=8, l40s=0, per_node=4)
    spread[4].jobs, spread[4].allocated_gib = 1, 20.0  # h1 holds the job now
    assert plan_drape([job("a", 20)], spread, [], now=5)[0].gpus[0].startswith("h1")
    assert plan_drape([job("a", 20)], spread, [], now=5, config=PolicyConfig(pack_nodes=False))[0].gpus[0].startswith("h0")


def test_a_job_runs_only_on_the_gpu_models_it_allows():
    from scheduler.policy import plan_kueue_like

    gpus = fleet(h100=2, l40s=2)
    small_on_h100 = JobRequest("x", 3, 0.0, 1, 10.0, 600.0, ("H100",))  # would best-fit an L40S
    (placement,) = plan_drape([small_on_h100], gpus, [], now=0)
    assert placement.gpus[0].startswith("h")
    assert plan_drape([small_on_h100], gpus, [], now=0, config=PolicyConfig(constraints=False))[0].gpus[0].startswith("l")
    only_a100 = JobRequest("y", 3, 0.0, 1, 10.0, 600.0, ("A100",))
    assert plan_drape([only_a100], gpus, [], now=0) == [] and plan_kueue_like([only_a100], gpus, [], now=0) == []
    (kueue,) = plan_kueue_like([small_on_h100], gpus, [], now=0)
    assert kueue.gpus[0].startswith("h")

"""Placement policy: best fit by memory, idle-awareness, whole GPUs, aging, EASY backfill, the baseline."""

import pytest

from scheduler.policy import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, plan_drape
from scheduler.policy.baselines import plan_fifo_exclusive


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

    from scheduler.queue.store import JobStore, QueueError

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
    spread = fleet(h100=8, l40s=0, per_node=4)
    spread[4].jobs, spread[4].allocated_gib = 1, 20.0  # h1 holds the job now
    assert plan_drape([job("a", 20)], spread, [], now=5)[0].gpus[0].startswith("h1")  # the fullest node, not the first by name


def test_a_job_runs_only_on_the_gpu_models_it_allows():
    from scheduler.policy.baselines import plan_kueue_like

    gpus = fleet(h100=2, l40s=2)
    small_on_h100 = JobRequest("x", 3, 0.0, 1, 10.0, 600.0, ("H100",))  # would best-fit an L40S
    (placement,) = plan_drape([small_on_h100], gpus, [], now=0)
    assert placement.gpus[0].startswith("h")
    anywhere = JobRequest("z", 3, 0.0, 1, 10.0, 600.0)
    assert plan_drape([anywhere], gpus, [], now=0)[0].gpus[0].startswith("l")  # what the H100-only job would best-fit
    only_a100 = JobRequest("y", 3, 0.0, 1, 10.0, 600.0, ("A100",))
    assert plan_drape([only_a100], gpus, [], now=0) == [] and plan_kueue_like([only_a100], gpus, [], now=0) == []
    (kueue,) = plan_kueue_like([small_on_h100], gpus, [], now=0)
    assert kueue.gpus[0].startswith("h")


@pytest.mark.parametrize(
    ("part", "model", "named"),
    [
        ("H100", "NVIDIA-H100-80GB-HBM3", True),  # a Kubernetes product label
        ("h100", "NVIDIA H100 80GB HBM3", True),  # nvidia-smi's name, any case
        ("H100-80GB", "NVIDIA-H100-80GB-HBM3", True),
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("A10", "NVIDIA A10G", True),  # AWS's A10 is an A10
        ("V100", "V100M32", True),  # Alibaba's trace names its V100s by memory
        ("A10", "NVIDIA A100-SXM4-80GB", False),  # a substring, but another GPU and price
        ("L4", "NVIDIA L40S", False),
        ("L40", "NVIDIA L40S", True),
        ("00", "H100", False),
    ],
)
def test_a_gpu_model_is_named_by_a_part_of_its_name_that_cuts_no_number(part, model, named):
    from scheduler.policy.state import names_model

    assert names_model(part, model) is named


def test_a_job_pinned_to_a10_never_lands_on_an_a100_whose_name_holds_it():
    """A site with A10s beside A100s: a job naming "A10" waits for an A10 rather than taking an idle
    A100 (the substring match took it: the dearest GPU for the cheapest job), and the baselines agree."""
    from scheduler.policy.baselines import plan_kueue_like

    gpus = [GpuState(f"a/gpu{i}", "a", "NVIDIA A100-SXM4-80GB", 80.0) for i in range(2)]
    gpus += [GpuState("g/gpu0", "g", "NVIDIA A10G", 24.0, jobs=1, allocated_gib=20.0, shares=1.0)]
    pinned = JobRequest("cheap", 3, 0.0, 1, 20.0, 600.0, ("A10",))
    assert plan_drape([pinned], gpus, [], now=0) == [] and plan_kueue_like([pinned], gpus, [], now=0) == []
    gpus[2].jobs, gpus[2].allocated_gib, gpus[2].shares = 0, 0.0, 0.0
    (placement,) = plan_drape([pinned], gpus, [], now=0)
    assert placement.gpus == ("g/gpu0",)


def _occupied(per_node=4, nodes=2):
    """Two H100 nodes of four GPUs, each holding one long single-GPU job on its first GPU."""
    gpus = fleet(h100=per_node * nodes, l40s=0, per_node=per_node)
    running = []
    for node in range(nodes):
        gpu = gpus[node * per_node]
        gpu.jobs, gpu.allocated_gib, gpu.shares = 1, 30.0, 1.0
        running.append(RunningJob(f"svc{node}", (gpu.uuid,), 30.0, 90_000.0, priority=3, shareable=True))
    return gpus, running


def test_a_starving_gang_job_moves_shareable_jobs_off_a_node():
    gpus, running = _occupied()
    gang = job("gang", 70, gpus=4, priority=5, submit=0.0)
    assert plan_drape([gang], gpus, running, now=600.0) == []  # waited 10 min: not starving yet, nothing fits
    (placement,) = plan_drape([gang], gpus, running, now=1300.0)
    assert len(placement.evicts) == 1 and placement.evicts[0] in ("svc0", "svc1")
    node = placement.gpus[0].split("/")[0]
    assert {g.split("/")[0] for g in placement.gpus} == {node} and len(placement.gpus) == 4
    victim_gpu = next(r.gpus[0] for r in running if r.id == placement.evicts[0])
    assert victim_gpu in placement.gpus  # the preempted job's GPU is the one the gang job needed
    assert plan_drape([gang], gpus, running, now=1300.0, config=PolicyConfig(preempt_after_s=None)) == []


def test_preemption_spares_what_it_may_not_touch_and_what_cannot_restart_at_once():
    gpus, running = _occupied()
    gang = job("gang", 70, gpus=4, priority=5, submit=0.0)
    alone = [RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, r.priority, shareable=False) for r in running]
    assert plan_drape([gang], gpus, alone, now=5000.0) == []  # exclusive jobs are never preempted
    higher = [RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, 5, True) for r in running]
    assert plan_drape([gang], gpus, higher, now=5000.0) == []  # nor jobs of its own priority or higher
    tired = [RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, 3, True, preempted=2) for r in running]
    assert plan_drape([gang], gpus, tired, now=5000.0) == []  # nor jobs preempted max_preemptions times
    for gpu in gpus:  # every other GPU busy with jobs the policy does not know: the victims could not restart
        if not gpu.jobs:
            gpu.observed_used_gib = 60.0
    assert plan_drape([gang], gpus, running, now=5000.0) == []
    h100_only = [RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, 3, True, models=("H100",)) for r in running]
    gpus, _ = _occupied(nodes=1)  # one node: the victim could restart only on the idle L40S GPUs elsewhere
    with_l40s = gpus + fleet(h100=0, l40s=2)
    running, h100_only = running[:1], h100_only[:1]
    assert plan_drape([gang], with_l40s, h100_only, now=5000.0) == []
    (placement,) = plan_drape([gang], with_l40s, running, now=5000.0)  # one that may run anywhere moves there
    assert placement.evicts == ("svc0",)


def test_declared_shares_colocate_before_idle_gpus_and_exclusive_jobs_run_alone():
    gpus = fleet(h100=2, l40s=0, per_node=2)
    half = [JobRequest(f"s{i}", 3, float(i), 1, 20.0, 600.0, share=0.5) for i in range(2)]
    placed = plan_drape(half, gpus, [], now=10)
    assert placed[0].gpus == placed[1].gpus  # two halves fill one GPU; the other stays idle and whole
    full = [JobRequest(f"f{i}", 3, float(i), 1, 20.0, 600.0) for i in range(2)]
    assert len({p.gpus for p in plan_drape(full, gpus, [], now=10)}) == 2  # undeclared: an idle GPU each
    alone = JobRequest("x", 3, -1.0, 1, 20.0, 600.0, exclusive=True)  # first in line
    (solo,) = plan_drape([alone, *half], fleet(h100=1, l40s=0), [], now=10)
    assert solo.job_id == "x"  # nothing joins it, declared share or not
    busy = fleet(h100=1, l40s=0)
    busy[0].jobs, busy[0].allocated_gib, busy[0].shares = 1, 10.0, 0.5
    assert plan_drape([alone], busy, [], now=10) == []  # and it never joins anyone


def test_scheduling_fields_travel_with_the_job_and_bad_ones_are_refused(tmp_path):
    import json

    import pytest

    from scheduler.queue.schema import JobSpec, QueueError, scheduling_of
    from scheduler.queue.store import JobStore

    store = JobStore(f"sqlite:///{tmp_path}/queue.db")
    half = store.submit(JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, share=0.5, gpu_models=["H100"]))
    alone = store.submit(JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, exclusive=True))
    plain = store.submit(JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, labels={"run": "r1"}))
    pending = {j.id: j for j in store.pending()}
    assert (pending[half].share, pending[half].exclusive, pending[half].models) == (0.5, False, ("H100",))
    assert (pending[alone].share, pending[alone].exclusive) == (1.0, True)
    assert (pending[plain].share, pending[plain].exclusive, pending[plain].preempted) == (1.0, False, 0)
    assert json.loads(store.get(plain)["labels"]) == {"run": "r1"}  # nothing added for the defaults
    for bad in ({"share": 0}, {"share": 1.5}, {"exclusive": True, "share": 0.5}):
        with pytest.raises(QueueError, match="share"):
            JobSpec(kind="gate-eval", command=["true"], mem_gib=10, duration_s=60, **bad)
    odd = scheduling_of(json.dumps({"share": "lots", "preempted": "x", "exclusive": "yes"}))  # labels are input
    assert (odd.share, odd.preempted, odd.exclusive) == (1.0, 0, False)


def test_idle_gpus_take_back_jobs_crowded_onto_one_gpu_once_nothing_waits_for_them():
    gpus = fleet(h100=2, l40s=0, per_node=2)
    gpus[0].jobs, gpus[0].allocated_gib, gpus[0].shares = 2, 60.0, 2.0  # two jobs share h0/gpu0 at half pace each
    running = [
        RunningJob("long", ("h0/gpu0",), 30.0, expected_end_s=10_000.0, priority=3, shareable=True),
        RunningJob("short", ("h0/gpu0",), 30.0, expected_end_s=2_000.0, priority=3, shareable=True),
    ]
    (move,) = plan_drape([], gpus, running, now=0.0)
    assert move == Placement("long", ("h0/gpu1",), 30.0, ("long",))  # the one with an hour or more left moves
    assert plan_drape([], gpus, running, now=0.0, config=PolicyConfig(spread_after_s=None)) == []
    gang = job("gang", 70, gpus=2, priority=5, submit=0.0)
    assert all(p.job_id != "long" for p in plan_drape([gang], gpus, running, now=0.0))  # a waiting gang job keeps the idle GPU
    declared = [RunningJob(r.id, r.gpus, r.mem_gib, r.expected_end_s, 3, True, share=0.5) for r in running]
    gpus[0].shares = 1.0
    assert plan_drape([], gpus, declared, now=0.0) == []  # shares that fit one GPU are not crowded


def test_a_claim_never_puts_a_job_beside_one_that_runs_alone_whatever_was_planned(tmp_path):
    """Two dispatchers plan from what they read; the claim re-reads the ledger. A plan made before a
    rival's gang claim must not put a small job on the gang's GPUs, though its memory would fit."""
    from scheduler.queue.schema import JobSpec
    from scheduler.queue.store import JobStore

    store = JobStore(f"sqlite:///{tmp_path}/queue.db")
    store.register_gpus([GpuState(f"n/gpu{i}", "n", "H100", 80.0) for i in range(4)])

    def submit(**fields):
        return store.submit(JobSpec(kind="gate-eval", command=["true"], duration_s=60, **{"mem_gib": 5.0, **fields}))

    gang, small, alone, plain = submit(gpus=2, mem_gib=70.0), submit(), submit(exclusive=True), submit()
    claim = lambda job_id, *gpus: store.claim(Placement(job_id, gpus, 70.0 if job_id == gang else 5.0), "d", 60, 4)  # noqa: E731
    assert claim(gang, "n/gpu0", "n/gpu1")
    assert not claim(small, "n/gpu0")  # 75 of 80 GiB would fit; the gang runs alone
    assert claim(plain, "n/gpu2") and not claim(alone, "n/gpu2")  # an exclusive job joins nobody
    assert claim(alone, "n/gpu3") and not claim(small, "n/gpu3")  # and nobody joins it
    assert claim(small, "n/gpu2")


def _churn(pool, rng, placed: list, choice, job: JobRequest, leave_below: float) -> list:
    """One random step of a pass: `job` takes `choice` (6 in 10), a placed job leaves (up to
    `leave_below`), or a GPU is emptied (its jobs preempted); the placed jobs after it."""
    roll = rng.random()
    if roll < 0.6 and choice:
        pool.take(choice, job)
        placed.append((choice[0], job))
    elif roll < leave_below and placed:
        uuid, done = placed.pop(rng.randrange(len(placed)))
        pool.leave(uuid, done)
    elif placed:
        emptied = placed[rng.randrange(len(placed))][0]
        pool.empty((emptied,))
        placed = [(uuid, done) for uuid, done in placed if uuid != emptied]
    return placed


@pytest.mark.parametrize("fragmentation", [False, True])
def test_the_node_index_picks_what_a_scan_of_every_idle_gpu_picks(fragmentation):
    """`Pool.idle_by_count` (kept in step as GPUs are taken, left and emptied) gives the same GPU as
    scanning every idle GPU of the smallest fitting size for the cheapest node: the fullest (fewest
    idle GPUs), or with the workload's widths the one whose fragmentation grows least, then the fullest."""
    import random
    from collections import Counter

    from scheduler.policy.fragmentation import Widths
    from scheduler.policy.pool import Pool

    rng = random.Random(3)
    gpus = [
        GpuState(f"{kind}{node:02d}/gpu{i}", f"{kind}{node:02d}", model, total)
        for kind, model, total, nodes in (("h", "H100-80GB", 80.0, 6), ("l", "L40S-48GB", 48.0, 4))
        for node in range(nodes)
        for i in range(8)
    ]
    for gpu in gpus:
        if rng.random() < 0.4:
            gpu.jobs, gpu.allocated_gib = 1, 10.0
    # GPUs wanted by 1-, 2-, 4- and 8-GPU jobs: a node with 2 idle GPUs is kept for a 2-GPU job
    widths = {size: Widths.of(Counter({1: 50, 2: 60, 4: 20, 8: 24}), 8) for size in (80.0, 48.0)} if fragmentation else {}
    pool = Pool({g.uuid: g for g in gpus}, PolicyConfig(), widths=widths)
    if fragmentation:
        assert pool.order[80.0] == (1, 3, 5, 6, 7, 2, 4, 8)

    def scanned(mem: float) -> str | None:
        sizes = sorted({g.total_gib for g in pool.gpus.values() if g.is_idle(pool.config) and g.total_gib >= mem})
        if not sizes:
            return None
        idle = [g for g in pool.gpus.values() if g.is_idle(pool.config)]
        count = {node: sum(1 for g in idle if g.node == node) for node in {g.node for g in idle}}
        cost = (lambda g: widths[g.total_gib].cost(count[g.node], 1)) if fragmentation else (lambda g: 0)
        return min((cost(g), count[g.node], g.uuid) for g in idle if g.total_gib == sizes[0])[-1]

    placed: list[tuple[str, JobRequest]] = []
    for step in range(300):
        job = JobRequest(f"j{step}", 3, 0.0, 1, rng.choice((10.0, 30.0, 60.0)), 100.0)
        expected, choice = scanned(job.mem_gib), pool.best_fit(job)
        if expected is not None:  # (with no idle GPU it may co-locate: not this index's choice)
            assert choice == (expected,), step
        placed = _churn(pool, rng, placed, choice, job, leave_below=0.85)


def test_fragmentation_keeps_the_idle_gpus_wider_jobs_can_use():
    """A single-GPU job takes a node with 3 idle GPUs before one with 2 when 2-GPU jobs are part of
    the workload (2 left is a pair; 1 left of 2 serves only single-GPU jobs); with widths 1 and 8 only,
    or without `fragmentation` (the default), the fullest node first."""
    from collections import Counter

    from scheduler.policy.fragmentation import Widths, widths_by_size
    from scheduler.policy.pool import Pool

    def nodes(*busy: int) -> list[GpuState]:
        gpus = []
        for n, taken in enumerate(busy):
            gpus += [GpuState(f"n{n}/gpu{i}", f"n{n}", "H100", 80.0, *((20.0, 1) if i < taken else ())) for i in range(8)]
        return gpus

    gpus = nodes(6, 5, 0)  # n0: 2 idle, n1: 3 idle, n2: 8 idle
    waiting = [job("one", 20, priority=9)] + [job(f"pair{i}", 20, gpus=2, priority=1, submit=1.0) for i in range(3)]
    aware = PolicyConfig(fragmentation=True)
    placed = {p.job_id: p.gpus for p in plan_drape(waiting, gpus, [], now=5, config=aware)}
    assert placed["one"][0].startswith("n1/")  # leaves n1 a pair; n0's pair takes a 2-GPU job
    assert {g.split("/")[0] for g in placed["pair0"]} == {"n0"}
    fullest = plan_drape(waiting, gpus, [], now=5)  # the default
    assert fullest[0].job_id == "one" and fullest[0].gpus[0].startswith("n0/")
    stage_jobs = [job("one", 20, priority=9), job("gang", 20, gpus=8, priority=1, duration=9e9)]
    assert plan_drape(stage_jobs, nodes(6, 5, 8), [], now=5, config=aware)[0].gpus[0].startswith("n0/")  # widths 1, 8: fullest

    # a 4-GPU job where 2-GPU jobs dominate: breaking a whole node leaves two pairs; 5 idle would leave one GPU
    many_pairs = widths_by_size([(1, 20.0)] * 50 + [(2, 20.0)] * 100 + [(4, 20.0)] * 10 + [(8, 70.0)], [80.0], 8)
    assert many_pairs[80.0] == Widths.of(Counter({1: 50, 2: 200, 4: 40, 8: 8}), 8)  # each job weighs its GPUs
    quad, eight = job("quad", 20, gpus=4), nodes(3, 0)  # n0: 5 idle, n1: 8 idle
    pool = Pool({g.uuid: GpuState(**vars(g)) for g in eight}, PolicyConfig(), widths=many_pairs)
    assert {g.split("/")[0] for g in pool.best_fit(quad)} == {"n1"}
    tightest = Pool({g.uuid: GpuState(**vars(g)) for g in eight}, PolicyConfig())
    assert {g.split("/")[0] for g in tightest.best_fit(quad)} == {"n0"}  # fewest left over, as before


def test_a_job_shares_the_gpu_with_the_fewest_jobs_then_the_one_that_clears_soonest():
    """With no idle GPU, a job is co-located where it is slowed least and longest: beside one job
    before two, and beside the job expected to end soonest, not the tightest memory fit (a service
    beside another service would run at half pace for days)."""
    gpus = fleet(h100=3, l40s=0, per_node=3)
    for gpu, allocated, count in zip(gpus, (40.0, 20.0, 20.0), (1, 1, 2)):
        gpu.jobs, gpu.allocated_gib, gpu.shares = count, allocated, float(count)
    running = [
        RunningJob("service", ("h0/gpu0",), 40.0, expected_end_s=300_000.0, priority=3, shareable=True),
        RunningJob("eval", ("h0/gpu1",), 20.0, expected_end_s=1_800.0, priority=3, shareable=True),
        RunningJob("a", ("h0/gpu2",), 10.0, expected_end_s=600.0, priority=3, shareable=True),
        RunningJob("b", ("h0/gpu2",), 10.0, expected_end_s=600.0, priority=3, shareable=True),
    ]
    none = PolicyConfig(spread_after_s=None)
    (placed,) = plan_drape([job("new", 30, duration=200_000.0)], gpus, running, now=0.0, config=none)
    assert placed.gpus == ("h0/gpu1",)  # not h0/gpu0 (tightest: 40 GiB free) nor h0/gpu2 (two jobs already)
    both = plan_drape([job("x", 30, submit=0.0), job("y", 30, submit=1.0)], gpus, running, now=0.0, config=none)
    assert [p.gpus for p in both] == [("h0/gpu1",), ("h0/gpu0",)]  # h0/gpu1 now holds two: y joins the one-job GPU
    gpus[1].allocated_gib = 60.0  # the soonest-clear GPU lacks the memory: the next best that fits
    (placed,) = plan_drape([job("new", 30)], gpus, running, now=0.0, config=none)
    assert placed.gpus == ("h0/gpu0",)


def test_crowded_jobs_move_off_a_waiting_gang_jobs_reservation_but_never_onto_it():
    """While a 2-GPU job waits for node h1 (its reservation, when h1's job ends), a long job crowded
    onto h0/gpu0 moves to h0's idle GPU; h1's idle GPU stays free for the gang job."""
    gpus = fleet(h100=4, l40s=0, per_node=2)
    gpus[0].jobs, gpus[0].allocated_gib, gpus[0].shares = 2, 60.0, 2.0
    gpus[2].jobs, gpus[2].allocated_gib, gpus[2].shares, gpus[2].exclusive = 1, 70.0, 1.0, True
    running = [
        RunningJob("long", ("h0/gpu0",), 30.0, expected_end_s=100_000.0, priority=3, shareable=True),
        RunningJob("short", ("h0/gpu0",), 30.0, expected_end_s=2_000.0, priority=3, shareable=True),
        RunningJob("alone", ("h1/gpu0",), 70.0, expected_end_s=5_000.0, priority=3),
    ]
    gang = job("gang", 70, gpus=2, priority=5, submit=0.0, duration=20_000.0)
    assert plan_drape([gang], gpus, running, now=0.0) == [Placement("long", ("h0/gpu1",), 30.0, ("long",))]
    gpus[1].observed_used_gib, gpus[1].observed_util = 20.0, 50.0  # h0/gpu1 is in use outside the queue
    assert plan_drape([gang], gpus, running, now=0.0) == []  # h1/gpu1 is reserved: no move onto it


def test_colocation_weighs_the_tightest_fits_and_never_an_idle_gpu_or_one_without_room():
    """`Pool` co-locates (no idle GPU left) on the GPU a scan of every shared GPU with room picks
    among the `COLOCATION_WINDOW` tightest memory fits: the fewest jobs, then the soonest expected
    end, then the tightest; and the cache of sizes that found no room stays right as jobs come and go."""
    import random

    from scheduler.policy import COLOCATION_WINDOW
    from scheduler.policy.pool import Pool

    rng = random.Random(5)
    gpus = [GpuState(f"n{node:02d}/gpu{i}", f"n{node:02d}", "H100", 80.0) for node in range(24) for i in range(8)]
    ends = {}
    for gpu in gpus:
        gpu.jobs = rng.choice((1, 1, 2, 3))
        gpu.allocated_gib = rng.uniform(5.0, 20.0) * gpu.jobs
        ends[gpu.uuid] = rng.uniform(0.0, 90_000.0)
    pool = Pool({g.uuid: g for g in gpus}, PolicyConfig(), now=0.0, ends=ends)

    def scanned(mem: float) -> str | None:
        room = sorted(
            (g.free_gib(), g.uuid)
            for g in pool.gpus.values()
            if 0 < g.jobs < pool.config.max_jobs_per_gpu and not g.exclusive and g.free_gib() >= mem
        )[:COLOCATION_WINDOW]
        return min(((pool.gpus[u].jobs, pool.ends[u], free, u) for free, u in room), default=(None,))[-1]

    placed: list[tuple[str, JobRequest]] = []
    checked = 0
    for step in range(600):
        job_ = JobRequest(f"j{step}", 3, 0.0, 1, rng.choice((10.0, 20.0, 40.0, 70.0)), rng.uniform(60.0, 90_000.0))
        choice = pool.best_fit(job_)
        if not any(g.is_idle(pool.config) for g in pool.gpus.values()):  # (an idle GPU comes first)
            assert choice == ((expected,) if (expected := scanned(job_.mem_gib)) else None), step
            checked += 1
        placed = _churn(pool, rng, placed, choice, job_, leave_below=0.9)
    assert checked > 300


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_job_goes_to_the_node_whose_cache_is_warm_when_it_is_free(gpus):
    from dataclasses import replace

    fleet_of_two = fleet(h100=4, l40s=0, per_node=2)
    plain = job("stage", 70, gpus=gpus)
    (placement,) = plan_drape([plain], fleet_of_two, [], now=0)
    assert placement.gpus[0].startswith("h0/")  # without a preference: the first of equals
    warm = replace(plain, prefer_node="h1")
    (placement,) = plan_drape([warm], fleet(h100=4, l40s=0, per_node=2), [], now=0)
    assert {g.split("/")[0] for g in placement.gpus} == {"h1"}
    busy = fleet(h100=4, l40s=0, per_node=2)
    for gpu in busy[2:]:
        gpu.jobs, gpu.allocated_gib = 1, 75.0  # the warm node is full: the job does not wait for it
    (placement,) = plan_drape([warm], busy, [], now=0)
    assert placement.gpus[0].startswith("h0/")


def test_a_preferred_node_in_the_labels_reaches_the_policy():
    import json

    from scheduler.queue.schema import job_request

    labels = json.dumps({"run": "r", "prefer_node": "node-b-00"})
    assert job_request(("j", 5, 0.0, 2, 10.0, 60.0, labels)).prefer_node == "node-b-00"
    assert job_request(("j", 5, 0.0, 2, 10.0, 60.0, json.dumps({"run": "r"}))).prefer_node == ""

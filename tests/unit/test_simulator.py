"""Trace simulator: contention model, bound, starvation, errors; `drape queue simulate`."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from drape.cli import app
from scheduler.policy import GpuState, JobRequest, PolicyConfig
from scheduler.queue.inventory import load_fleet
from scheduler.sim import TraceError, TraceJob, load_trace, offered_load_bound, simulate
from scheduler.sim.model import shortest_makespan

FLEET = "groups:\n  - {model: H100-80GB, memory_gib: 80, nodes: 1, gpus_per_node: 1}\n"


def test_colocated_jobs_share_the_gpu_by_the_contention_model(tmp_path):
    (tmp_path / "fleet.yaml").write_text(FLEET)
    gpus = load_fleet(tmp_path / "fleet.yaml")
    trace = [TraceJob("a", 0, 100, 10, 1, 3, "gate-eval"), TraceJob("b", 0, 100, 10, 1, 3, "gate-eval")]
    result = simulate(trace, gpus, "drape")
    assert result.makespan_s == pytest.approx(200 / 1.07, rel=1e-6)  # two jobs at 1.07 together, not 2
    assert result.utilization == pytest.approx(1.0) and result.bound == pytest.approx(1.0)
    exclusive = simulate(trace, gpus, "fifo-exclusive")
    assert exclusive.makespan_s == pytest.approx(200) and exclusive.mean_wait_s == pytest.approx(50)
    # sharing shows as run time over duration (the wait does not): 2 / 1.07 each co-located, 1 alone
    assert result.class_stretch["1"] == pytest.approx({"mean": 2 / 1.07, "max": 2 / 1.07})
    assert exclusive.class_stretch["1"] == pytest.approx({"mean": 1.0, "max": 1.0})
    # past a GPU's compute, co-location overlaps work: drape ends sooner than the shortest makespan without it
    assert result.shortest_s == pytest.approx(200) and result.of_shortest == pytest.approx(1.07)
    assert exclusive.of_shortest == pytest.approx(1.0) == exclusive.of_bound


def test_packing_shared_jobs_counts_against_the_bound_not_the_shortest_makespan(tmp_path):
    """~0.01 s. Four jobs declaring half a GPU each, on four GPUs: drape packs them two to a GPU
    (idle GPUs kept whole), whole-GPU FIFO gives each its own. Both end at 1,000 s, as soon as
    possible; drape's busy GPU-time is half the work, so it has 0.5 of the offered-load bound."""
    (tmp_path / "fleet.yaml").write_text("groups:\n  - {model: A10, memory_gib: 24, nodes: 1, gpus_per_node: 4}\n")
    gpus = load_fleet(tmp_path / "fleet.yaml")
    trace = [TraceJob(f"j{i}", 0.0, 1000.0, 8.0, 1, 3, "inference", share=0.5) for i in range(4)]
    drape, whole = simulate(trace, gpus, "drape"), simulate(trace, gpus, "fifo-backfill")
    assert drape.makespan_s == pytest.approx(1000.0) == whole.makespan_s
    assert drape.shortest_s == pytest.approx(1000.0)  # max(the last end, 4 x 0.5 x 1,000 GPU-s over 4 GPUs)
    assert (drape.of_bound, drape.of_shortest) == pytest.approx((0.5, 1.0))
    assert (whole.of_bound, whole.of_shortest) == pytest.approx((1.0, 1.0))
    # declared shares make the work term smaller: on one GPU the four end no sooner than 2,000 s
    one = load_fleet(tmp_path / "fleet.yaml")[:1]
    packed = simulate(trace, one, "drape")
    assert packed.shortest_s == pytest.approx(2000.0) and packed.of_shortest == pytest.approx(2000.0 / packed.makespan_s)


def test_starvation_and_bound_on_a_small_trace(tmp_path):
    (tmp_path / "fleet.yaml").write_text(
        "groups:\n  - {model: H100-80GB, memory_gib: 80, nodes: 1, gpus_per_node: 2}\n"
        "  - {model: L40S-48GB, memory_gib: 48, nodes: 1, gpus_per_node: 2}\n"
    )
    gpus = load_fleet(tmp_path / "fleet.yaml")
    trace = [TraceJob(f"j{i}", i * 10.0, 4000.0, 12.0, 1, 3, "personalization") for i in range(8)]
    fifo, drape = simulate(trace, gpus, "fifo-exclusive"), simulate(trace, gpus, "drape")
    assert fifo.starved > 0 and drape.starved == 0
    assert fifo.placements_by_model == {"H100-80GB": 8} and set(drape.placements_by_model) == {"H100-80GB", "L40S-48GB"}
    assert offered_load_bound(trace, 4) == pytest.approx(8 * 4000 / (4 * max(70 + 4000, 8000)))


def test_the_shortest_makespan_counts_what_a_pool_of_gpu_kinds_must_run_alone():
    """~0.01 s. One T4 beside three A10s: four 1,000-s jobs that may run only on the T4 need 4,000 s
    whatever the A10s do (the fleet's bound alone says 1,000 s); work submitted late counts from
    its submit; a job whose memory only the A10s hold is in their pool, not the T4's."""
    gpus = [GpuState("t/gpu0", "t", "T4", 16.0)] + [GpuState(f"a/gpu{i}", "a", "A10", 24.0) for i in range(3)]
    pinned = [TraceJob(f"t{i}", 0.0, 1000.0, 12.0, 1, 3, "inference", ("T4",)) for i in range(4)]  # one at a time
    assert shortest_makespan(pinned, gpus) == pytest.approx(4000.0)
    result = simulate(pinned, gpus, "drape")
    assert result.makespan_s == pytest.approx(4000.0) and result.of_shortest == pytest.approx(1.0)
    late = [TraceJob(f"l{i}", 5000.0, 1000.0, 20.0, 1, 3, "train") for i in range(6)]  # 20 GiB: A10s only
    assert shortest_makespan(pinned + late, gpus) == pytest.approx(5000.0 + 6 * 1000.0 / 3)
    shared = [replace(j, share=0.25) for j in pinned]  # a quarter of the T4 each: they fit on it together
    assert shortest_makespan(shared, gpus) == pytest.approx(1000.0)


def test_bad_trace_and_impossible_jobs_are_named(tmp_path):
    (tmp_path / "fleet.yaml").write_text(FLEET)
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\nx,0,ten,10,1,3,gate-eval\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: duration_s must be a number, got 'ten'"):
        load_trace(bad)
    with pytest.raises(TraceError, match="missing columns"):
        (tmp_path / "cols.csv").write_text("job_id,submit_s\n")
        load_trace(tmp_path / "cols.csv")
    with pytest.raises(TraceError, match="largest GPU has 80"):
        simulate([TraceJob("huge", 0, 10, 120, 1, 3, "finetune")], load_fleet(tmp_path / "fleet.yaml"))


@pytest.mark.parametrize("policy", ["drape", "fifo-exclusive"])
def test_a_job_the_empty_fleet_could_never_run_is_named_with_why_before_the_replay(policy):
    """The job named is the one that cannot run, with its reason (the dispatcher's refusal: GPUs on
    one node, memory, models), not the first waiting jobs by name; a gang wider than every node is
    refused with the hint that an engine starting gangs across nodes could run it, and runs there."""
    fleet = [GpuState(f"n{n}/gpu{i}", f"n{n}", "H100", 80.0) for n in range(2) for i in range(8)]
    fleet += [GpuState(f"l/gpu{i}", "l", "L40S", 48.0) for i in range(4)]
    service = [TraceJob(f"a-service-{i}", i, 7200, 20, 1, 3, "service") for i in range(3)]
    pinned = TraceJob("z-pinned", 5, 600, 10, 1, 3, "gate-eval", ("B200",))
    with pytest.raises(
        TraceError,
        match=r"^job 'z-pinned' \(1 GPU\(s\) × 10 GiB, models B200\) can never run on this fleet: "
        r"no GPU of the fleet is one of the models it allows \(B200\)$",
    ):
        simulate([*service, pinned], fleet, policy)
    wide = [TraceJob(f"z-wide-{i}", 10 + i, 3600, 70, 16, 5, "stage-training") for i in range(3)]
    with pytest.raises(
        TraceError,
        match=r"^job 'z-wide-0' \(16 GPU\(s\) × 70 GiB\) \(and 2 more like it\) can never run "
        r"on this fleet: no node of the fleet can hold it: .* the largest node 8 GPU\(s\).* It could run as a gang "
        r"across nodes, where the engine starts one \(Slurm: --config with queue.launcher slurm\)$",
    ):
        simulate([*service, *wide], fleet, policy)
    spanned = simulate([*service, *wide], fleet, policy, PolicyConfig(span_nodes=True))
    assert spanned.class_waits["9-16"]["jobs"] == 3
    too_wide = TraceJob("z-wider", 10, 3600, 70, 24, 5, "stage-training")  # 16 H100 and 4 L40S: no 24 of one model
    with pytest.raises(TraceError, match=r"^job 'z-wider' .* the largest node 8 GPU\(s\).* add such nodes$"):
        simulate([*service, too_wide], fleet, policy, PolicyConfig(span_nodes=True))


def test_jobs_a_policy_leaves_waiting_forever_are_named_first_submitted_first():
    from scheduler.sim.model import never_placed

    pending = [
        JobRequest(name, 3, submit, 1, 10.0, 60.0) for name, submit in (("a", 50.0), ("z", 10.0), ("m", 30.0), ("b", 40.0))
    ]
    assert str(never_placed("fifo-exclusive", pending)) == (
        "policy fifo-exclusive can never place 4 waiting job(s) on this fleet, though each fits it empty; "
        "the first submitted: ['z', 'm', 'b']"
    )


def test_cli_simulate_prints_both_policies(tmp_path):
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "t.csv").write_text(
        "job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\na,0,100,10,1,3,gate-eval\nb,5,100,10,1,3,gate-eval\n"
    )
    result = CliRunner().invoke(
        app, ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert "| fifo-exclusive |" in result.output and "| drape |" in result.output and "contention" in result.output
    bad = CliRunner().invoke(
        app,
        ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml"), "--policy", "random"],
    )
    assert bad.exit_code == 2 and "unknown policy" in bad.output
    args = ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml"), "--policy"]
    spaced = CliRunner().invoke(app, [*args, "drape, fifo-exclusive"])  # as a person types a list
    assert spaced.exit_code == 0 and "| fifo-exclusive |" in spaced.output and "| drape |" in spaced.output, spaced.output
    none = CliRunner().invoke(app, [*args, " , "])
    assert none.exit_code == 2 and "unknown policy ' , '" in none.output  # not an empty table and exit 0


def test_waits_per_job_class_and_constraint_violations(tmp_path):
    from scheduler.sim.tables import render

    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind,gpu_models,measured\n"
        "svc,0,5000,20,1,3,service,H100,alone\n"
        "gang,10,100,70,2,5,stage-training,,alone\n"
        "pinned,20,100,10,1,3,gate-eval,H100,shared\n"
    )
    fleet = tmp_path / "f.yaml"
    fleet.write_text(
        "groups:\n  - {model: H100, memory_gib: 80, nodes: 1, gpus_per_node: 2}\n"
        "  - {model: L40S, memory_gib: 48, nodes: 1, gpus_per_node: 1}\n"
    )
    jobs = load_trace(trace)
    assert jobs[2].models == ("H100",) and jobs[2].measured == "shared" and jobs[1].models == ()
    honoured = simulate(jobs, load_fleet(fleet), "drape")
    assert honoured.violations == 0 and set(honoured.class_waits) == {"1", "2-4"}
    assert honoured.class_waits["2-4"]["max_s"] == pytest.approx(4990)  # the service holds an H100 the gang needs
    assert "constraint violations" in render([honoured, replace(honoured, policy="broken", violations=2)])
    # two priorities: each one's delays, the multi-GPU jobs' apart (none at priority 3)
    table = render([honoured], jobs).split("| policy | priority |")[1]
    assert "| drape | 5 | 1 | 83.2 min | 1.4 h | 1.4 h |" in table  # the gang: 4990 s
    three = next(line for line in table.splitlines() if line.startswith("| drape | 3 |"))
    assert three.startswith(f"| drape | 3 | 2 | {honoured.job_delays['pinned'] / 120:.1f} min |") and three.endswith("| - |")
    assert table.index("| drape | 5 |") < table.index("| drape | 3 |")  # highest first
    assert "| priority |" not in render([honoured], [replace(j, priority=3) for j in jobs])  # one priority: no table
    many = [replace(jobs[0], job_id=f"j{p}", priority=p) for p in range(17)]  # past MAX_PRIORITY_ROWS: one line
    assert "17 priorities in the trace: no table per priority (at most 16)" in render([honoured], many)
    bad = tmp_path / "bad.csv"
    bad.write_text(trace.read_text().replace("shared", "sometimes"))
    with pytest.raises(TraceError, match="measured must be alone or shared"):
        load_trace(bad)


def test_a_starving_gang_job_preempts_and_the_work_lost_is_counted(tmp_path):
    from scheduler.policy import PolicyConfig
    from scheduler.policy.state import CHECKPOINT_EVERY_S
    from scheduler.sim import RESTART_S
    from scheduler.sim.tables import render

    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind,sharing,share\n"
        "svc1,0,100,20,1,3,service,shareable,\n"
        "svc2,1,5000,20,1,3,service,,\n"
        "svc3,2,5000,20,1,3,service,exclusive,1\n"
        "gang,200,1000,70,2,5,stage-training,,\n"
    )
    fleet = tmp_path / "f.yaml"
    fleet.write_text("groups:\n  - {model: H100, memory_gib: 80, nodes: 2, gpus_per_node: 2, node_prefix: n}\n")
    jobs = load_trace(trace)
    assert [j.exclusive for j in jobs] == [False, False, True, False]
    result = simulate(jobs, load_fleet(fleet), "drape")  # svc1 ends at 100: one idle GPU per node, the gang fits neither
    assert result.preemptions == 1
    assert result.class_waits["2-4"]["max_s"] == pytest.approx(1200)  # it preempts once it waited preempt_after_s
    lost = (1400 - 1) % CHECKPOINT_EVERY_S + RESTART_S  # svc2's work since its last checkpoint, and a restart
    assert result.lost_gpu_h == pytest.approx(lost / 3600)
    assert result.max_requeue_wait_s == 0  # it moved to the other node's idle GPU at once
    assert "| 1 | 0.1 GPU-h | 0.0 min |" in render([result])
    patient = simulate(jobs, load_fleet(fleet), "drape", PolicyConfig(preempt_after_s=None))
    assert patient.preemptions == 0 and patient.class_waits["2-4"]["max_s"] > 4000  # until svc2 or svc3 ends
    bad = tmp_path / "bad.csv"
    bad.write_text(trace.read_text().replace("exclusive,1", "exclusive,2"))
    with pytest.raises(TraceError, match="share in"):
        load_trace(bad)


def test_a_short_gang_stops_a_long_one_of_its_priority_and_the_delay_counts_the_time_off(tmp_path):
    """One node of two GPUs: a 10-h 2-GPU job from t=0, a 1000-s one of its priority from t=100. With
    `gang_stops_longer` the short one, overdue at 3700 s, stops the long one (its 100 s since the last
    checkpoint and a restart lost); the long one's wait to first start stays 0, its delay (finish −
    submit − duration) counts the time off and the work lost."""
    from scheduler.policy import PolicyConfig
    from scheduler.sim import RESTART_S

    (tmp_path / "f.yaml").write_text("groups:\n  - {model: H100, memory_gib: 80, nodes: 1, gpus_per_node: 2}\n")
    fleet = load_fleet(tmp_path / "f.yaml")
    trace = [TraceJob("long", 0, 36000, 70, 2, 5, "stage"), TraceJob("short", 100, 1000, 70, 2, 5, "stage")]
    bounded = PolicyConfig(preempt_after_s=None, gang_max_wait_s=3600.0)
    result = simulate(trace, fleet, "drape", replace(bounded, gang_stops_longer=4.0))
    assert result.preemptions == 1
    assert result.class_waits["2-4"]["max_s"] == pytest.approx(3600) and result.class_waits["2-4"]["mean_s"] == pytest.approx(
        1800
    )
    long_delay = 1000 + 100 + RESTART_S  # the short job's run, its work since the checkpoint at 3600 s, a restart
    assert result.class_delays["2-4"]["mean_s"] == pytest.approx((3600 + long_delay) / 2)
    assert result.class_delays["2-4"]["max_s"] == pytest.approx(3600)
    assert result.job_delays == {"long": pytest.approx(long_delay), "short": pytest.approx(3600)}  # each job's own
    before = simulate(trace, fleet, "drape", bounded)  # jobs of one priority never stop each other: until the long one ends
    assert before.preemptions == 0 and before.class_waits["2-4"]["max_s"] == pytest.approx(35900)
    assert before.class_delays["2-4"] == before.class_waits["2-4"]  # never stopped: the delay is the wait


def test_with_waited_the_gang_jobs_that_waited_longest_run_taking_turns_within_the_stop_cap(tmp_path):
    """One node of two GPUs, no bound: 10-h 2-GPU jobs of one priority at t=0 ("first", which waited 0)
    and t=100 ("second"), a 1-h one at t=200 ("third"). First-come-first-served, the third waits 20 h.
    With `gang_stops_waited` 1 h, the second, having waited 1 h at 3,700 s, stops the first; the
    third, having waited 2 h at 7,400 s (1 h more than the second had when it started), stops the
    second. Then the two long ones take turns, each stopping the other once its wait passes the
    other's by 1 h, until each was stopped `gang_max_preemptions` (4) times; both replays wake at
    each such time (`checkpoints.waited_wake`) and place every job alike."""
    from scheduler.policy import PolicyConfig

    (tmp_path / "f.yaml").write_text("groups:\n  - {model: H100, memory_gib: 80, nodes: 1, gpus_per_node: 2}\n")
    fleet = load_fleet(tmp_path / "f.yaml")
    trace = [
        TraceJob("first", 0, 36000, 70, 2, 5, "stage"),
        TraceJob("second", 100, 36000, 70, 2, 5, "stage"),
        TraceJob("third", 200, 3600, 70, 2, 5, "stage"),
    ]
    plain = PolicyConfig(preempt_after_s=None, gang_bound_whole_wait=True)
    fcfs = simulate(trace, fleet, "drape", plain)
    assert fcfs.preemptions == 0 and fcfs.class_delays["2-4"]["max_s"] == pytest.approx(36000 + 36000 - 200)
    waited = replace(plain, gang_stops_waited=3600.0)
    record: list = []
    result = simulate(trace, fleet, "drape", waited, record=record)
    stops = [(at, job, evicted) for at, job, _, evicted in record if evicted]
    assert stops[:2] == [(pytest.approx(3700), "second", ("first",)), (pytest.approx(7400), "third", ("second",))]
    assert [at for at, job, _ in stops[2:]] == pytest.approx([14700, 21900, 29100, 36300, 43500, 50700])
    assert result.preemptions == 8 and all(sum(v == (j,) for *_, v in stops) == 4 for j in ("first", "second"))
    assert result.class_delays["2-4"]["max_s"] < fcfs.class_delays["2-4"]["max_s"] / 1.5
    reference: list = []  # the reference loop (`plan_drape` at each event, its own wakes) places every job alike
    simulate(trace, fleet, "drape", waited, reference=True, record=reference)
    assert [r[1:] for r in reference] == [r[1:] for r in record]
    assert [r[0] for r in reference] == pytest.approx([r[0] for r in record])


def test_cli_simulate_takes_the_queue_settings_from_a_config(tmp_path):
    """`--config`: the queue's settings (the engine, gang_max_wait_seconds) are the policy's. On Slurm a
    gang wider than a node spans nodes; without the config it can never be placed (exit 2, named)."""
    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    (tmp_path / "fleet.yaml").write_text(
        "groups:\n  - {model: H100, memory_gib: 80, nodes: 3, gpus_per_node: 8, node_prefix: n}\n"
    )
    rows = [f"s{i},{i},40000,30,1,3,service" for i in range(12)] + ["wide,100,3600,70,16,5,stage-training"]
    (tmp_path / "t.csv").write_text("job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\n" + "\n".join(rows) + "\n")
    slurm = {"launcher": "slurm", "max_jobs_per_gpu": 1, "gang_max_wait_seconds": 1800.0}
    (tmp_path / "slurm.yaml").write_text(yaml.safe_dump({"extends": str(demo), "queue": slurm}))
    (tmp_path / "patient.yaml").write_text(yaml.safe_dump({"extends": str(demo), "queue": {**slurm, "gang_max_wait_seconds": 0}}))
    args = ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml"), "--policy", "drape"]
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 2 and "job 'wide' (16 GPU(s) × 70 GiB) can never run on this fleet" in " ".join(
        plain.output.split()
    )
    bounded = CliRunner().invoke(app, [*args, "--config", str(tmp_path / "slurm.yaml")])
    patient = CliRunner().invoke(app, [*args, "--config", str(tmp_path / "patient.yaml")])
    assert bounded.exit_code == 0 and patient.exit_code == 0, bounded.output + patient.output
    # 12 services on 12 GPUs of 3 nodes (the fullest first: n0, then n1): 12 idle GPUs, no node of 16
    assert "| 9-16 GPUs |" in bounded.output
    waits = [
        line.split("|")[5]
        for out in (bounded.output, patient.output)
        for line in out.splitlines()
        if line.startswith("| drape | ") and "jobs)" in line  # the waits per class, one line each
    ]
    bounded_wait, patient_wait = waits
    assert "30.0 / 30.0 / 30.0 min (1 jobs)" in bounded_wait  # it stopped services once it waited 1800 s
    assert "| 0 | 4 | 0.2 GPU-h |" in bounded.output  # 4 services on n1 stopped, n2 idle: 2 nodes × 8 GPUs
    assert "(1 jobs)" in patient_wait and "30.0 / 30.0" not in patient_wait


def test_cli_simulate_replays_a_production_config_without_a_site_file(tmp_path, monkeypatch):
    """A what-if on the shipped Slurm config needs no site file: a replay opens none of its paths or
    endpoints. Its queue settings hold (Slurm: the 16-GPU gang spans 8-GPU nodes) and stderr says
    where the site values came from; a config error is still one."""
    configs = Path(__file__).resolve().parents[2] / "configs"
    monkeypatch.delenv("DRAPE_SITE", raising=False)
    (tmp_path / "fleet.yaml").write_text(
        "groups:\n  - {model: H100, memory_gib: 80, nodes: 3, gpus_per_node: 8, node_prefix: n}\n"
    )
    rows = ["s0,0,600,30,1,3,service", "wide,100,3600,70,16,5,stage-training"]
    (tmp_path / "t.csv").write_text("job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\n" + "\n".join(rows) + "\n")
    args = ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml"), "--policy", "drape"]
    slurm = CliRunner().invoke(app, [*args, "--config", str(configs / "slurm.yaml")])
    assert slurm.exit_code == 0, slurm.output
    assert "| 9-16 GPUs |" in slurm.stdout and "no site file" not in slurm.stdout
    said = " ".join(slurm.stderr.split())
    assert "slurm.yaml: no site file given (DRAPE_SITE)" in said and "the replay reads none of them" in said
    kubernetes = CliRunner().invoke(app, [*args, "--config", str(configs / "h100.yaml")])
    assert kubernetes.exit_code == 2  # one node's 8 GPUs at most there: the gang never fits, named
    assert "job 'wide' (16 GPU(s) × 70 GiB) can never run" in " ".join(kubernetes.stdout.split())
    assert "reads only queue.kubernetes.kueue_queue" in " ".join(kubernetes.stderr.split())
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"extends": str(configs / "slurm.yaml"), "queue": {"launcher": "pbs"}}))
    bad = CliRunner().invoke(app, [*args, "--config", str(tmp_path / "bad.yaml")])
    assert bad.exit_code == 2 and "config error" in bad.output and "launcher" in bad.output


def test_cli_simulate_shows_the_policies_that_ran_when_one_leaves_a_job_waiting_forever(tmp_path):
    """On Slurm a 12-GPU gang on 8-GPU nodes runs as 2 nodes x 6 (drape's even split); the FIFO
    baseline gives gangs whole nodes only, so it never starts it: its failure is named (exit 2)
    after drape's table, not instead of it."""
    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    (tmp_path / "fleet.yaml").write_text(
        "groups:\n  - {model: H100, memory_gib: 80, nodes: 2, gpus_per_node: 8, node_prefix: n}\n"
    )
    rows = ["s0,0,600,30,1,3,service", "gang,10,3600,70,12,5,stage-training", "s1,20,600,30,1,3,service"]
    (tmp_path / "t.csv").write_text("job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind\n" + "\n".join(rows) + "\n")
    (tmp_path / "slurm.yaml").write_text(
        yaml.safe_dump({"extends": str(demo), "queue": {"launcher": "slurm", "max_jobs_per_gpu": 1}})
    )
    args = ["queue", "simulate", "--trace", str(tmp_path / "t.csv"), "--fleet", str(tmp_path / "fleet.yaml")]
    result = CliRunner().invoke(app, [*args, "--policy", "drape,fifo-exclusive", "--config", str(tmp_path / "slurm.yaml")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "| drape | 3 | 16 |" in said, said
    assert "| 9-16 GPUs |" in said and "| fifo-exclusive |" not in said
    stuck = "policy fifo-exclusive can never place 2 waiting job(s) on this fleet, though each fits it empty"
    assert f"{stuck}; the first submitted: ['gang', 's1']" in said


@pytest.mark.parametrize("reference", [False, True], ids=["planner", "plan_drape"])
def test_with_the_whole_wait_a_gang_job_stopped_after_its_bound_is_overdue_again_at_once(tmp_path, reference):
    """One node of four GPUs held by four 1-GPU services (priority 3, 100 h, 30 GiB: two share a GPU).
    Gang A (priority 5, 2 GPUs, 2 h) waits its 1-h bound and stops two services, which restart beside
    the other two; gang B (priority 6, 2 GPUs, 10 h), overdue an hour after its submit, stops A (the
    least work left). Counted from its requeue, A waits its bound again before it stops the four
    services on the other two GPUs; counted whole (`gang_bound_whole_wait`), it had waited its hour
    already and stops them at once."""
    from scheduler.policy import PolicyConfig

    (tmp_path / "f.yaml").write_text("groups:\n  - {model: H100, memory_gib: 80, nodes: 1, gpus_per_node: 4}\n")
    fleet = load_fleet(tmp_path / "f.yaml")
    services = [TraceJob(f"s{n}", 0, 360000, 30, 1, 3, "service") for n in range(4)]
    trace = [*services, TraceJob("A", 10, 7200, 70, 2, 5, "stage"), TraceJob("B", 3700, 36000, 70, 2, 6, "stage")]
    bounded = PolicyConfig(preempt_after_s=None, gang_max_wait_s=3600.0)
    starts = {}
    for whole in (False, True):
        record: list = []
        simulate(trace, fleet, "drape", replace(bounded, gang_bound_whole_wait=whole), reference=reference, record=record)
        starts[whole] = [(round(clock, 3), tuple(sorted(evicted))) for clock, job, _, evicted in record if job == "A"]
    assert starts[False][0] == starts[True][0] == (3610.0, ("s0", "s1"))  # its bound from its submit: two services stopped
    four = ("s0", "s1", "s2", "s3")
    assert starts[True][1] == (7300.0, four)  # B stopped it at 7300, and it stops the services at once
    assert starts[False][1] == (7300.0 + 3600.0, four)  # its bound again from the requeue


@pytest.mark.parametrize("reference", [False, True], ids=["planner", "plan_drape"])
def test_with_the_backlog_a_gang_job_stops_others_when_its_risen_bound_runs_out(tmp_path, reference):
    """One node of four GPUs held by four 1-GPU services (100 h, 70 GiB: one to a GPU), four more
    waiting (10 h each), and gang A (2 GPUs, 2 h) submitted at 10 s with a 1-h bound. Alone it stops
    two services at 3,610 s. With `gang_bound_backlog` 0.25 its bound is a quarter of the backlog,
    (4 x 36,000 + 2 x 7,200) / 4 = 39,600 s: 9,900 s, and it stops them at 9,910 s, when nothing
    else happens (the replay wakes for the risen bound, not only for the bound as set)."""
    from scheduler.policy import PolicyConfig

    (tmp_path / "f.yaml").write_text("groups:\n  - {model: H100, memory_gib: 80, nodes: 1, gpus_per_node: 4}\n")
    fleet = load_fleet(tmp_path / "f.yaml")
    services = [TraceJob(f"s{n}", 0, 360000, 70, 1, 3, "service") for n in range(4)]
    waiting = [TraceJob(f"w{n}", 5, 36000, 70, 1, 3, "eval") for n in range(4)]
    trace = [*services, *waiting, TraceJob("A", 10, 7200, 70, 2, 5, "stage")]
    bounded = PolicyConfig(preempt_after_s=None, gang_max_wait_s=3600.0)
    starts = {}
    for k in (0.0, 0.25):
        record: list = []
        simulate(trace, fleet, "drape", replace(bounded, gang_bound_backlog=k), reference=reference, record=record)
        starts[k] = [(round(clock, 3), len(evicted)) for clock, job, _, evicted in record if job == "A"]
    assert starts[0.0] == [(3610.0, 2)] and starts[0.25] == [(9910.0, 2)]

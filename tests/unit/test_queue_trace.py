"""Whether a run was measured alone or beside other jobs, end to end: the ledger's history at its
end, the profile's expected duration, `drape queue trace`, and the simulator reading it back."""

import sqlite3

import pytest
import yaml
from typer.testing import CliRunner

from scheduler.jobs.profiles import profile, shape_key
from scheduler.policy import GpuState, Placement
from scheduler.queue.store import JobSpec, JobStore
from scheduler.sim import load_trace, simulate
from scheduler.sim.export import export_trace


def _history(store: JobStore, shape: str) -> None:
    """a (t 100-1000) and b (t 200-700) share gpu0; c runs alone on gpu1 (150-900); d runs on gpu0
    after both left (1100-1500)."""
    store.register_gpus([GpuState(f"n/gpu{i}", "n", "H100-80GB", 80.0) for i in range(2)])
    spans = {"a": (0, 100, 1000, "n/gpu0"), "b": (50, 200, 700, "n/gpu0"), "c": (60, 150, 900, "n/gpu1")}
    spans["d"] = (1050, 1100, 1500, "n/gpu0")
    for job_id, (submit, *_) in spans.items():
        spec = JobSpec(kind="gate-eval", command=["true"], mem_gib=10.0, duration_s=600, shape=shape, id=job_id)
        store.submit(spec, now=submit)
    events = sorted(
        [(start, "start", j) for j, (_, start, _, _) in spans.items()] + [(end, "end", j) for j, (*_, end, _) in spans.items()]
    )
    for at, what, job_id in events:
        if what == "start":
            assert store.claim(Placement(job_id, (spans[job_id][3],), 10.0), "d", 1e6, 4, now=at)
        else:
            assert store.finish(job_id, exit_code=0, peak_gib=7.5, now=at) == "succeeded"


def test_a_run_beside_another_job_is_measured_shared(config, tmp_path):
    store = JobStore(config.queue_url)
    shape = shape_key(config, "gate-eval", "identity")
    _history(store, shape)
    ran = {job_id: store.get(job_id)["labels"] for job_id in "abcd"}
    assert ['"measured": "shared"' in ran[j] for j in "abcd"] == [True, True, False, False]
    assert [shared for _, _, shared in store.measurements(shape)] == [False, True, False, True]  # newest first: d a c b
    # the expected duration comes from the runs measured alone (c 750 s, d 400 s), not a's 900 s slowed beside b
    learned = profile(config, store, "gate-eval", "identity")
    assert learned.source == "measured" and learned.measured_p95_duration_s == pytest.approx(750.0)

    out = tmp_path / "trace.csv"
    assert export_trace(store, out) == 4
    trace = {job.job_id: job for job in load_trace(out)}
    assert {j: trace[j].measured for j in "abcd"} == {"a": "shared", "b": "shared", "c": "alone", "d": "alone"}
    assert trace["a"].duration_s == pytest.approx(900.0) and trace["d"].submit_s == pytest.approx(1050.0)
    assert trace["b"].peak_mem_gib == pytest.approx(7.5) and trace["c"].gpus == 1
    result = simulate(list(trace.values()), [GpuState("m/gpu0", "m", "H100-80GB", 80.0)], "drape")
    assert result.class_waits["1"]["jobs"] == 4


def test_drape_queue_trace_writes_what_the_simulator_reads(config, tmp_path):
    from drape.cli import app

    store = JobStore(config.queue_url)
    _history(store, "shape")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    out = tmp_path / "week.csv"
    result = CliRunner().invoke(app, ["queue", "trace", "--out", str(out), "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "4 job(s)" in result.output and len(load_trace(out)) == 4
    recent = CliRunner().invoke(app, ["queue", "trace", "--out", str(out), "--since-hours", "1", "--config", str(path)])
    assert recent.exit_code == 0 and "0 job(s)" in recent.output  # submitted at t = 0-1050 s, long ago
    bad = CliRunner().invoke(app, ["queue", "trace", "--out", str(tmp_path / "nowhere" / "x.csv"), "--config", str(path)])
    assert bad.exit_code != 0 and "does not exist" in bad.output


def test_a_queue_database_from_before_gains_the_column_and_keeps_its_history(tmp_path):
    database = tmp_path / "queue.db"
    with sqlite3.connect(database) as connection:  # the measurements table as an earlier drape created it
        connection.execute(
            "CREATE TABLE measurements (id INTEGER PRIMARY KEY, shape VARCHAR(256) NOT NULL, peak_gib FLOAT NOT NULL,"
            " duration_s FLOAT NOT NULL, recorded_s FLOAT NOT NULL)"
        )
        connection.execute("INSERT INTO measurements (shape, peak_gib, duration_s, recorded_s) VALUES ('s', 3.0, 60.0, 1.0)")
    connection.close()
    store = JobStore(f"sqlite:///{database}")
    assert store.measurements("s") == [(3.0, 60.0, False)]
    JobStore(f"sqlite:///{database}")  # a second open finds it upgraded
    with sqlite3.connect(database) as connection:
        indexes = {row[1] for row in connection.execute("PRAGMA index_list('allocation_log')")}
    connection.close()
    assert "allocation_log_gpu_at" in indexes


def test_a_stopped_job_is_exported_with_its_whole_run_and_what_it_declared(config, tmp_path):
    """A job stopped for a gang job ran 300 s, waited, then ran 400 s more: the trace gives it 700 s of
    run (its last run alone was 400 s), and a job that declared it may not be stopped, and its
    checkpoint cadence, keeps both, so the simulator never stops it either."""
    store = JobStore(config.queue_url)
    store.register_gpus([GpuState(f"n/gpu{i}", "n", "H100-80GB", 80.0) for i in range(2)])
    for job_id, preemptible in (("stopped", True), ("pinned", False)):
        spec = JobSpec(kind="finetune", command=["true"], mem_gib=10.0, duration_s=600, id=job_id)
        spec.preemptible, spec.checkpoint_every_s = preemptible, 1800.0 if not preemptible else 600.0
        store.submit(spec, now=0)
    assert store.claim(Placement("stopped", ("n/gpu0",), 10.0), "d", 1e6, 4, now=100)
    assert store.claim(Placement("pinned", ("n/gpu1",), 10.0), "d", 1e6, 4, now=100)
    assert store.preempt("stopped", "gang", now=400) is not None
    assert store.claim(Placement("stopped", ("n/gpu0",), 10.0), "d", 1e6, 4, now=500)
    for job_id in ("stopped", "pinned"):
        assert store.finish(job_id, exit_code=0, peak_gib=8.0, now=900) == "succeeded"
    out = tmp_path / "trace.csv"
    assert export_trace(store, out) == 2
    trace = {job.job_id: job for job in load_trace(out)}
    assert trace["stopped"].duration_s == pytest.approx(700.0) and trace["pinned"].duration_s == pytest.approx(800.0)
    assert trace["stopped"].preemptible and trace["stopped"].checkpoint_every_s == 600.0
    assert not trace["pinned"].preemptible and trace["pinned"].checkpoint_every_s == 1800.0

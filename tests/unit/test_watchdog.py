"""The stall watchdog's decisions on the dispatcher's clock (scheduler/dispatch/watchdog.py) and the progress
reports it reads (drape/storage/progress.py), read back as untrusted: a fake queue and engine, a real store."""

from __future__ import annotations

import json

import pytest

from drape.storage.progress import MAX_REPORT_BYTES, ProgressReporter, progress_key, read_progress
from drape.storage.store import ObjectStore
from scheduler.dispatch.watchdog import Watchdog
from tests.conftest import tiny_config


class FakeQueue:
    def __init__(self, rows: dict[str, dict]):
        self.rows, self.finished = rows, []

    def get_many(self, job_ids):
        return {job_id: self.rows[job_id] for job_id in job_ids if job_id in self.rows}

    def finish(self, job_id, **fields):
        self.finished.append((job_id, fields))
        self.rows[job_id]["state"] = "queued"
        return "queued"


class FakeEngine:
    def __init__(self):
        self.cancelled = []

    def cancel(self, job_id, handle):
        self.cancelled.append((job_id, handle))


@pytest.fixture
def watched(tmp_path):
    config = tiny_config(tmp_path / "drape", queue={"enabled": True, "stall_timeout_seconds": 10, "max_attempts": 3})
    objects = ObjectStore(f"file://{tmp_path / 'objects'}")
    rows = {
        "stage-1": {"state": "running", "stage": "identity", "labels": json.dumps({"run": "r1"})},
        "bench-1": {"state": "running", "stage": None, "labels": "{}"},  # not a stage job: never watched
    }
    queue, engine = FakeQueue(rows), FakeEngine()
    return Watchdog(config, queue, engine, "d1", objects=lambda: objects), queue, engine, objects


def _graced(tmp_path, dispatcher: str):
    """A watchdog with a 10 s stall timeout and a 60 s grace over one running stage job of run r1:
    (watchdog, queue, engine, objects, rows)."""
    config = tiny_config(tmp_path / "drape", queue={"enabled": True, "stall_timeout_seconds": 10, "stall_grace_seconds": 60})
    objects = ObjectStore(f"file://{tmp_path / 'objects'}")
    rows = {"stage-1": {"state": "running", "stage": "identity", "labels": json.dumps({"run": "r1"})}}
    queue, engine = FakeQueue(rows), FakeEngine()
    return Watchdog(config, queue, engine, dispatcher, objects=lambda: objects), queue, engine, objects, rows


def test_a_job_whose_report_stops_changing_is_cancelled_after_the_timeout_and_only_then(watched):
    watchdog, queue, engine, objects = watched
    mine = {"stage-1": "pid:1", "bench-1": "pid:2"}
    assert watchdog.check(mine, 0.0) == []  # first seen: its start-up counts from now
    assert watchdog.check(mine, 9.0) == []  # 9 s with no report: within the timeout
    ProgressReporter(objects, "r1", "identity")(1, 12, force=True)
    assert watchdog.check(mine, 9.5) == []  # checked at most every 10 / 4 s: not read yet
    assert watchdog.check(mine, 12.0) == []  # a new report: progress, counted from 12 s
    assert watchdog.check(mine, 21.0) == []  # 9 s without a change
    assert engine.cancelled == [] and queue.finished == []
    assert watchdog.check(mine, 22.0) == []  # not due: checked 1 s ago
    assert watchdog.check(mine, 24.0) == ["stage-1"]  # 12 s without a change
    assert engine.cancelled == [("stage-1", "pid:1")] and mine == {"bench-1": "pid:2"}
    ((job_id, fields),) = queue.finished
    assert job_id == "stage-1" and fields["exit_code"] != 0 and fields["max_attempts"] == 3
    assert fields["message"].startswith("no progress for 12 s (queue.stall_timeout_seconds: 10; its last report: step 1/12 at ")
    assert watchdog.check(mine, 500.0) == [] and len(engine.cancelled) == 1  # the benchmark job is never judged


def test_a_job_that_keeps_reporting_runs_on(watched):
    watchdog, _, engine, objects = watched
    report = ProgressReporter(objects, "r1", "identity", interval=0.0)
    mine = {"stage-1": "pid:1"}
    for second in range(0, 60, 3):
        report(second, 100)
        assert watchdog.check(mine, float(second)) == []
    assert engine.cancelled == []


def test_a_retry_s_start_up_gets_stall_grace_seconds_and_its_steps_the_stall_timeout(tmp_path):
    watchdog, queue, engine, objects, rows = _graced(tmp_path, "d1")
    ProgressReporter(objects, "r1", "identity")(6, 12, force=True)  # a run that then hangs at step 6
    mine = {"stage-1": "pid:1"}
    assert watchdog.check(mine, 0.0) == []  # a step report: stepping, so 10 s without a change is a stall
    assert watchdog.check(mine, 9.0) == [] and watchdog.check(mine, 12.0) == ["stage-1"]
    assert read_progress(objects, "r1", "identity").total == 0  # the hung run's report cleared for its retry
    rows["stage-1"]["state"], mine = "running", {"stage-1": "pid:2"}  # the retry, launched
    assert watchdog.check(mine, 20.0) == [] and watchdog.check(mine, 75.0) == []  # 55 s of start-up: within 60 s
    report = ProgressReporter(objects, "r1", "identity")
    report(0, 0, force=True)  # its start: before the checkpoint's fetch and the model's build
    assert watchdog.check(mine, 78.0) == [] and watchdog.check(mine, 135.0) == []  # still starting up: 57 s
    report(5, 12, force=True)  # its first step (resumed from step 4): from now on 10 s without a change is a stall
    assert watchdog.check(mine, 138.0) == [] and watchdog.check(mine, 147.0) == []
    assert len(engine.cancelled) == 1
    assert watchdog.check(mine, 150.0) == ["stage-1"] and engine.cancelled[-1] == ("stage-1", "pid:2")
    assert queue.finished[-1][1]["message"].startswith("no progress for 12 s (queue.stall_timeout_seconds: 10; its last ")


def test_an_adopted_job_s_step_report_counts_as_steps(tmp_path):
    """A dispatcher that adopts a running job reads its step report first: the stall timeout, not the grace."""
    watchdog, queue, engine, objects, rows = _graced(tmp_path, "d2")
    ProgressReporter(objects, "r1", "identity")(1, 12, force=True)
    mine = {"stage-1": "slurm:3:drape-stage-1-a1"}
    assert watchdog.check(mine, 0.0) == [] and watchdog.check(mine, 9.0) == []
    assert watchdog.check(mine, 12.0) == ["stage-1"]


def test_a_job_that_never_starts_is_cancelled_after_stall_grace_seconds_saying_so(tmp_path):
    watchdog, queue, engine, objects, rows = _graced(tmp_path, "d1")
    mine = {"stage-1": "pid:1"}
    assert watchdog.check(mine, 0.0) == []
    ProgressReporter(objects, "r1", "identity")(0, 0, force=True)  # its start, and then nothing
    assert watchdog.check(mine, 5.0) == [] and watchdog.check(mine, 65.0) == []
    assert watchdog.check(mine, 68.0) == ["stage-1"] and engine.cancelled == [("stage-1", "pid:1")]
    message = queue.finished[0][1]["message"]
    assert message.startswith("no progress for 63 s (queue.stall_grace_seconds: 60; it reported its start at "), message


def test_after_its_last_step_a_job_gets_stall_grace_seconds_to_finish(tmp_path):
    watchdog, queue, engine, objects, rows = _graced(tmp_path, "d1")
    mine, report = {"stage-1": "pid:1"}, ProgressReporter(objects, "r1", "identity", interval=0.0)
    assert watchdog.check(mine, 0.0) == []
    report(0, 0)
    assert watchdog.check(mine, 3.0) == []
    report(11, 12)
    assert watchdog.check(mine, 6.0) == []  # stepping: 10 s from here would be a stall
    report(12, 12)  # the last step: then the final checkpoint and the result, outside the steps
    assert watchdog.check(mine, 9.0) == [] and watchdog.check(mine, 65.0) == [] and engine.cancelled == []
    assert watchdog.check(mine, 70.0) == ["stage-1"]
    assert queue.finished[0][1]["message"].startswith("no progress for 61 s (queue.stall_grace_seconds: 60; its last ")


def test_no_watchdog_where_stage_jobs_do_not_report(tmp_path):
    shared = tiny_config(tmp_path / "a", paths={"shared": True}, queue={"enabled": True, "stall_timeout_seconds": 10})
    off = tiny_config(tmp_path / "b", queue={"enabled": True, "stall_timeout_seconds": None})
    for config in (shared, off):
        watchdog = Watchdog(config, FakeQueue({}), FakeEngine(), "d1")
        assert watchdog.timeout is None and watchdog.check({"stage-1": "pid:1"}, 1e9) == []


@pytest.mark.parametrize(
    "payload",
    [
        b"[1, 2]",
        b"not json",
        json.dumps({"step": -1, "total": 12, "time": 1.0}).encode(),
        json.dumps({"step": True, "total": 12, "time": 1.0}).encode(),
        json.dumps({"step": 1, "total": 10**12, "time": 1.0}).encode(),
        b'{"step": 1, "total": 12, "time": NaN}',
        json.dumps({"step": 1, "total": 12}).encode(),
        json.dumps({"step": 1, "total": 12, "time": 1.0, "pad": "x" * MAX_REPORT_BYTES}).encode(),
    ],
    ids=["list", "text", "negative", "bool", "huge", "nan", "no-time", "oversize"],
)
def test_a_report_that_is_not_one_counts_as_none(tmp_path, payload):
    objects = ObjectStore(f"file://{tmp_path}")
    objects.put_bytes(payload, progress_key("r1", "identity"))
    assert read_progress(objects, "r1", "identity") is None


def test_a_report_reads_back_and_a_failed_write_is_skipped(tmp_path):
    objects = ObjectStore(f"file://{tmp_path}")
    report = ProgressReporter(objects, "r1", "identity", run="7.0")
    report(3, 12, force=True)
    back = read_progress(objects, "r1", "identity")
    assert (back.step, back.total, back.run) == (3, 12, "7.0")
    report(4, 12)  # within the interval: not written
    assert read_progress(objects, "r1", "identity").step == 3
    fresh = ProgressReporter(objects, "r1", "identity")
    fresh(0, 0, force=True)
    fresh(5, 12)  # its first step, within the interval: written (the start-up is over)
    assert read_progress(objects, "r1", "identity").step == 5
    fresh(6, 12)  # the next, within the interval: not written
    assert read_progress(objects, "r1", "identity").step == 5
    report(12, 12)  # the last step: always written
    assert read_progress(objects, "r1", "identity").step == 12
    broken = ProgressReporter(ObjectStore(f"file://{tmp_path / 'broken'}"), "r1", "identity")
    (tmp_path / "broken" / "runs").write_text("a file where the run's folder should be")
    broken(1, 12, force=True)  # raises nothing: a missed report costs at most a retry
    assert broken.failures == 1

"""A flow started while its dispatcher is down (issue 68, `queue.dispatch_in_process: false`).

Before: the flow's task submitted its stage job and waited in silence for as long as the dispatcher
stayed down. Now the job stays durable in the queue, the waiting flow says on its log that no
dispatcher has cycled (and sets `drape_queue_dispatcher_silent_seconds`), and when a dispatcher
comes back it runs the job once; the flow's wait ends with the job's result."""

from __future__ import annotations

import sys
import threading
import time

from drape.ops import metrics
from scheduler.dispatch.dispatcher import Dispatcher, submit_and_wait
from scheduler.jobs.training import train_job_spec
from scheduler.queue.store import JobStore
from tests.conftest import tiny_config


def _until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.05)
    return found


def test_a_stage_job_queued_while_no_dispatcher_runs_is_said_then_run_once_when_one_starts(tmp_path, capsys):
    config = tiny_config(
        tmp_path / "drape",
        queue={"enabled": True, "dispatch_in_process": False, "poll_seconds": 0.05, "lease_seconds": 0.5},
    )
    ran = tmp_path / "ran.txt"
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'a').write('ran\\n')"]
    spec = train_job_spec(config, stage="identity", mode="full", run_id="no-dispatcher", command=command)
    outcome: dict = {}
    waiter = threading.Thread(target=lambda: outcome.update(row=submit_and_wait(config, spec, timeout_s=120)), daemon=True)
    waiter.start()  # the flow's train task: nothing dispatches in its process
    silent = metrics.QUEUE_DISPATCHER_SILENT.labels(run="no-dispatcher", stage="identity")
    _until(lambda: silent._value.get() > 0.5, 30, "the waiting flow to notice no dispatcher")
    (job,) = JobStore(config.queue_url).jobs()
    assert job["state"] == "queued" and not ran.exists()  # durable, waiting: nothing ran

    stop = threading.Event()  # the dispatcher comes back
    dispatcher = threading.Thread(target=lambda: Dispatcher(config).run(stop=stop.is_set), daemon=True)
    dispatcher.start()
    try:
        waiter.join(timeout=120)
    finally:
        stop.set()
        dispatcher.join(timeout=30)
    assert outcome["row"]["state"] == "succeeded" and outcome["row"]["attempts"] == 1
    assert ran.read_text() == "ran\n"  # run once
    assert silent._value.get() == 0.0
    out = capsys.readouterr().out
    assert f"queue: {job['id']} is queued and no dispatcher has cycled for" in out
    assert "(none ever seen); it stays queued and runs once when a dispatcher starts (drape queue dispatch)" in out
    assert out.count("no dispatcher has cycled") == 1  # said once (again only every 5 min), not every poll
    assert "queue: a dispatcher is back after" in out

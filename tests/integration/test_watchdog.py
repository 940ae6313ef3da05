"""The stall watchdog on the local engine (scheduler/dispatch/watchdog.py): a stage job whose trainer
stops making progress (its training step sleeps, the process alive) is cancelled once it has reported
no new step for `queue.stall_timeout_seconds`, and its next attempt resumes from the checkpoint the
hung run published. On main the job ran on, RUNNING, until someone cancelled it.

The stall timeout is short (`STALL_SECONDS`): it counts only between the trainer's first and last
steps; its start-up (imports, the checkpoint's fetch: 4 s idle, 20 s at a load of 8 on 2 cores)
has `queue.stall_grace_seconds`, which a passing run never waits to the end."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from drape.storage.handoff import result_key
from drape.storage.progress import read_progress
from drape.storage.store import open_store
from drape.training.jobs.stage_job import StageJob
from scheduler.dispatch.dispatcher import wait_for
from scheduler.jobs.training import train_job_spec
from scheduler.queue.store import JobStore
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow
STALL_SECONDS = 8.0  # between two steps' reports (every 8 / 4 s): a tiny model's step and checkpoint take far less
GRACE_SECONDS = 180.0  # to the first step, and after the last: a loaded machine's imports and restore, with room

# the real trainer, its training step made to sleep (alive, no progress) on the first attempt after `hang_after` steps
HANGING_TRAINER = """
import os, sys, time
from pathlib import Path
from drape.training.loop import trainer
marker, hang_after, args = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
real, calls = trainer.train_step, [0]
def step(*a, **k):
    calls[0] += 1
    if calls[0] > hang_after and not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(3600)
    return real(*a, **k)
trainer.train_step = step
from drape.training.jobs.stage_job import main
raise SystemExit(main(args))
"""


def test_a_local_stage_job_that_stops_making_progress_is_cancelled_and_resumes_from_its_checkpoint(tmp_path, capsys, monkeypatch):
    config = tiny_config(
        tmp_path / "drape",
        train={"checkpoint_every": 4, "stages": {"identity": {"steps": 12, "trainable": ["*"]}}},
        queue={
            "enabled": True,
            "poll_seconds": 0.2,
            "stall_timeout_seconds": STALL_SECONDS,
            "stall_grace_seconds": GRACE_SECONDS,
            "max_attempts": 2,
        },
    )
    script, marker = tmp_path / "hanging_trainer.py", tmp_path / "hung.pid"
    script.write_text(textwrap.dedent(HANGING_TRAINER))
    objects = open_store(config)
    command = StageJob(config, "identity", "unused", run_id="hung", handoff=True).publish(objects)
    assert command[1:3] == ["-m", "drape.train"], command
    command = [sys.executable, str(script), str(marker), "6", *command[3:]]
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))  # the job imports this checkout
    store = JobStore(config.queue_url)
    job_id = store.submit(train_job_spec(config, stage="identity", mode="full", run_id="hung", command=command))
    started = time.monotonic()
    row = wait_for(config, store, job_id, timeout_s=240)
    seconds = time.monotonic() - started
    said = capsys.readouterr().out
    print(said[-3000:], f"\nwatchdog: a hung local stage job cancelled and finished by its retry in {seconds:.1f} s")
    assert row["state"] == "succeeded" and row["attempts"] == 2, row
    hung_pid = int(marker.read_text())
    assert not Path(f"/proc/{hung_pid}").exists() or "Z" in Path(f"/proc/{hung_pid}/stat").read_text().split()[2]
    assert f"queue: {job_id} no progress for " in said and f"queue.stall_timeout_seconds: {STALL_SECONDS:g};" in said
    # rank 0's last report before the hang: its first step (always written), or a later one up to the 6th
    assert re.search(r"its last report: step [1-6]/12 at ", said), said[-2000:]
    result = json.loads(objects.read_bytes(result_key("hung", "identity")))
    assert result["resumed_from_step"] == 4 and result["steps"] == 12, result  # the checkpoint the hung run published
    assert read_progress(objects, "hung", "identity").step == 12

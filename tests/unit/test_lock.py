"""drape.training.jobs.lock: one live trainer per stage directory, released however the holder ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drape.training.jobs.lock import StageBusy, stage_lock

REPO = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time; from drape.training.jobs.lock import stage_lock\n"
    "with stage_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)"
)


def _holder(stage_dir: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(stage_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_second_trainer_is_refused_while_the_first_lives_and_admitted_once_it_is_killed(tmp_path):
    stage_dir = tmp_path / "runs" / "r1" / "texture"
    first = _holder(stage_dir)
    try:
        with pytest.raises(
            StageBusy, match=rf"stage directory {stage_dir} is held by another live trainer \(host .*, pid {first.pid},"
        ):
            with stage_lock(stage_dir):
                pass
    finally:
        first.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the lock with the process
        first.wait()
    assert (stage_dir / ".trainer.lock").exists()  # a SIGKILLed holder leaves its file behind ...
    started = time.monotonic()
    with stage_lock(stage_dir):  # ... and it does not block the retry
        assert "pid" in (stage_dir / ".trainer.lock").read_text()
    assert time.monotonic() - started < 1
    assert not (stage_dir / ".trainer.lock").exists()  # released: nothing is left in the stage directory


def test_ranks_other_than_the_main_one_pass_through(tmp_path):
    with stage_lock(tmp_path, hold=True), stage_lock(tmp_path, hold=False):
        with pytest.raises(StageBusy):
            with stage_lock(tmp_path):
                pass

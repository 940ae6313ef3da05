"""drape/training/loop/stop.py: SIGTERM and SIGUSR1 ask the trainer to checkpoint and stop; helpers it
forks (data loader workers) still end on SIGTERM. Run in a child interpreter: the handlers are process-wide."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, time
from types import SimpleNamespace
from drape.training.loop import stop

one = SimpleNamespace(is_distributed=False)
assert not stop.requested(one)                      # not installed: never asks (the flow's in-process trainer)
stop.install()
assert not stop.requested(one)
ready, ready_w = os.pipe()
child = os.fork()
if child == 0:                                      # a forked helper: SIGTERM ends it, as before
    os.write(ready_w, b"1")
    time.sleep(30)
    os._exit(0)
os.close(ready_w)
assert os.read(ready, 1) == b"1"                    # the helper runs its own code (empty: it died first)
os.kill(child, signal.SIGTERM)
_, status = os.waitpid(child, 0)
assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
os.kill(os.getpid(), signal.SIGUSR1)                # the trainer itself: asked to stop, not ended
deadline = time.monotonic() + 5
while not stop.requested(one) and time.monotonic() < deadline:  # the handler runs at Python's next check
    time.sleep(0.01)
assert stop.requested(one)
print("ok", stop.EXIT_STOPPED)
"""


def test_a_signal_asks_the_trainer_to_stop_and_a_forked_helper_still_ends():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "75"] and "SIGUSR1: saving a checkpoint" in done.stderr


def test_a_finished_run_says_so_only_where_a_batch_script_marked_it(capsys, monkeypatch):
    """`say_finished` prints this run's `finished_line` under a run mark (the Slurm batch script reads
    it after a stop signal); without one, nothing: no one would read it."""
    from drape.training.loop import stop

    monkeypatch.delenv(stop.RUN_MARK_VARIABLE, raising=False)
    stop.say_finished("texture")
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(stop.RUN_MARK_VARIABLE, "41.2")
    stop.say_finished("texture")
    assert capsys.readouterr().out == (
        "drape: finished during run 41.2: stage texture trained to the end, its result is in the store\n"
    )

"""drape/ops/process.py: drape's entry points end without a collection over everything they imported,
and a signal (SIGTERM, SIGINT, SIGHUP) stops a command's children as Ctrl-C does."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))  # runs after the next
{setup}
print("frozen before exit:", gc.get_freeze_count() > 0, flush=True)
"""


def _run(setup: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_collectors_objects_are_frozen_at_exit_only_once_asked():
    asked = "from drape.ops.process import end_without_collection\nend_without_collection(); end_without_collection()"
    assert _run(asked) == ["frozen before exit: False", "frozen at exit: True"]
    assert _run("import drape.ops.process") == ["frozen before exit: False", "frozen at exit: False"]


def test_the_drape_command_and_the_stage_job_ask_for_it():
    command = "sys.argv = ['drape', 'cost', '--help']\nfrom drape.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass"
    stage_job = "from drape.training.jobs.stage_job import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    for setup in (command, stage_job):
        lines = _run(setup)
        assert lines[-2:] == ["frozen before exit: False", "frozen at exit: True"], lines[-5:]
    assert 'drape = "drape.cli:main"' in (REPO / "pyproject.toml").read_text()  # the console command goes through main


# --- children stopped on SIGTERM, SIGINT and SIGHUP (`drape serve`: tests/integration/test_serve_signals.py) ---
CHILD = textwrap.dedent(
    """
    import subprocess, sys
    from drape.ops.process import stop_children_on_termination
    stop_children_on_termination()
    child = subprocess.Popen(["sleep", "60"]) if sys.argv[1] == "popen" else None
    try:
        print("started", flush=True)
        if child is None:
            subprocess.run(["sleep", "60"])  # as `drape cost scaling` runs torchrun, `shopper forget` mlflow gc
        child.wait()
    finally:
        if child is not None and child.poll() is None:  # as bench's workers are closed
            child.kill()
            child.wait()
    """
)


WAIT4 = {"x86_64": "61", "aarch64": "260"}.get(platform.machine())  # the wait4 system call's number


def _waiting_on_sleep(pid: int) -> set[int]:
    """`pid`'s descendants once its child has exec'd `sleep` and `pid` is blocked in wait4 (so out of
    Popen()); empty before. Where /proc/PID/syscall cannot be read or wait4's number is not known here,
    the exec alone (Popen() returns right after it)."""
    from tests.integration.test_serve_signals import descendants

    children = descendants(pid)
    try:
        execed = any(Path(f"/proc/{child}/comm").read_text().strip() == "sleep" for child in children)
    except OSError:  # the child exited or was not there yet
        return set()
    try:
        waiting = WAIT4 is None or Path(f"/proc/{pid}/syscall").read_text().split()[0] == WAIT4
    except (OSError, IndexError):
        waiting = True
    return children if execed and waiting else set()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("how", ["run", "popen"])
def test_a_signal_stops_a_commands_children_as_ctrl_c_does(signum, how):
    from tests.integration.test_serve_signals import alive

    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD, how],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        # as from a terminal: a suite started in the background (`make test &`) ignores SIGINT, and
        # a Python started so never installs its KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert parent.stdout is not None
        parent.stdout.readline()
        # past Popen(): a signal inside Popen() itself (between fork and exec) is Python's own race, not drape's
        children = wait_until(lambda: _waiting_on_sleep(parent.pid), 20, "the command waiting on its `sleep` child", 0.02)
        parent.send_signal(signum)
        assert parent.wait(timeout=10) != 0
        assert not [pid for pid in children if alive(pid)]
    finally:
        parent.kill()

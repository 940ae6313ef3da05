"""Processes left behind: `drape serve` stopped by SIGTERM (a service manager, a container runtime)
or SIGINT stops its Prefect server and worker, and whatever they started, within a bound.

One real `drape serve` (a Prefect server start, pools, deployments, a worker: ~30-60 s on two
cores); the other commands that start children do so through `subprocess.run` or a worker they
close in a `finally`, whose stop on SIGTERM is proved in tests/unit/test_process.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drape.cli.stack import REPO, free_port

STOP_BOUND_S = 30  # Stack.stop's grace (20 s) and the interpreter's exit


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (from /proc: children in their own sessions too)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_drape_serve_stopped_by_sigterm_leaves_no_process(tmp_path, signum):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    command = [sys.executable, "-c", "from drape.cli import main; main()", "serve"]
    drape = subprocess.Popen(
        [*command, "--port", str(free_port()), "--home", str(tmp_path / "prefect")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    said, children = "", set()
    try:
        deadline = time.monotonic() + 240
        assert drape.stdout is not None
        while "Ctrl-C stops" not in said and time.monotonic() < deadline and drape.poll() is None:
            said += drape.stdout.readline()
        assert "Ctrl-C stops" in said, said[-2000:]  # server, pools, deployments and worker are up
        children = descendants(drape.pid)
        assert len(children) >= 2, children  # at least the server and the worker
        started = time.monotonic()
        drape.send_signal(signum)
        drape.wait(timeout=STOP_BOUND_S + 10)
        stopped_in = time.monotonic() - started
        left = sorted(pid for pid in children if alive(pid))
        assert left == [], f"still running after {signal.Signals(signum).name}: {left}"
        assert stopped_in < STOP_BOUND_S, stopped_in
    finally:
        drape.kill()
        for pid in children:  # never leave a server behind a failed test
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

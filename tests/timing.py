"""Where the suite's time goes, per test file: wall seconds, CPU seconds and seconds slept.

A pytest plugin (tests/conftest.py loads it), off unless asked for: ``DRAPE_TEST_TIMES=<folder>
make test`` or ``DRAPE_TEST_TIMES=<folder> pytest ...``. Each pytest process that ran tests (each xdist worker) writes
``<folder>/<worker>.json``: per file, the wall time of its tests with their fixtures' setup and
teardown, the CPU time of this process and of the children it waited for (Slurm's daemons, a
job's torchrun, a service stopped at the end of a module), the seconds the test process's main
thread spent in `time.sleep` (a fixed sleep or a wait's poll), and when the file started and
ended on the worker's clock. On a machine shared with other work the wall time depends on the
load; the CPU time much less so: compare CPU seconds, and the wall seconds a file spends idle.

``python -m tests.timing <folder>`` prints the table (slowest first), each worker's total, and
the estimate of `make test`'s time: the busiest worker's wall time (workers run side by side).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

import pytest

ENV = "DRAPE_TEST_TIMES"


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _Times:
    def __init__(self, folder: Path):
        self.folder = folder
        self.files: dict[str, dict[str, float]] = {}
        self.slept = 0.0
        real_sleep, main = time.sleep, threading.main_thread()

        def sleep(seconds: float) -> None:
            if threading.current_thread() is main:
                self.slept += max(0.0, float(seconds))
            real_sleep(seconds)

        time.sleep = sleep  # counts the main thread's sleeps; sleeps itself all the same

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, cpu, slept = time.monotonic(), _cpu(), self.slept
        yield
        name = item.nodeid.split("::", 1)[0]
        entry = self.files.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0, "slept_s": 0.0, "tests": 0, "start": wall})
        entry["wall_s"] += time.monotonic() - wall
        entry["cpu_s"] += _cpu() - cpu
        entry["slept_s"] += self.slept - slept
        entry["tests"] += 1
        entry["end"] = time.monotonic()

    def pytest_sessionfinish(self, session):
        if not self.files:  # xdist's controller: its workers ran the tests
            return
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.folder.mkdir(parents=True, exist_ok=True)
        out = {name: {k: round(v, 2) for k, v in entry.items()} for name, entry in self.files.items()}
        partial = self.folder / f".{worker}.json.partial"
        partial.write_text(json.dumps(out, indent=1, sort_keys=True))
        partial.replace(self.folder / f"{worker}.json")


def pytest_configure(config):
    folder = os.environ.get(ENV)
    if folder:
        config.pluginmanager.register(_Times(Path(folder)), "drape-test-times")


def report(folder: Path) -> str:
    """The table of `folder`'s worker files: per file (slowest first), then per worker and the estimate."""
    workers = {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}
    if not workers:
        raise SystemExit(f"{folder}: no <worker>.json files (run pytest with {ENV}={folder})")
    rows = [(name, worker, entry) for worker, files in workers.items() for name, entry in files.items()]
    rows.sort(key=lambda row: -row[2]["wall_s"])
    lines = [f"{'file':58} {'worker':6} {'tests':>5} {'wall s':>8} {'CPU s':>8} {'slept s':>8} {'idle %':>6}"]
    for name, worker, entry in rows:
        idle = 100 * max(0.0, 1 - entry["cpu_s"] / entry["wall_s"]) if entry["wall_s"] else 0.0
        lines.append(
            f"{name:58} {worker:6} {entry['tests']:5d} {entry['wall_s']:8.1f} {entry['cpu_s']:8.1f} "
            f"{entry['slept_s']:8.1f} {idle:6.0f}"
        )
    lines.append("")
    busiest = 0.0
    for worker, files in workers.items():
        wall = sum(entry["wall_s"] for entry in files.values())
        cpu = sum(entry["cpu_s"] for entry in files.values())
        span = max(e["end"] for e in files.values()) - min(e["start"] for e in files.values())
        busiest = max(busiest, span)
        lines.append(
            f"worker {worker}: {len(files)} files, wall {wall:.1f} s (first start to last end {span:.1f} s), CPU {cpu:.1f} s"
        )
    total_wall = sum(entry["wall_s"] for _, _, entry in rows)
    lines.append(
        f"all workers: wall {total_wall:.1f} s, CPU {sum(e['cpu_s'] for _, _, e in rows):.1f} s; "
        f"estimate on {len(workers)} worker(s): {busiest:.1f} s (the busiest worker), "
        f"{total_wall / max(len(workers), 1):.1f} s balanced"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.timing <folder written by DRAPE_TEST_TIMES>")
    print(report(Path(sys.argv[1])))

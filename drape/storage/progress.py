"""A stage job's progress, reported through the object store: what the queue's watchdog reads.

A trainer that hangs (a rank blocked in a collective whose peer is gone, a node's job steps killed
while Slurm still counts the job RUNNING) looks to its engine like a job that runs. So a stage job
run apart writes a small report, ``runs/<run>/<stage>/progress/rank-<r>.json`` with its step and
wall time, when it starts, after its first step, then at most every `interval` seconds as steps
complete, and after its last (`ProgressReporter`); the dispatcher's watchdog (scheduler/dispatch/watchdog.py) cancels and
retries a job whose report stops changing. Rank 0 reports: every step ends in an all-reduce of the
loss over every rank, so rank 0's step is every rank's, and a stuck rank stops rank 0 too.

A report read back is untrusted (`read_progress`): a bounded size, a step and total that are
whole numbers within bounds, a finite time; anything else counts as no report.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from drape.layout import run_key
from drape.storage.store import ObjectStore, StorageError

MAX_REPORT_BYTES = 4096
MAX_STEP = 10**9


def progress_key(run_id: str, stage: str, rank: int = 0) -> str:
    return run_key(run_id, stage, f"progress/rank-{int(rank)}.json")


@dataclass(frozen=True)
class Progress:
    """One report: `step` of `total` done at `time` (the reporter's clock), by `rank`, in run `run`."""

    step: int
    total: int
    time: float
    rank: int = 0
    run: str = ""

    def to_dict(self) -> dict:
        return {"step": self.step, "total": self.total, "time": self.time, "rank": self.rank, "run": self.run}


class ProgressReporter:
    """Writes this rank's `Progress` to the store: at once (the job started), after its first step
    (its start-up is over: the watchdog's limit changes), then after a step when `interval` seconds
    have passed since the last write, and after the last step. A write that fails is skipped, never raised:
    a missed report costs at most a retry, a raised one would end the training."""

    def __init__(self, store: ObjectStore, run_id: str, stage: str, *, rank: int = 0, interval: float = 10.0, run: str = ""):
        self.store, self.key, self.rank, self.run = store, progress_key(run_id, stage, rank), rank, run
        self.interval = interval
        self.written_at = -math.inf
        self.failures = 0
        self.stepped = False  # a step written: the next ones wait for `interval`

    def __call__(self, done: int, total: int, *, force: bool = False) -> None:
        now = time.monotonic()
        first_step = total > 0 and not self.stepped
        if not force and not first_step and done < total and now - self.written_at < self.interval:  # the last: always
            return
        report = Progress(int(done), int(total), time.time(), self.rank, self.run)
        try:
            self.store.put_bytes(json.dumps(report.to_dict()).encode(), self.key)
        except (StorageError, OSError):
            self.failures += 1
            return
        self.written_at = now
        self.stepped = self.stepped or total > 0


def clear_progress(store: ObjectStore, run_id: str, stage: str, rank: int = 0) -> None:
    """Overwrite rank `rank`'s report with one of no step (what the queue's watchdog does to the report of
    a run it cancelled): the next run's start-up is then not mistaken for steps. A failed write is skipped."""
    report = Progress(0, 0, time.time(), rank, "cleared")
    try:
        store.put_bytes(json.dumps(report.to_dict()).encode(), progress_key(run_id, stage, rank))
    except (StorageError, OSError):
        pass


def read_progress(store: ObjectStore, run_id: str, stage: str, rank: int = 0) -> Progress | None:
    """Rank `rank`'s last report of the stage, checked (see the module docstring); None when there is
    none or it is not a valid report."""
    key = progress_key(run_id, stage, rank)
    try:
        if not store.exists(key) or store.size(key) > MAX_REPORT_BYTES:
            return None
        raw = store.read_bytes(key)
    except (StorageError, OSError):
        return None
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    return _checked(payload)


def _checked(payload: object) -> Progress | None:
    if not isinstance(payload, dict):
        return None
    step, total, when = payload.get("step"), payload.get("total"), payload.get("time")
    whole = all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_STEP for n in (step, total))
    if not whole or not isinstance(when, int | float) or isinstance(when, bool) or not math.isfinite(when):
        return None
    rank, run = payload.get("rank", 0), payload.get("run", "")
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= 1 << 20 else 0
    return Progress(step, total, float(when), rank, run[:100] if isinstance(run, str) else "")  # type: ignore[arg-type]

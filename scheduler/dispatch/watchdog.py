"""The stall watchdog: a running stage job whose trainer stopped making progress is cancelled and
retried from its last checkpoint, on any engine.

An engine answers "is it running?", not "is it getting anywhere?": a rank blocked in a collective
whose peer is gone, a trainer stopped by the kernel, or a Slurm job whose steps were killed while
its slurmd came back before `SlurmdTimeout` (Slurm keeps it RUNNING with no process) all look like
a job that runs. The trainer of a stage job run apart reports its step through the object store
(drape/storage/progress.py: once at start, after its first step, then at most every
`stall_timeout / 4` seconds as steps complete, and after its last). Each cycle, for the jobs this
dispatcher watches (`Dispatcher.mine`) that are stage jobs (a stage, and a `run` label), the watchdog:

1. reads the job's report (at most every `check_every` seconds per job: a small GET, bounded);
2. counts progress on the dispatcher's own clock: a report that changed since it last looked
   (another step, or a new run's first report) restarts the count, and so does the job's launch
   as this dispatcher first saw it. Outside its training steps a job gets
   `queue.stall_grace_seconds` (when set, else the stall timeout): until the trainer reports a
   step (it reports its start before it fetches its checkpoint and data and builds its model, and
   always reports its first step), and after it reports its last (the final checkpoint and
   result). The report of a run the watchdog cancels is cleared, so its retry's start-up is not
   taken for steps; a report of steps an earlier run left otherwise (a crash) is: the stall timeout
   then counts from the launch, as it did before the grace;
3. once no change was seen for `queue.stall_timeout_seconds` (`stall_grace_seconds` outside the
   steps): cancels the job through its engine and finishes it as failed with the reason; the
   queue then runs it again (within
   `queue.max_attempts`), and a stage job resumes from the newest checkpoint in the store.
The trainer's own clock (the report's time) is shown, never trusted for the decision.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from drape.storage.progress import Progress, clear_progress, read_progress
from drape.storage.store import ObjectStore, open_store


@dataclass
class _Seen:
    since: float  # when the dispatcher last saw progress (or first saw the job)
    report: Progress | None = None
    checked: float = float("-inf")


class Watchdog:
    """Finds stalled stage jobs among those a dispatcher watches, cancels and requeues them."""

    def __init__(self, config, store, launcher, dispatcher_id: str, objects: Callable[[], ObjectStore] | None = None):
        self.config, self.store, self.launcher, self.dispatcher_id = config, store, launcher, dispatcher_id
        # stage jobs report only when run apart (through the store); with `paths.shared` they do not
        self.timeout = config.queue.stall_timeout_seconds if config.trains_apart else None
        self.grace = (config.queue.stall_grace_seconds or self.timeout) if self.timeout else None
        self.check_every = min(self.timeout / 4, 60.0) if self.timeout else 0.0
        self._objects = objects or (lambda: open_store(config))
        self._store: ObjectStore | None = None
        self.seen: dict[str, _Seen] = {}

    def check(self, mine: dict[str, str], now: float) -> list[str]:
        """Cancel and finish the stalled jobs of `mine` (job id → handle; ended ones are removed from
        it); the ids of those it ended."""
        if self.timeout is None:
            return []
        self.seen = {job_id: seen for job_id, seen in self.seen.items() if job_id in mine}
        due = [job_id for job_id in sorted(mine) if now - self.seen.setdefault(job_id, _Seen(now)).checked >= self.check_every]
        if not due:
            return []
        ended = []
        for job_id, row in self.store.get_many(due).items():
            run_id = json.loads(row.get("labels") or "{}").get("run")
            if row.get("state") != "running" or not run_id or not row.get("stage"):
                continue
            if self._stalled(job_id, str(run_id), str(row["stage"]), now):
                self._end(job_id, mine.pop(job_id), now)
                clear_progress(self._objects_store(), str(run_id), str(row["stage"]))
                ended.append(job_id)
        return ended

    def _stalled(self, job_id: str, run_id: str, stage: str, now: float) -> bool:
        seen = self.seen[job_id]
        seen.checked = now
        report = read_progress(self._objects_store(), run_id, stage)
        if report is not None and report != seen.report:
            seen.report, seen.since = report, now
        return now - seen.since > self._limit(seen)

    def _objects_store(self) -> ObjectStore:
        if self._store is None:
            self._store = self._objects()
        return self._store

    def _stepping(self, seen: _Seen) -> bool:
        """Between the job's first reported step and its last: the stall timeout's part."""
        return seen.report is not None and 0 < seen.report.total and seen.report.step < seen.report.total

    def _limit(self, seen: _Seen) -> float:
        limit = self.timeout if self._stepping(seen) else self.grace
        assert limit is not None
        return limit

    def _end(self, job_id: str, handle: str, now: float) -> None:
        seen = self.seen.pop(job_id)
        last = seen.report
        at = f"{time.strftime('%H:%M:%S', time.gmtime(last.time))} UTC" if last is not None else ""
        if last is None:
            told = "it never reported its start"
        elif last.total == 0:
            told = f"it reported its start at {at}, and no step since"
        else:
            told = f"its last report: step {last.step}/{last.total} at {at}"
        field = "stall_timeout_seconds" if self._stepping(seen) or self.grace == self.timeout else "stall_grace_seconds"
        reason = (
            f"no progress for {now - seen.since:.0f} s (queue.{field}: {self._limit(seen):g}; {told}): "
            "cancelled as hung, to run again from its last checkpoint"
        )
        self.launcher.cancel(job_id, handle)
        state = self.store.finish(
            job_id,
            exit_code=-1,
            message=reason,
            dispatcher=self.dispatcher_id,
            now=now,
            max_attempts=self.config.queue.max_attempts,
        )
        after = "queued for another attempt" if state == "queued" else "no attempts left: failed"
        print(f"queue: {job_id} {reason}; {after}")

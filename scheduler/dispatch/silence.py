"""A flow waiting on a queued job while no dispatcher runs: said, counted, and bounded by nothing else.

With `queue.dispatch_in_process: false` the flow's task submits its stage job and waits; the
dispatcher (`drape queue dispatch`, a deployment) starts it. When that dispatcher is down the job
stays queued (the queue is durable: it runs once when a dispatcher comes back, and the dispatch
claim is a compare-and-set, so never twice) and the flow would wait in silence. Each dispatcher
notes its cycles in the queue (`LeaseMixin.heartbeat`), so the waiter can tell "no dispatcher"
from "no free GPU": when no dispatcher cycled within `queue.lease_seconds`, it says so on the flow's
log (once, then every `REPEAT_S`), and sets `drape_queue_dispatcher_silent_seconds` (pushed with the
job's run and stage); when a dispatcher is back it says that too and the gauge returns to 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

from drape.ops import metrics
from drape.ops.metrics import push_metrics

REPEAT_S = 300.0


class DispatcherWatch:
    def __init__(self, config, store, job_id: str, clock: Callable[[], float] = time.time):
        self.config, self.store, self.job_id, self.clock = config, store, job_id, clock
        self.silent_since: float | None = None
        self.next_say = 0.0

    def check(self, job: dict) -> None:
        """One look, each time the waiter polls `job` (its row as just read)."""
        now = self.clock()
        seen = self.store.dispatcher_seen() if job["state"] == "queued" else now
        quiet_for = now - max(seen or 0.0, job["submit_s"])
        if job["state"] == "queued" and quiet_for > self.config.queue.lease_seconds:
            if now >= self.next_say:
                last = f"last seen {datetime.fromtimestamp(seen, UTC):%Y-%m-%d %H:%M:%S} UTC" if seen else "none ever seen"
                print(
                    f"queue: {self.job_id} is queued and no dispatcher has cycled for {quiet_for:.0f} s ({last}); "
                    "it stays queued and runs once when a dispatcher starts (drape queue dispatch)"
                )
                self.next_say = now + REPEAT_S
            self.silent_since = self.silent_since or now
            self._export(job, quiet_for)
        elif self.silent_since is not None:
            silence = now - self.silent_since
            print(f"queue: a dispatcher is back after {silence:.0f} s of silence; {self.job_id} is {job['state']}")
            self.silent_since = None
            self._export(job, 0.0)

    def _export(self, job: dict, seconds: float) -> None:
        grouping = {"run": json.loads(job.get("labels") or "{}").get("run", self.job_id), "stage": job.get("stage") or ""}
        metrics.QUEUE_DISPATCHER_SILENT.labels(**grouping).set(seconds)
        push_metrics(self.config, grouping=grouping)

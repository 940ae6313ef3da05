"""Dispatcher leases on running jobs: renewal, and what happens to a job whose lease expired.

A dispatcher renews the leases of its running jobs every cycle (`heartbeat`). When one stops
(killed, its node lost), its jobs' leases expire; any dispatcher then finds them (`stale`) and
either adopts a job its launcher can still see (`adopt`: a local process on its host, a
Kubernetes Job by name), so the job runs once and is reaped when it ends, or returns it to the
queue (`requeue`). Both are compare-and-set on the row as it was read (state, dispatcher and
lease): a job that finished, was renewed or was taken by another dispatcher in between is left
alone, never sent back to `queued`.
"""

from __future__ import annotations

import json
import time

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.engine import Engine

from scheduler.policy.state import requeued_waited
from scheduler.queue.schema import REQUEST_COLUMNS, dispatchers_table, job_request, jobs_table, ran_seconds

FORGET_DISPATCHERS_AFTER_S = 7 * 24 * 3600.0  # a dispatcher not seen for a week leaves the table


class LeaseMixin:
    """The lease half of `JobStore` (which has the engine and frees a job's GPUs in `_release`)."""

    engine: Engine

    def _release(self, connection, job_id: str, dispatcher: str | None, now: float) -> None:
        raise NotImplementedError

    def heartbeat(self, dispatcher: str, lease_seconds: float, now: float | None = None) -> None:
        """Renew the leases of `dispatcher`'s running jobs, and note that it cycled (`dispatcher_seen`)."""
        now = time.time() if now is None else now
        with self.engine.begin() as connection:
            connection.execute(
                update(jobs_table)
                .where(and_(jobs_table.c.dispatcher == dispatcher, jobs_table.c.state == "running"))
                .values(lease_expires_s=now + lease_seconds)
            )
            seen = update(dispatchers_table).where(dispatchers_table.c.id == dispatcher).values(seen_s=now)
            if connection.execute(seen).rowcount == 0:  # its first cycle (ids are per process: nobody races it)
                connection.execute(insert(dispatchers_table).values(id=dispatcher, seen_s=now))
                connection.execute(delete(dispatchers_table).where(dispatchers_table.c.seen_s < now - FORGET_DISPATCHERS_AFTER_S))

    def dispatcher_seen(self) -> float | None:
        """When any dispatcher last cycled (None: none ever did on this database)."""
        with self.engine.connect() as connection:
            return connection.execute(select(func.max(dispatchers_table.c.seen_s))).scalar()

    def stale(self, now: float | None = None) -> list[dict]:
        """Running jobs whose dispatcher's lease expired, as read now (the rows `adopt` and `requeue` check)."""
        now = time.time() if now is None else now
        with self.engine.connect() as connection:
            query = select(jobs_table).where(and_(jobs_table.c.state == "running", jobs_table.c.lease_expires_s < now))
            return [dict(row) for row in connection.execute(query).mappings()]

    @staticmethod
    def _unchanged(job: dict):
        """The row still is what `stale` read: running, same dispatcher, same (expired) lease."""
        dispatcher = jobs_table.c.dispatcher
        return and_(
            jobs_table.c.id == job["id"],
            jobs_table.c.state == "running",
            dispatcher.is_(None) if job["dispatcher"] is None else dispatcher == job["dispatcher"],
            jobs_table.c.lease_expires_s == job["lease_expires_s"],
        )

    def adopt(self, job: dict, dispatcher: str, lease_seconds: float, now: float | None = None) -> bool:
        """Take over a stale running job (its process lives on); False if the row changed since."""
        now = time.time() if now is None else now
        with self.engine.begin() as connection:
            done = connection.execute(
                update(jobs_table)
                .where(self._unchanged(job))
                .values(
                    dispatcher=dispatcher,
                    lease_expires_s=now + lease_seconds,
                    message=f"adopted by {dispatcher} from {job['dispatcher']}, whose lease expired",
                )
            )
            return done.rowcount == 1

    @staticmethod
    def requeued(message: str) -> dict:
        """The column values of a job sent back to the queue."""
        return {
            "state": "queued",
            "dispatcher": None,
            "lease_expires_s": None,
            "start_s": None,
            "assigned": None,
            "handle": None,
            "message": message,
        }

    def preempt(self, job_id: str, by: str, now: float | None = None) -> dict | None:
        """Return running job `job_id` to the queue for `by` (a starving multi-GPU job, or the job
        itself when it moves off a crowded GPU), freeing its GPUs; it resumes from its last
        checkpoint when it starts again. Counts the preemption in its labels (`preempted`) and does
        not spend one of its attempts. Returns the row as it was (its dispatcher and handle: whoever
        can stop its launch does), or None if it is no longer running."""
        now = time.time() if now is None else now
        with self.engine.begin() as connection:
            job = connection.execute(select(jobs_table).where(jobs_table.c.id == job_id)).mappings().first()
            if job is None or job["state"] != "running":
                return None
            labels = json.loads(job["labels"] or "{}")
            labels["preempted"] = str(int(labels.get("preempted", 0) or 0) + 1)
            # what it waited before this start, for a gang bound that counts the whole wait
            request = job_request(tuple(job[name] for name in REQUEST_COLUMNS))
            labels["waited_s"] = f"{requeued_waited(request, job['start_s'] or now):.3f}"
            labels["requeued_s"] = f"{now:.3f}"  # aging counts from here (`scheduler/policy/state.py` `queued_at`)
            # what it ran before this stop, so the queue's history (`drape queue trace`) keeps the job's whole run
            labels["ran_s"] = f"{ran_seconds(labels) + max(now - (job['start_s'] or now), 0.0):.3f}"
            why = "moved off a crowded GPU to an idle one" if by == job_id else f"preempted for {by}"
            message = f"{why}; queued again, resumes from its last checkpoint"
            done = connection.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.state == "running", jobs_table.c.attempts == job["attempts"])
                .values(**self.requeued(message), labels=json.dumps(labels), attempts=max(job["attempts"] - 1, 0))
            )
            if done.rowcount != 1:
                return None
            self._release(connection, job_id, None, now)
        return dict(job)

    def requeue(self, job: dict, now: float | None = None, message: str = "") -> bool:
        """Send a stale job no launcher can see back to the queue, freeing its GPUs; False if the row changed."""
        now = time.time() if now is None else now
        message = message or f"requeued: its dispatcher {job['dispatcher']}'s lease expired and no dispatcher sees its process"
        with self.engine.begin() as connection:
            done = connection.execute(update(jobs_table).where(self._unchanged(job)).values(**self.requeued(message)))
            if done.rowcount != 1:
                return False
            self._release(connection, job["id"], None, now)
            return True

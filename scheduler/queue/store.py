"""The durable queue: jobs, the GPU allocation ledger, dispatcher leases and measured profiles.

SQLite by default, PostgreSQL by URL (SQLAlchemy Core). A claim is one transaction that
re-reads the GPUs' allocations and writes the job's allocations only if they still fit, so
several dispatchers never allocate the same GPU memory twice: SQLite serialises writers with
``BEGIN IMMEDIATE``, PostgreSQL locks the GPU rows (``SELECT … FOR UPDATE``). Every claim and
release is appended to ``allocation_log``, which the tests replay to prove it.

A running job belongs to the dispatcher that claimed it for `lease_seconds`; dispatchers renew
their leases every cycle. A job whose lease expired is adopted by a dispatcher whose launcher can
still see it, or returned to the queue, each a compare-and-set (`scheduler/queue/leases.py`).
"""

from __future__ import annotations

import json
import time
import uuid

from sqlalchemy import (
    delete,
    func,
    insert,
    select,
    update,
)

from scheduler.policy import GpuState, JobRequest, Placement, RunningJob
from scheduler.queue.bounds import check_spec
from scheduler.queue.claims import locked_ledger, shared_since, versions_of
from scheduler.queue.leases import LeaseMixin
from scheduler.queue.once import live_twin
from scheduler.queue.schema import (
    REQUEST_COLUMNS,
    STATES,
    JobSpec,
    QueueError,
    allocation_log,
    allocations_table,
    execute_many,
    gpus_table,
    job_request,
    jobs_table,
    measurements_table,
    open_engine,
    running_job,
)


class _Converted:
    """A row → object conversion that keeps, from one call to the next, the objects of the rows
    that came back unchanged: each dispatch cycle reads every queued and running job, and most
    are the same rows as in the last cycle. The conversion must depend on the row alone."""

    def __init__(self, convert):
        self.convert, self.last = convert, {}

    def __call__(self, rows) -> list:
        last, kept = self.last, {}
        for row in rows:
            found = last.get(row)
            kept[row] = found if found is not None else self.convert(row)
        self.last = kept
        return list(kept.values())


def _assigned(placement: Placement) -> str:
    """The `assigned` column of a claimed job: its GPUs, as JSON."""
    return json.dumps(list(placement.gpus))


def _job_labels(row) -> tuple[str, str, str, str, list[str], float]:
    job_id, kind, stage, labels, assigned, mem_gib = row
    return job_id, kind, stage or "", json.loads(labels or "{}").get("run", ""), json.loads(assigned or "[]"), mem_gib


class JobStore(LeaseMixin):
    """The queue's tables behind one SQLAlchemy engine (see the module docstring)."""

    def __init__(self, url: str):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.engine = open_engine(url)
        self._pending, self._running = _Converted(job_request), _Converted(running_job)
        self._labelled = _Converted(_job_labels)

    # --- submitting and reading ----------------------------------------------------------
    def submit(self, spec: JobSpec, now: float | None = None) -> str:
        check_spec(spec)
        job_id = spec.id or f"{spec.kind}-{uuid.uuid4().hex[:10]}"
        with self.engine.begin() as connection:  # a run's stage job already live: its id, nothing inserted (once.py)
            if (twin := live_twin(connection, spec.kind, spec.stage, spec.labels, self.is_sqlite)) is not None:
                print(f"queue: {spec.stage} of run {spec.labels['run']} is already job {twin}: not queued twice")
                return twin
            connection.execute(
                insert(jobs_table).values(
                    id=job_id,
                    kind=spec.kind,
                    stage=spec.stage,
                    shape=spec.shape or spec.kind,
                    priority=spec.priority,
                    gpus=spec.gpus,
                    mem_gib=spec.mem_gib,
                    duration_s=spec.duration_s,
                    command=json.dumps(spec.command),
                    env=json.dumps(spec.env),
                    labels=json.dumps(spec.stored_labels()),
                    state="queued",
                    submit_s=time.time() if now is None else now,
                    attempts=0,
                )
            )
        return job_id

    def get(self, job_id: str) -> dict:
        with self.engine.connect() as connection:
            row = connection.execute(select(jobs_table).where(jobs_table.c.id == job_id)).mappings().first()
        if row is None:
            raise QueueError(f"no job {job_id!r} in the queue at {self.url.split('@')[-1]}")
        return dict(row)

    def states(self, job_ids: list[str]) -> dict[str, str]:
        """job id → state for many jobs in one query."""
        found: dict[str, str] = {}
        with self.engine.connect() as connection:
            for start in range(0, len(job_ids), 500):
                chunk = job_ids[start : start + 500]
                found.update(
                    connection.execute(select(jobs_table.c.id, jobs_table.c.state).where(jobs_table.c.id.in_(chunk))).all()
                )
        return found

    def jobs(self, states: tuple[str, ...] | None = None, limit: int | None = None) -> list[dict]:
        query = select(jobs_table).order_by(jobs_table.c.submit_s)
        if states:
            query = query.where(jobs_table.c.state.in_(states))
        if limit:
            query = query.limit(limit)
        with self.engine.connect() as connection:
            return [dict(row) for row in connection.execute(query).mappings()]

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as connection:
            rows = connection.execute(select(jobs_table.c.state, func.count()).group_by(jobs_table.c.state)).all()
        return {state: 0 for state in STATES} | {state: count for state, count in rows}

    def pending(self) -> list[JobRequest]:
        """Queued jobs as the policy sees them; the GPU models a job allows travel in its labels."""
        columns = [jobs_table.c[name] for name in REQUEST_COLUMNS]
        with self.engine.connect() as connection:
            rows = connection.execute(select(*columns).where(jobs_table.c.state == "queued")).all()
        return self._pending(rows)

    def running(self) -> list[RunningJob]:
        """Running jobs as the policy sees them (what it may preempt: shareable single-GPU jobs)."""
        names = ("id", "assigned", "mem_gib", "start_s", "duration_s", "priority", "labels", "submit_s")
        with self.engine.connect() as connection:
            rows = connection.execute(select(*[jobs_table.c[n] for n in names]).where(jobs_table.c.state == "running")).all()
        return self._running(rows)

    def running_labels(self) -> list[tuple[str, str, str, str, list[str], float]]:
        """(job id, kind, stage, run, GPUs, GiB per GPU) of running jobs: what the join dashboard shows."""
        columns = [jobs_table.c[name] for name in ("id", "kind", "stage", "labels", "assigned", "mem_gib")]
        with self.engine.connect() as connection:
            rows = connection.execute(select(*columns).where(jobs_table.c.state == "running")).all()
        return self._labelled(rows)

    # --- inventory and ledger -------------------------------------------------------------
    def register_gpus(self, gpus: list[GpuState]) -> None:
        """Add GPUs the inventory does not know yet. Dispatchers starting together may register the
        same GPUs at once: a row another one inserted first is skipped (ON CONFLICT DO NOTHING),
        not an error."""
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert as upsert
        else:
            from sqlalchemy.dialects.postgresql import insert as upsert  # type: ignore[assignment]
        with self.engine.begin() as connection:
            known = {row[0] for row in connection.execute(select(gpus_table.c.uuid))}
            new = [
                {"uuid": g.uuid, "node": g.node, "model": g.model, "total_gib": g.total_gib} for g in gpus if g.uuid not in known
            ]
            if new:
                connection.execute(upsert(gpus_table).on_conflict_do_nothing(index_elements=["uuid"]), new)

    def inventory(self) -> list[GpuState]:
        with self.engine.connect() as connection:
            return [GpuState(r.uuid, r.node, r.model, r.total_gib) for r in connection.execute(select(gpus_table))]

    def ledger(self) -> dict[str, tuple[float, int]]:
        """GPU uuid → (allocated GiB, jobs) from the allocations of running jobs."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(allocations_table.c.gpu_uuid, func.sum(allocations_table.c.mem_gib), func.count()).group_by(
                    allocations_table.c.gpu_uuid
                )
            ).all()
        return {uuid: (float(total), int(count)) for uuid, total, count in rows}

    # --- claims, leases, completion ---------------------------------------------------------
    def claim(
        self, placement: Placement, dispatcher: str, lease_seconds: float, max_jobs_per_gpu: int, now: float | None = None
    ) -> bool:
        """Allocate the placement's GPUs to its job if the job is still queued and they still fit."""
        return bool(self.claim_many([placement], dispatcher, lease_seconds, max_jobs_per_gpu, now))

    def claim_many(
        self, placements: list[Placement], dispatcher: str, lease_seconds: float, max_jobs_per_gpu: int, now: float | None = None
    ) -> list[Placement]:
        """Claim placements in one transaction, each checked against the ledger as it stands (including
        the claims before it); returns those that were granted."""
        return [placement for placement, _ in self.claim_rows(placements, dispatcher, lease_seconds, max_jobs_per_gpu, now)]

    def claim_rows(
        self, placements: list[Placement], dispatcher: str, lease_seconds: float, max_jobs_per_gpu: int, now: float | None = None
    ) -> list[tuple[Placement, dict]]:
        """`claim_many`, each granted placement with its job's row as the claim left it (what a
        launcher reads; the claim read the rows anyway, under its locks)."""
        now = time.time() if now is None else now
        if not placements:
            return []
        granted, versions = [], {}
        with self.engine.begin() as connection:
            ledger = locked_ledger(connection, placements, self.is_sqlite)
            for placement in placements:
                if ledger.admits(placement, max_jobs_per_gpu):
                    ledger.take(placement)
                    granted.append(placement)
            if granted:
                self._record_claims(connection, granted, dispatcher, lease_seconds, now)
                versions = versions_of(connection, [p.job_id for p in granted])  # the trigger's, on the state change
        claimed = {"state": "running", "start_s": now, "dispatcher": dispatcher, "lease_expires_s": now + lease_seconds}
        return [(p, {**ledger.rows[p.job_id], **claimed, **ledger.claimed(p, versions[p.job_id])}) for p in granted]

    @staticmethod
    def _record_claims(connection, granted: list[Placement], dispatcher: str, lease_seconds: float, now: float) -> None:
        rows = [(p.job_id, g, p.mem_gib) for p in granted for g in p.gpus]
        execute_many(connection, "INSERT INTO allocations (job_id, gpu_uuid, mem_gib) VALUES (?, ?, ?)", rows)
        execute_many(
            connection,
            "INSERT INTO allocation_log (job_id, gpu_uuid, mem_gib, event, dispatcher, at_s) VALUES (?, ?, ?, 'claim', ?, ?)",
            [(*row, dispatcher, now) for row in rows],
        )
        execute_many(
            connection,
            "UPDATE jobs SET state = 'running', start_s = ?, dispatcher = ?, lease_expires_s = ?, assigned = ?,"
            " attempts = attempts + 1 WHERE id = ?",
            [(now, dispatcher, now + lease_seconds, _assigned(p), p.job_id) for p in sorted(granted, key=lambda p: p.job_id)],
        )

    def set_handles(self, handles: dict[str, str]) -> None:
        """Record launched jobs' handles. Rows are updated in key order, the order a rival's claim
        locks them in: in launch order, two dispatchers deadlocked on PostgreSQL (one held a row the
        other's claim had locked first, each waiting on the other)."""
        if not handles:
            return
        with self.engine.begin() as connection:
            execute_many(
                connection, "UPDATE jobs SET handle = ? WHERE id = ?", [(handles[job_id], job_id) for job_id in sorted(handles)]
            )

    def get_many(self, job_ids: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        with self.engine.connect() as connection:
            for start in range(0, len(job_ids), 500):
                query = select(jobs_table).where(jobs_table.c.id.in_(job_ids[start : start + 500]))
                found.update((row["id"], dict(row)) for row in connection.execute(query).mappings())
        return found

    def _release(self, connection, job_id: str, dispatcher: str | None, now: float) -> None:
        rows = connection.execute(select(allocations_table).where(allocations_table.c.job_id == job_id)).mappings().all()
        if rows:
            connection.execute(
                insert(allocation_log),
                [
                    {
                        "job_id": job_id,
                        "gpu_uuid": r["gpu_uuid"],
                        "mem_gib": r["mem_gib"],
                        "event": "release",
                        "dispatcher": dispatcher,
                        "at_s": now,
                    }
                    for r in rows
                ],
            )
        connection.execute(delete(allocations_table).where(allocations_table.c.job_id == job_id))

    def finish(
        self,
        job_id: str,
        *,
        exit_code: int | None,
        message: str = "",
        peak_gib: float | None = None,
        dispatcher: str | None = None,
        now: float | None = None,
        max_attempts: int = 1,
    ) -> str | None:
        """Record the end of a running job, free its GPUs, and learn its measured profile; a failed
        job with attempts left (`max_attempts`) goes back to the queue. Returns the new state."""
        now = time.time() if now is None else now
        with self.engine.begin() as connection:
            job = connection.execute(select(jobs_table).where(jobs_table.c.id == job_id)).mappings().first()
            if job is None or job["state"] != "running":
                return None
            shared = shared_since(connection, job_id, job["start_s"] or now)
            self._release(connection, job_id, dispatcher, now)
            if exit_code != 0 and job["attempts"] < max_attempts:
                note = f"attempt {job['attempts']} of {max_attempts} failed ({message[-1500:]}); queued again"
                connection.execute(update(jobs_table).where(jobs_table.c.id == job_id).values(**self.requeued(note)))
                return "queued"
            state = "succeeded" if exit_code == 0 else "failed"
            # how its run was measured, for a trace of the queue (`scheduler/sim/export.py`)
            ran = {"measured": "shared" if shared else "alone", **({"peak_gib": f"{peak_gib:.3f}"} if peak_gib else {})}
            connection.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id)
                .values(
                    state=state,
                    finish_s=now,
                    exit_code=exit_code,
                    message=message[-2000:],
                    lease_expires_s=None,
                    labels=json.dumps({**json.loads(job["labels"] or "{}"), **ran}),
                )
            )
            if state == "succeeded" and peak_gib is not None:
                duration = now - (job["start_s"] or now)
                connection.execute(
                    insert(measurements_table).values(
                        shape=job["shape"], peak_gib=peak_gib, duration_s=duration, recorded_s=now, shared=int(shared)
                    )
                )
        return state

    def fail_queued(self, job_id: str, message: str, now: float | None = None) -> bool:
        """End a still-queued job as failed with `message` (one no GPU can hold); False if it moved on."""
        now = time.time() if now is None else now
        with self.engine.begin() as connection:
            done = connection.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id, jobs_table.c.state == "queued")
                .values(state="failed", finish_s=now, exit_code=None, message=message[-2000:])
            )
        return bool(done.rowcount)

    def cancel(self, job_id: str, now: float | None = None) -> dict:
        """Cancel a queued job, or mark a running one for its dispatcher to stop; returns the job."""
        now = time.time() if now is None else now
        with self.engine.begin() as connection:
            job = connection.execute(select(jobs_table).where(jobs_table.c.id == job_id)).mappings().first()
            if job is None:
                raise QueueError(f"no job {job_id!r} to cancel")
            if job["state"] in ("queued", "running"):
                self._release(connection, job_id, None, now)
                connection.execute(
                    update(jobs_table)
                    .where(jobs_table.c.id == job_id)
                    .values(state="cancelled", finish_s=now, message="cancelled by request")
                )
        return self.get(job_id)

    def scrub(self, job_id: str, note: str) -> None:
        """Overwrite a job's inputs (command, environment, labels, message) with `note`; its kind,
        resources and times stay, for accounting."""
        with self.engine.begin() as connection:
            connection.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id)
                .values(command=json.dumps([note]), env="{}", labels="{}", message=note)
            )

    def measurements(self, shape: str, limit: int = 50) -> list[tuple[float, float, bool]]:
        """The newest runs of `shape`: (peak GiB, seconds, whether it shared a GPU while it ran)."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(measurements_table.c.peak_gib, measurements_table.c.duration_s, measurements_table.c.shared)
                .where(measurements_table.c.shape == shape)
                .order_by(measurements_table.c.id.desc())
                .limit(limit)
            ).all()
        return [(float(p), float(d), bool(s)) for p, d, s in rows]

    def allocation_events(self, job_ids: list[str] | None = None) -> list[dict]:
        """The allocation log in order (only `job_ids`' rows, when given)."""
        query = select(allocation_log).order_by(allocation_log.c.seq)
        if job_ids is not None:
            query = query.where(allocation_log.c.job_id.in_(job_ids))
        with self.engine.connect() as connection:
            return [dict(r) for r in connection.execute(query).mappings()]

"""A stage job of a run is queued at most once: the queue's own guard against a double start.

The run lease (drape/storage/lease.py) keeps a second flow of a run from getting this far; this is
the queue's half, for whatever else submits a stage's job (an operator, a flow on a store the lease
cannot see). Before a stage-training or fine-tune job carrying a `run` label is inserted, the
transaction looks for a live (queued or running) job of the same kind, stage and run and, when it
finds one, inserts nothing and hands back that job's id: the second submitter waits on the first
job. SQLite serialises the check and the insert (drape's connections begin IMMEDIATE); PostgreSQL
takes a transaction-scoped advisory lock on the (kind, stage, run) triple first.
"""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import and_, select, text

from drape import JobKind
from scheduler.queue.schema import jobs_table

STAGE_KINDS = (JobKind.STAGE_TRAINING.value, JobKind.FINETUNE.value)


def live_twin(connection, kind: str, stage: str | None, labels: dict[str, str], is_sqlite: bool) -> str | None:
    """The id of the live job of the same kind, stage and run as the one about to be inserted, if any
    (None for jobs that are not a run's stage training)."""
    run = labels.get("run")
    if kind not in STAGE_KINDS or not stage or not run:
        return None
    if not is_sqlite:  # held until the transaction ends: a concurrent submit of the triple waits here
        digest = hashlib.sha256(f"{kind}\0{stage}\0{run}".encode()).digest()
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": int.from_bytes(digest[:8], "big", signed=True)})
    query = select(jobs_table.c.id, jobs_table.c.labels).where(
        and_(jobs_table.c.kind == kind, jobs_table.c.stage == stage, jobs_table.c.state.in_(("queued", "running")))
    )
    for job_id, stored in connection.execute(query):
        if json.loads(stored or "{}").get("run") == run:
            return job_id
    return None


def live_job(store, kind: str, stage: str, run_id: str) -> dict | None:
    """The queued or running job of `run_id`'s `stage` (a flow that died left it behind), if any."""
    return _newest(store, kind, stage, run_id, ("queued", "running"))


def succeeded_job(store, kind: str, stage: str, run_id: str) -> dict | None:
    """The newest job of `run_id`'s `stage` that succeeded (its retry may have ended while the run's
    flow was down: a resumed run takes its result rather than train the stage again), if any."""
    return _newest(store, kind, stage, run_id, ("succeeded",))


def _newest(store, kind: str, stage: str, run_id: str, states: tuple[str, ...]) -> dict | None:
    found = None
    for job in store.jobs(states=states):  # oldest submit first
        if job["kind"] == kind and job["stage"] == stage and json.loads(job["labels"] or "{}").get("run") == run_id:
            found = job
    return found

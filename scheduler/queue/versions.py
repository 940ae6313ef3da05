"""Which jobs changed since a dispatcher's last cycle: `jobs.version`, kept by a trigger.

Every insert of a job and every change of its state sets the row's `version` (a trigger, so that
no writer can forget it: the dispatcher's claims, a CLI's cancel, a rival dispatcher's requeue).
A dispatcher keeps a cursor and reads only the rows whose version is at or past it
(`changed_jobs`, on the `jobs_version` index, with a LIMIT):

- SQLite serialises writers, so the version is a sequence, the largest one plus one; the cursor
  is the next one, read before the changes (rows changed meanwhile are read again next time);
- PostgreSQL commits transactions in any order, so a sequence number taken by a transaction that
  commits late would fall behind a cursor that already passed it. The version is the writing
  transaction's id instead, and the cursor the oldest transaction still running when it was read
  (`pg_snapshot_xmin`): every transaction older than that had ended, so its rows were seen, and
  the rows of newer ones are read again until the cursor passes them. A long transaction
  elsewhere holds the cursor back, and the reads grow until the LIMIT sends the dispatcher back
  to a full read.

Reading a row again is harmless: the dispatcher sets its planner to each row's state.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError

SQLITE_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS jobs_version_insert AFTER INSERT ON jobs BEGIN
    UPDATE jobs SET version = (SELECT COALESCE(MAX(version), 0) + 1 FROM jobs) WHERE id = NEW.id; END""",
    """CREATE TRIGGER IF NOT EXISTS jobs_version_state AFTER UPDATE OF state ON jobs WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE jobs SET version = (SELECT COALESCE(MAX(version), 0) + 1 FROM jobs) WHERE id = NEW.id; END""",
)
POSTGRES_FUNCTION = """CREATE OR REPLACE FUNCTION drape_jobs_version() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
        NEW.version := pg_current_xact_id()::text::bigint;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql"""
POSTGRES_TRIGGER = (
    "CREATE TRIGGER jobs_version BEFORE INSERT OR UPDATE OF state ON jobs FOR EACH ROW EXECUTE FUNCTION drape_jobs_version()"
)
CHANGE_COLUMNS = ("id", "state", "priority", "submit_s", "gpus", "mem_gib", "duration_s", "labels", "assigned", "start_s")


def install_version_triggers(engine: Engine) -> None:
    """The triggers that keep `jobs.version` (idempotent; safe when another process installs them at once)."""
    if engine.dialect.name == "sqlite":
        with engine.begin() as connection:
            for statement in SQLITE_TRIGGERS:
                connection.execute(text(statement))
        return
    if _has_trigger(engine):
        return
    try:
        with engine.begin() as connection:
            connection.execute(text(POSTGRES_FUNCTION))
            connection.execute(text(POSTGRES_TRIGGER))
    except DatabaseError:  # another process installed them first
        if not _has_trigger(engine):
            raise


def _has_trigger(engine: Engine) -> bool:
    with engine.connect() as connection:
        found = connection.execute(text("SELECT 1 FROM pg_trigger WHERE tgname = 'jobs_version' AND NOT tgisinternal"))
        return found.first() is not None


def change_cursor(engine: Engine) -> int:
    """Where the next read of changes starts: rows changed from now on have a version at or past it."""
    if engine.dialect.name == "sqlite":
        query = "SELECT COALESCE(MAX(version), 0) + 1 FROM jobs"
    else:
        query = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    with engine.connect() as connection:
        return int(connection.execute(text(query)).scalar_one())


def changed_jobs(engine: Engine, cursor: int, limit: int) -> list[tuple] | None:
    """The rows (`CHANGE_COLUMNS`) of the jobs whose state changed at or past `cursor`, oldest
    change first; None when more than `limit` did (read the queue whole instead)."""
    query = text(
        f"SELECT {', '.join(CHANGE_COLUMNS)} FROM jobs WHERE version >= :cursor ORDER BY version LIMIT :limit"
    ).bindparams(cursor=cursor, limit=limit + 1)
    with engine.connect() as connection:
        rows = [tuple(row) for row in connection.execute(query)]
    return None if len(rows) > limit else rows


def live_jobs(engine: Engine, state: str) -> list[tuple]:
    """The rows (`CHANGE_COLUMNS`) of every job in `state` (queued or running): a full read."""
    query = text(f"SELECT {', '.join(CHANGE_COLUMNS)} FROM jobs WHERE state = :state").bindparams(state=state)
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(query)]

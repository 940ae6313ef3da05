"""A full disk under the queue database, said as such (issue 68).

SQLite answers a full disk with "database or disk is full" and PostgreSQL with SQLSTATE 53100
("could not extend file"); either way the transaction is rolled back and nothing half-written
stays. `name_full_disks` turns that error, wherever a queue call meets it, into a QueueError that
names the database, the bytes it needs at least (one page) and those free, and says that the queue
is whole and resumes once space is freed.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine

from drape import format_bytes
from drape.storage.durable import free_bytes

SQLITE_FULL = "database or disk is full"
POSTGRES_DISK_FULL = "53100"


def name_full_disks(engine: Engine, shown: str, error_type: type[Exception]) -> None:
    """On `engine`, a full disk raises `error_type` naming `shown` (the URL without its password)."""

    @event.listens_for(engine, "handle_error")
    def _full(context) -> None:
        original = context.original_exception
        if SQLITE_FULL in str(original):
            path = shown.split("///", 1)[-1]
            raise error_type(
                f"queue database {path}: disk full (it needs at least a {format_bytes(4096)} page more, "
                f"{format_bytes(free_bytes(Path(path).parent))} free); the transaction was rolled back and the queue "
                "is whole: free space and run again"
            ) from None
        if getattr(original, "sqlstate", None) == POSTGRES_DISK_FULL or getattr(original, "pgcode", None) == POSTGRES_DISK_FULL:
            raise error_type(
                f"queue database {shown}: the server's disk is full (SQLSTATE {POSTGRES_DISK_FULL}); the transaction "
                "was rolled back and the queue is whole: free space on the database server and run again"
            ) from None

"""The queue's database restarting under a waiting flow (issue 68).

A PostgreSQL restart or failover refuses connections for a while and ends the sessions it had
("terminating connection due to administrator command"); SQLAlchemy's pre-ping then replaces the
pooled connections once it is back. `patiently` runs a queue call again while the database is
unreachable, within `queue.max_wait_seconds` (`drape.ops.outage`): the outage is logged naming the
database (never its password) and counted, and one longer than the budget is a QueueError.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from drape.ops import metrics
from drape.ops.outage import refused_or_dropped, within_budget
from scheduler.queue.schema import QueueError

T = TypeVar("T")
RESTARTING = (
    "terminating connection due to administrator command",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "connection failed",
)


def unreachable(error: BaseException) -> bool:
    """True for an error that says the queue's database is not there right now (refused, its
    sessions ended by a shutdown, starting up), not for an error in what was asked of it."""
    if isinstance(error, QueueError) and error.__cause__ is not None:  # open_engine's, met at a store's start
        error = error.__cause__
    if not isinstance(error, (OperationalError, DBAPIError)):
        return False
    return (
        bool(getattr(error, "connection_invalidated", False))
        or refused_or_dropped(error)
        or any(words in str(error).lower() for words in RESTARTING)
    )


def shown_url(url: str) -> str:
    """The queue's URL as an error or log line may show it: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def patiently(call: Callable[[], T], url: str, max_wait: float) -> T:
    """`call()`, run again while the queue's database at `url` is unreachable, for `max_wait` seconds."""
    return within_budget(
        call,
        service="queue_database",
        shown=shown_url(url),
        budget=max_wait,
        field="queue.max_wait_seconds",
        is_transient=unreachable,
        error_type=QueueError,
    )


class DatabaseWatch:
    """What a dispatcher's loop says about the queue's database between its cycles: an error that
    says it is unreachable as a QueueError naming it, and when it answers again, after how long."""

    def __init__(self, url: str):
        self.shown = f"the queue database {shown_url(url)}"
        self.down_since: float | None = None

    def failed(self, error: Exception) -> Exception:
        if not unreachable(error):
            return error
        self.down_since = time.monotonic() if self.down_since is None else self.down_since
        return QueueError(f"{self.shown} unreachable: {str(error).splitlines()[0][:300]}")

    def answered(self, who: str) -> None:
        if self.down_since is not None:
            back, self.down_since = time.monotonic() - self.down_since, None
            metrics.SERVICE_OUTAGES.labels(service="queue_database", outcome="recovered").inc()
            print(f"{who}: {self.shown} answered again after {back:.1f} s")


def submit_patiently(store, spec, max_wait: float) -> str:
    """`store.submit(spec)` through an outage, never twice: the job's id is chosen before the first
    try, so a try whose insert was committed before the connection dropped is found by its id."""
    import dataclasses
    import uuid

    from sqlalchemy.exc import IntegrityError

    spec = spec if spec.id else dataclasses.replace(spec, id=f"{spec.kind}-{uuid.uuid4().hex[:10]}")
    tries: list[int] = []

    def submit() -> str:
        tries.append(1)
        try:
            return store.submit(spec)
        except IntegrityError:
            if len(tries) > 1 and store.get(spec.id)["command"] == json.dumps(spec.command):
                return spec.id  # the try before landed
            raise

    return patiently(submit, store.url, max_wait)

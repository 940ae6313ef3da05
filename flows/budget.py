"""Prefect's client within one wait budget, `orchestration.max_wait_seconds` (issue 68).

Prefect's defaults wait 60 s per request (PREFECT_API_REQUEST_TIMEOUT) and retry 5 times with
backoff 2, 4, … 32 s and 20% jitter (PREFECT_CLIENT_MAX_RETRIES, PREFECT_CLIENT_RETRY_JITTER_FACTOR):
an API that accepts TCP and never answers held a flow's start 428.6 s before "Failed to reach API".
`client_budget` sets the timeout and retries that fit the budget together (the environment's own
values win) and turns a Prefect API that did not answer into a PrefectUnavailable naming its URL,
never its credentials. The retries that remain are what carries a run through a server restart once
it has connected (Prefect retries a refused connection only after a first success).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from drape.secrets import redact

JITTER = 0.2  # PREFECT_CLIENT_RETRY_JITTER_FACTOR's default: a wait is at most 1.2 × its nominal 2**n s
SHORTEST_TIMEOUT_SECONDS = 5  # fewer retries rather than requests cut shorter than this
BOUNDS = ("PREFECT_API_REQUEST_TIMEOUT", "PREFECT_CLIENT_MAX_RETRIES")


class PrefectUnavailable(RuntimeError):
    """The Prefect API did not answer within `orchestration.max_wait_seconds`."""


def backoff_seconds(retries: int) -> float:
    """The longest Prefect's client sleeps between `retries` + 1 attempts: 2**n s each, jitter included."""
    return sum(2**attempt for attempt in range(1, retries + 1)) * (1 + JITTER)


def prefect_bounds(max_wait: float) -> dict[str, str]:
    """PREFECT_API_REQUEST_TIMEOUT and PREFECT_CLIENT_MAX_RETRIES whose attempts and backoff fit
    `max_wait` seconds together: the most retries (up to 6) that leave each attempt 5 s or more (3 at 60 s, 5 at 120 s)."""
    for retries in (6, 5, 4, 3, 2, 1):
        timeout = int((max_wait - backoff_seconds(retries)) // (retries + 1))
        if timeout >= SHORTEST_TIMEOUT_SECONDS:
            return {"PREFECT_API_REQUEST_TIMEOUT": str(timeout), "PREFECT_CLIENT_MAX_RETRIES": str(retries)}
    return {"PREFECT_API_REQUEST_TIMEOUT": str(max(1, int(max_wait))), "PREFECT_CLIENT_MAX_RETRIES": "0"}


@contextmanager
def client_budget(max_wait: float) -> Iterator[None]:
    """Prefect's client inside `max_wait` seconds a request (see the module docstring)."""
    import httpx
    from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    settings = dict(zip(BOUNDS, (PREFECT_API_REQUEST_TIMEOUT, PREFECT_CLIENT_MAX_RETRIES), strict=True))
    updates = {settings[name]: value for name, value in prefect_bounds(max_wait).items() if name not in os.environ}
    with temporary_settings(updates=updates), _retries_said(max_wait) as said, _events_reconnect(max_wait):
        api = said.api = redact(PREFECT_API_URL.value() or "Prefect's own temporary server")
        try:
            yield
        except (RuntimeError, httpx.TransportError) as error:
            if not _unanswered(error):
                raise
            raise PrefectUnavailable(
                f"the Prefect API at {api} did not answer within orchestration.max_wait_seconds {max_wait:g} s "
                f"({type(error).__name__}: {redact(str(error).splitlines()[0] if str(error) else '')[:200]}); check "
                "PREFECT_API_URL and the server, then run again"
            ) from None


class _RetrySaid(logging.Filter):
    """Prefect's client says each retry at DEBUG; the operator sees them as warnings that name the
    API and the budget (a server restarting mid-run), and none of the client's other debug lines."""

    def __init__(self, max_wait: float, shown_below: int):
        super().__init__()
        self.max_wait, self.shown_below, self.api = max_wait, shown_below, ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.shown_below:
            return True
        message = record.getMessage()
        if "Another attempt will be made" not in message:
            return False
        cause = f" ({record.exc_info[1].__class__.__name__})" if record.exc_info and record.exc_info[1] else ""
        record.msg, record.args, record.exc_info, record.exc_text = (
            f"the Prefect API at {self.api} did not answer{cause}; waiting, within orchestration.max_wait_seconds "
            f"{self.max_wait:g} s: {message}",
            None,
            None,
            None,
        )
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


@contextmanager
def _retries_said(max_wait: float) -> Iterator[_RetrySaid]:
    client_log = logging.getLogger("prefect.client")
    level = client_log.level
    said = _RetrySaid(max_wait, client_log.getEffectiveLevel())
    client_log.addFilter(said)
    client_log.setLevel(logging.DEBUG)
    try:
        yield said
    finally:
        client_log.removeFilter(said)
        client_log.setLevel(level)


@contextmanager
def _events_reconnect(max_wait: float) -> Iterator[None]:
    """Task runs reach a Prefect server as events over a websocket, whose client reconnects 10 times,
    1 s apart after the third (about 8 s), then drops every event it holds: a server restart of 12.6 s
    lost the records of the tasks that ended meanwhile. Against a server of one's own (not Cloud, not
    an ephemeral one), it reconnects for as long as the API client's retries wait out (`prefect_bounds`)."""
    from prefect.events.clients import PrefectEventsClient
    from prefect.events.worker import EventsWorker, emit_events_to_cloud, should_emit_events_to_running_server

    if emit_events_to_cloud() or not should_emit_events_to_running_server():
        yield
        return
    retries = int(os.environ.get("PREFECT_CLIENT_MAX_RETRIES") or prefect_bounds(max_wait)["PREFECT_CLIENT_MAX_RETRIES"])
    EventsWorker.set_client_override(PrefectEventsClient, reconnection_attempts=3 + int(backoff_seconds(retries)))
    try:
        yield
    finally:
        EventsWorker.set_client_override(None)


def _unanswered(error: BaseException) -> bool:
    """True for the Prefect client's own "no answer": a transport error, or its RuntimeError over one."""
    import httpx

    if isinstance(error, httpx.TransportError):
        return True
    return str(error).startswith("Failed to reach API at") or isinstance(error.__cause__, httpx.TransportError)

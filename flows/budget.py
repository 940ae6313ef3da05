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
    `max_wait` seconds together: the most retries (up to 3) that leave each attempt 5 s or more."""
    for retries in (3, 2, 1):
        timeout = int((max_wait - backoff_seconds(retries)) // (retries + 1))
        if timeout >= SHORTEST_TIMEOUT_SECONDS:
            return {"PREFECT_API_REQUEST_TIMEOUT": str(timeout), "PREFECT_CLIENT_MAX_RETRIES": str(retries)}
    return {"PREFECT_API_REQUEST_TIMEOUT": str(max(1, int(max_wait))), "PREFECT_CLIENT_MAX_RETRIES": "0"}


@contextmanager
def client_budget(max_wait: float) -> Iterator[None]:
    """Prefect's client inside `max_wait` seconds a request (see the module docstring)."""
    import httpx
    from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    settings = {"PREFECT_API_REQUEST_TIMEOUT": PREFECT_API_REQUEST_TIMEOUT, "PREFECT_CLIENT_MAX_RETRIES": PREFECT_CLIENT_MAX_RETRIES}
    updates = {settings[name]: value for name, value in prefect_bounds(max_wait).items() if name not in os.environ}
    with temporary_settings(updates=updates):
        api = PREFECT_API_URL.value() or "Prefect's own temporary server"
        try:
            yield
        except (RuntimeError, httpx.TransportError) as error:
            if not _unanswered(error):
                raise
            raise PrefectUnavailable(
                f"the Prefect API at {redact(api)} did not answer within orchestration.max_wait_seconds {max_wait:g} s "
                f"({type(error).__name__}: {redact(str(error).splitlines()[0] if str(error) else '')[:200]}); check "
                "PREFECT_API_URL and the server, then run again"
            ) from None


def _unanswered(error: BaseException) -> bool:
    """True for the Prefect client's own "no answer": a transport error, or its RuntimeError over one."""
    import httpx

    if isinstance(error, httpx.TransportError):
        return True
    return str(error).startswith("Failed to reach API at") or isinstance(error.__cause__, httpx.TransportError)

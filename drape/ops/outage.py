"""A service that restarts mid-run, waited out within its budget and said as such (issue 68).

Seen from drape, a restarting service (the MLflow server, the queue's database, the Pushgateway, the
object store) refuses or drops connections for a while, then answers again with what it held.
`within_budget` calls again what met such an error (`is_transient` says which errors mean "not
there right now": refused, reset, 502/503/504; never a timeout, whose wait the service's own bounds
already spent), until `budget` seconds since the first failure are spent. The operator sees a warning
naming the service and its URL when the outage begins, another with how long it lasted when it ends,
and ``drape_service_outages_total`` counts each outage by service and outcome (``recovered`` or
``exhausted``). An outage longer than the budget is an error of the caller's type naming the
service, its URL (never a secret) and the budget's config field.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from drape.ops import metrics
from drape.secrets import redact

LOG = logging.getLogger("drape.outage")
T = TypeVar("T")
FIRST_PAUSE_SECONDS, LONGEST_PAUSE_SECONDS = 0.25, 2.0


class ServiceUnavailable(RuntimeError):
    """A service stayed unreachable longer than its wait budget."""


def refused_or_dropped(error: BaseException) -> bool:
    """True for an error that says the service is not there right now: the connection refused,
    reset or closed by the peer, or a proxy's 502/503/504 (the service behind it restarting)."""
    text = f"{type(error).__name__} {error}".lower()
    return any(word in text for word in TRANSIENT_WORDS)


TRANSIENT_WORDS = (
    "connection refused",
    "connectionrefused",
    "connection reset",
    "remotedisconnected",
    "connection aborted",
    "server closed the connection",
    "closed the connection unexpectedly",
    "bad gateway",
    "service unavailable",
    "gateway timeout",
    "too many 502",
    "too many 503",
    "too many 504",
    "newconnectionerror",
)


def within_budget(
    call: Callable[[], T],
    *,
    service: str,
    shown: str,
    budget: float,
    field: str,
    is_transient: Callable[[BaseException], bool] = refused_or_dropped,
    error_type: type[Exception] = ServiceUnavailable,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, called again while it fails with a transient error, for at most `budget` seconds
    after its first failure (`field` names the budget in the config); see the module docstring."""
    began: float | None = None
    pause = FIRST_PAUSE_SECONDS
    while True:
        try:
            value = call()
        except Exception as error:
            if not is_transient(error):
                raise
            now = clock()
            if began is None:
                began = now
                LOG.warning(
                    "%s at %s unreachable (%s); waiting up to %g s (%s) for it to come back",
                    service,
                    shown,
                    _brief(error),
                    budget,
                    field,
                )
            if now - began + pause > budget:
                metrics.SERVICE_OUTAGES.labels(service=service, outcome="exhausted").inc()
                raise error_type(
                    f"{service} at {shown} unreachable for {now - began:.0f} s, longer than {field} {budget:g} s "
                    f"(last error: {_brief(error)}); nothing was half-written: run again once it answers"
                ) from None
            sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_SECONDS)
            continue
        if began is not None:
            LOG.warning("%s at %s answered again after %.1f s of outage; the call went through", service, shown, clock() - began)
            metrics.SERVICE_OUTAGES.labels(service=service, outcome="recovered").inc()
        return value


def _brief(error: BaseException) -> str:
    """The error's type and first line, secrets redacted, at most 300 characters."""
    lines = str(error).strip().splitlines()
    return redact(f"{type(error).__name__}: {lines[0] if lines else ''}")[:300]

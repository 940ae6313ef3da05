"""Slack alerts: one Block Kit message per failed gate, posted to an incoming webhook.

The webhook URL comes from the environment variable the config names (default
``DRAPE_SLACK_WEBHOOK_URL``) or, in flows, from a Prefect Secret block resolved by the task layer;
it never appears in config files, logs, reports or exceptions. The POST goes through slack_sdk's
``WebhookClient`` with its retry handlers: 429 (honouring Retry-After, capped), 5xx and connection
errors or timeouts, with exponential backoff and jitter, a bounded number of attempts and a timeout
on each. A Slack outage never hides a gate failure: the caller still fails the run and only notes
that the alert could not be sent.
"""

from __future__ import annotations

import logging
import os
import random
import time
from http.client import RemoteDisconnected
from urllib.error import URLError
from urllib.parse import urlsplit

from slack_sdk.errors import SlackRequestError
from slack_sdk.http_retry import (
    BackoffRetryIntervalCalculator,
    ConnectionErrorRetryHandler,
    HttpRequest,
    HttpResponse,
    Jitter,
    RateLimitErrorRetryHandler,
    RetryHandler,
    RetryState,
)
from slack_sdk.http_retry.builtin_handlers import ServerErrorRetryHandler
from slack_sdk.webhook import WebhookClient

from drape.config import AlertsConfig
from drape.gates.verdict.render import slack_lines
from drape.gates.verdict.report import GateReport
from drape.secrets import has_credentials, register_secret_variable

log = logging.getLogger(__name__)

# slack_sdk logs the full request URL (the webhook: a secret) at DEBUG and INFO, and the raw error at
# ERROR; its client gets this logger, which nothing configures and which drops every record.
_SLACK_SDK_LOGGER = logging.Logger("drape.ops.alerts.slack_sdk", level=logging.CRITICAL + 1)
_SLACK_SDK_LOGGER.addHandler(logging.NullHandler())
_SLACK_SDK_LOGGER.propagate = False


class AlertError(RuntimeError):
    """Slack could not be reached or refused the message; never carries the webhook URL."""


def webhook_from_env(config: AlertsConfig) -> str | None:
    register_secret_variable(config.slack_webhook_env)  # its value is redacted from every message
    return os.environ.get(config.slack_webhook_env, "").strip() or None


def _check_webhook(url: str) -> None:
    """AlertError (never quoting the URL) unless `url` is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("https", "http") and bool(parts.hostname) and not any(ord(c) < 33 for c in url)
    except ValueError:
        valid = False
    if not valid:
        raise AlertError("the Slack webhook is not an http(s) URL with a host (check the variable or Secret block that holds it)")
    if has_credentials(url):
        raise AlertError(
            "the Slack webhook carries credentials (user:password@ or a token in the query); a webhook needs none, "
            "its path is the secret (check the variable or Secret block that holds it)"
        )


def gate_message(report: GateReport, *, run_name: str, report_location: str, links: dict[str, str] | None = None) -> dict:
    """Block Kit payload for a gate verdict: stage, run, each check vs threshold and baseline, links."""
    verdict = "passed" if report.passed else "failed"
    title = f"drape gate {verdict}: {report.stage} ({run_name})"
    lines = slack_lines(report)
    if not report.passed:
        lines.append("Nothing was promoted; the run stopped.")
    context = [f"<{url}|{label}>" if url.startswith("http") else f"{label}: {url}" for label, url in (links or {}).items()]
    context.append(f"report: {report_location}")
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": item} for item in context]},
    ]
    fallback = f"{title}: " + ("; ".join(report.failures()) or "all checks passed")
    return {"text": fallback, "blocks": blocks}


class _EqualJitter(Jitter):
    """Half the backoff fixed, half random ("equal jitter"): retries spread out, the wait stays bounded.

    slack_sdk's RandomJitter adds up to a whole second to every wait, whatever the backoff."""

    def recalculate(self, duration: float) -> float:
        return duration / 2 + random.uniform(0, duration / 2)


def _retry_after_seconds(response: HttpResponse | None, default: float, cap: float) -> float:
    """Retry-After in seconds (integer or decimal), at most `cap`; `default` when absent or unreadable."""
    values = [v for k, v in (response.headers if response else {}).items() if k.lower() == "retry-after"]
    try:
        seconds = float(values[0][0]) if values and values[0] else default
    except ValueError:  # an HTTP date or garbage: fall back to our own backoff
        seconds = default
    return min(max(seconds, 0.0), cap) if seconds == seconds else default  # NaN → default


class _CappedRateLimitRetry(RateLimitErrorRetryHandler):
    """slack_sdk's 429 handler, with the wait capped: the stock one sleeps int(Retry-After) + jitter
    without bound (Retry-After: 3600 would hold a flow for an hour) and raises on a decimal value."""

    def __init__(self, *, max_retry_count: int, interval_calculator: BackoffRetryIntervalCalculator, max_wait_seconds: float):
        super().__init__(max_retry_count=max_retry_count, interval_calculator=interval_calculator)
        self.max_wait_seconds = max_wait_seconds

    def prepare_for_next_attempt(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        backoff = self.interval_calculator.calculate_sleep_duration(state.current_attempt)
        wait = _retry_after_seconds(response, default=backoff, cap=self.max_wait_seconds)
        log.warning("Slack rate-limited the alert (HTTP 429): retry %d in %.1f s", state.current_attempt + 1, wait)
        state.next_attempt_requested = True
        time.sleep(wait)
        state.increment_current_attempt()


class _AnyServerErrorRetry(ServerErrorRetryHandler):
    """slack_sdk's server-error handler retries 500 and 503 only; a gateway in front of Slack (or a
    corporate proxy) also answers 502 and 504, which pass as quickly."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is not None and response.status_code >= 500


def retry_handlers(*, attempts: int, backoff_seconds: float, max_wait_seconds: float) -> list[RetryHandler]:
    """slack_sdk retry handlers sharing one attempt budget: 429, 5xx, connection errors and timeouts.

    The handlers count attempts in one shared RetryState, so `attempts` bounds them all together."""
    backoff = BackoffRetryIntervalCalculator(backoff_factor=backoff_seconds, jitter=_EqualJitter())
    retries = attempts - 1
    connection_errors: list[type[Exception]] = [URLError, ConnectionError, RemoteDisconnected, TimeoutError]
    return [
        ConnectionErrorRetryHandler(max_retry_count=retries, interval_calculator=backoff, error_types=connection_errors),
        _CappedRateLimitRetry(max_retry_count=retries, interval_calculator=backoff, max_wait_seconds=max_wait_seconds),
        _AnyServerErrorRetry(max_retry_count=retries, interval_calculator=backoff),
    ]


def post_to_slack(
    url: str,
    payload: dict,
    *,
    attempts: int = 4,
    backoff_seconds: float = 1.0,
    max_wait_seconds: float = 30.0,
    timeout_seconds: float = 10.0,
) -> None:
    """POST `payload` through slack_sdk's WebhookClient; raise AlertError (without the URL) when Slack never accepts it.

    At most `attempts` requests of `timeout_seconds` each; waits back off from `backoff_seconds`
    (doubling, with jitter), a 429's Retry-After is honoured up to `max_wait_seconds`."""
    if (
        not 1 <= attempts <= 10
        or not 0 < timeout_seconds <= 120
        or not 0 <= backoff_seconds <= 60
        or not 0 <= max_wait_seconds <= 300
    ):
        raise ValueError(
            f"post_to_slack: attempts {attempts} (1-10), timeout_seconds {timeout_seconds} (0-120], "
            f"backoff_seconds {backoff_seconds} (0-60), max_wait_seconds {max_wait_seconds} (0-300) out of bounds"
        )
    _check_webhook(url)
    handlers = retry_handlers(attempts=attempts, backoff_seconds=backoff_seconds, max_wait_seconds=max_wait_seconds)
    client = WebhookClient(url, timeout=timeout_seconds, logger=_SLACK_SDK_LOGGER, retry_handlers=handlers)  # type: ignore[arg-type]
    try:
        response = client.send_dict(payload)
    except (URLError, OSError) as error:  # retries spent; the reason's type only, never its text
        reason = type(getattr(error, "reason", error)).__name__
        raise AlertError(f"Slack webhook did not accept the alert (at most {attempts} attempt(s)): {reason}") from None
    except (ValueError, SlackRequestError):  # http.client.InvalidURL and the like quote the URL: never passed on
        raise AlertError("the Slack webhook URL was refused as malformed by the HTTP client") from None
    if not 200 <= response.status_code < 300:
        raise AlertError(f"Slack webhook did not accept the alert (at most {attempts} attempt(s)): HTTP {response.status_code}")


def notify_gate(
    config: AlertsConfig,
    report: GateReport,
    *,
    run_name: str,
    report_location: str,
    links: dict[str, str] | None = None,
    webhook_url: str | None = None,
) -> str:
    """Send the gate verdict if it should be sent; returns what happened, for the run log."""
    if report.passed and not config.notify_on_pass:
        return "no alert: gate passed"
    url = webhook_url or webhook_from_env(config)
    if not url:
        return f"no Slack alert: ${config.slack_webhook_env} not set"
    try:
        post_to_slack(url, gate_message(report, run_name=run_name, report_location=report_location, links=links))
    except AlertError as error:
        log.error("gate alert for stage %s not sent: %s", report.stage, error)
        return f"Slack alert failed: {error}"
    return "Slack alerted"

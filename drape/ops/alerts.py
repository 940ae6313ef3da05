"""Slack alerts: one Block Kit message per failed gate, posted to an incoming webhook.

The webhook URL comes from the environment variable the config names (default
``DRAPE_SLACK_WEBHOOK_URL``) or, in flows, from a Prefect Secret block resolved by the task layer;
it never appears in config files, logs, reports or exceptions. Posts are retried on 429 (honouring
Retry-After) and on 5xx with exponential backoff. A Slack outage never hides a gate failure: the
caller still fails the run and only notes that the alert could not be sent.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from drape.config import AlertsConfig
from drape.gates.render import slack_lines
from drape.gates.report import GateReport
from drape.secrets import has_credentials, register_secret_variable

log = logging.getLogger(__name__)


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


def _retry_after(error: urllib.error.HTTPError, default: float, cap: float) -> float:
    header = error.headers.get("Retry-After") if error.headers else None
    try:
        return min(float(header), cap) if header is not None else default
    except ValueError:
        return default


def post_to_slack(
    url: str,
    payload: dict,
    *,
    attempts: int = 4,
    backoff_seconds: float = 1.0,
    max_wait_seconds: float = 30.0,
    timeout_seconds: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """POST `payload`; retry 429 and 5xx; raise AlertError (without the URL) when Slack never accepts it."""
    _check_webhook(url)
    body = json.dumps(payload).encode()
    last = ""
    for attempt in range(attempts):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        delay = backoff_seconds * 2**attempt
        try:
            with urllib.request.urlopen(request, timeout=timeout_seconds):
                return
        except urllib.error.HTTPError as error:
            last = f"HTTP {error.code}"
            if error.code != 429 and error.code < 500:
                break  # a 4xx other than 429 will not get better by retrying
            if error.code == 429:
                delay = _retry_after(error, delay, max_wait_seconds)
        except (urllib.error.URLError, OSError) as error:
            last = type(getattr(error, "reason", error)).__name__
        except ValueError:  # http.client.InvalidURL and the like quote the URL: never passed on
            raise AlertError("the Slack webhook URL was refused as malformed by the HTTP client") from None
        if attempt + 1 < attempts:
            log.warning("Slack post failed (%s), retry %d/%d in %.1f s", last, attempt + 1, attempts - 1, delay)
            sleep(delay)
    raise AlertError(f"Slack webhook did not accept the alert after {attempts} attempt(s): {last}")


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

"""Slack alerts through an incoming webhook, read from the environment, never logged.

The config names the environment variable (default ``DRAPE_SLACK_WEBHOOK_URL``); the URL itself
never appears in config files, logs, reports or artifacts. Without it, alerts are skipped and
the caller is told so.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request

from drape.config import AlertsConfig

log = logging.getLogger(__name__)


def gate_failure_message(stage: str, run_name: str, failures: list[str], report_location: str) -> str:
    lines = [f":rotating_light: drape gate failed: stage *{stage}* of run `{run_name}`; nothing was promoted."]
    lines += [f"• {reason}" for reason in failures]
    lines.append(f"Report: {report_location}")
    return "\n".join(lines)


def send_slack(config: AlertsConfig, text: str, timeout_seconds: float = 10.0) -> bool:
    """Post `text` to the configured webhook; True if Slack accepted it, False if none is configured.

    Raises RuntimeError (without the URL) when the webhook is configured but the post fails.
    """
    url = os.environ.get(config.slack_webhook_env, "").strip()
    if not url:
        log.info("Slack alert skipped: environment variable %s is not set", config.slack_webhook_env)
        return False
    request = urllib.request.Request(url, data=json.dumps({"text": text}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            if response.status >= 300:
                raise RuntimeError(f"Slack webhook (from ${config.slack_webhook_env}) answered HTTP {response.status}")
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "code", None) or type(error).__name__
        raise RuntimeError(f"Slack webhook (from ${config.slack_webhook_env}) could not be reached: {reason}") from None
    return True

"""Slack alerts: posted to the webhook from the environment; the URL never leaks into messages."""

import pytest

from drape.alerts import gate_failure_message, send_slack
from drape.config import AlertsConfig


def test_no_webhook_configured_skips(monkeypatch):
    monkeypatch.delenv("DRAPE_SLACK_WEBHOOK_URL", raising=False)
    assert send_slack(AlertsConfig(), "hello") is False


def test_posts_to_the_webhook(monkeypatch, slack_webhook):
    url, received = slack_webhook
    monkeypatch.setenv("DRAPE_SLACK_WEBHOOK_URL", f"{url}/ok/T000/SECRET")
    text = gate_failure_message("texture", "demo-run", ["texture: mean 0.1 < threshold 0.16"], "report.json")
    assert send_slack(AlertsConfig(), text) is True
    assert "texture" in received[0]["text"] and "0.16" in received[0]["text"]


def test_failure_does_not_leak_the_url(monkeypatch, slack_webhook):
    url, _ = slack_webhook
    monkeypatch.setenv("DRAPE_SLACK_WEBHOOK_URL", f"{url}/fail/T000/SECRET")
    with pytest.raises(RuntimeError) as error:
        send_slack(AlertsConfig(), "x")
    assert "SECRET" not in str(error.value) and "DRAPE_SLACK_WEBHOOK_URL" in str(error.value)

"""Slack alerts: Block Kit payloads, retries on 429 and 5xx, and the URL never leaks."""

import time

import pytest

from drape.config import AlertsConfig
from drape.gates.report import CheckResult, GateReport
from drape.ops.alerts import AlertError, gate_message, notify_gate, post_to_slack


def _report(passed: bool) -> GateReport:
    values = {"a": 0.9, "b": 0.85} if passed else {"a": 0.1, "b": 0.2}
    checks = {
        name: CheckResult(name, values, 0.5, baseline_mean=0.88, max_drop=0.05) for name in ("identity", "texture", "coherence")
    }
    return GateReport("texture", "run-1", "ckpt", "control-x", checks)


def test_block_kit_message_names_stage_checks_thresholds_and_links():
    payload = gate_message(
        _report(False),
        run_name="demo-full",
        report_location="s3://b/report.json",
        links={"Prefect flow run": "http://127.0.0.1:4200/runs/flow-run/1", "MLflow run": "run 1 in sqlite:///x"},
    )
    header, section, context = payload["blocks"]
    assert header["type"] == "header" and "failed" in header["text"]["text"] and "texture" in header["text"]["text"]
    assert "*identity*: 0.100 (mean 0.150) vs threshold 0.500, baseline mean 0.880" in section["text"]["text"]
    texts = [element["text"] for element in context["elements"]]
    assert "<http://127.0.0.1:4200/runs/flow-run/1|Prefect flow run>" in texts and "report: s3://b/report.json" in texts
    assert "identity: lower bound" in payload["text"]


def test_passing_gates_post_nothing_by_default(monkeypatch, slack_webhook):
    url, received = slack_webhook
    monkeypatch.setenv("DRAPE_SLACK_WEBHOOK_URL", f"{url}/ok/T0/SECRET")
    assert notify_gate(AlertsConfig(), _report(True), run_name="r", report_location="x") == "no alert: gate passed"
    assert notify_gate(AlertsConfig(notify_on_pass=True), _report(True), run_name="r", report_location="x") == "Slack alerted"
    assert len(received) == 1


def test_no_webhook_configured(monkeypatch):
    monkeypatch.delenv("DRAPE_SLACK_WEBHOOK_URL", raising=False)
    assert "not set" in notify_gate(AlertsConfig(), _report(False), run_name="r", report_location="x")


def test_retries_429_honouring_retry_after_then_500_then_succeeds(slack_webhook):
    url, received = slack_webhook
    started = time.monotonic()
    post_to_slack(f"{url}/seq/429,500,200/T0/SECRET", {"text": "x"}, backoff_seconds=0.05)
    assert len(received) == 3
    assert time.monotonic() - started >= 1.0  # waited the Retry-After second


def test_slack_outage_is_reported_without_the_url(monkeypatch, slack_webhook):
    url, received = slack_webhook
    with pytest.raises(AlertError) as error:
        post_to_slack(f"{url}/down/T0/SECRET", {"text": "x"}, attempts=3, backoff_seconds=0.01)
    assert len(received) == 3 and "HTTP 500" in str(error.value) and "SECRET" not in str(error.value)
    monkeypatch.setenv("DRAPE_SLACK_WEBHOOK_URL", f"{url}/down/T0/SECRET")
    outcome = notify_gate(AlertsConfig(), _report(False), run_name="r", report_location="x")
    assert outcome.startswith("Slack alert failed") and "SECRET" not in outcome

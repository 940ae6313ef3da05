"""Slack alerts: Block Kit payloads, retries on 429 and 5xx, and the URL never leaks."""

import functools
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from drape.config import AlertsConfig
from drape.gates.verdict.report import CheckResult, GateReport
from drape.ops import alerts
from drape.ops.alerts import AlertError, gate_message, notify_gate, post_to_slack
from tests.conftest import SENTINEL


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
    monkeypatch.setattr(
        alerts, "post_to_slack", functools.partial(post_to_slack, backoff_seconds=0.01)
    )  # the default 4 attempts, without seconds of backoff
    outcome = notify_gate(AlertsConfig(), _report(False), run_name="r", report_location="x")
    assert outcome.startswith("Slack alert failed") and "SECRET" not in outcome and len(received) == 3 + 4


# --- slack_sdk's WebhookClient and retry handlers against a real local HTTP server --------------
@pytest.fixture
def scripted_slack(monkeypatch):
    """A local HTTP server answering a script of (status, headers), then repeating its last entry:
    (set_script, webhook URL with a SECRET path, list of received payloads)."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)  # slack_sdk sends through any proxy in the environment
    script, received = [(200, {})], []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, headers = script[min(len(received), len(script)) - 1]
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield (
        (lambda *entries: script.__setitem__(slice(None), entries)),
        f"http://127.0.0.1:{server.server_port}/T0/B0/SECRET",
        received,
    )
    server.shutdown()
    server.server_close()


def test_retry_after_is_capped_so_a_long_rate_limit_cannot_hold_the_run(scripted_slack):
    set_script, url, received = scripted_slack
    set_script((429, {"Retry-After": "3600"}), (200, {}))
    started = time.monotonic()
    post_to_slack(url, {"text": "x"}, max_wait_seconds=0.2)
    assert len(received) == 2 and time.monotonic() - started < 2.0  # slack_sdk's own handler would sleep 3600 s


def test_a_decimal_retry_after_is_honoured(scripted_slack):
    set_script, url, received = scripted_slack
    set_script((429, {"Retry-After": "0.4"}), (429, {"retry-after": "0.4"}), (200, {}))
    started = time.monotonic()
    post_to_slack(url, {"text": "x"})  # slack_sdk's own handler raises ValueError on int("0.4")
    assert len(received) == 3 and 0.8 <= time.monotonic() - started < 3.0


def test_gateway_errors_are_retried_and_client_errors_are_not(scripted_slack):
    set_script, url, received = scripted_slack
    set_script((502, {}), (504, {}), (200, {}))
    post_to_slack(url, {"text": "x"}, backoff_seconds=0.02)
    assert len(received) == 3
    received.clear()
    set_script((404, {}))
    with pytest.raises(AlertError, match="HTTP 404"):
        post_to_slack(url, {"text": "x"}, backoff_seconds=0.02)
    assert len(received) == 1  # a 4xx other than 429 will not get better by retrying


def test_attempts_bound_every_kind_of_retry_together(scripted_slack):
    set_script, url, received = scripted_slack
    set_script((429, {"Retry-After": "0"}), (500, {}), (503, {}), (429, {"Retry-After": "0"}))
    with pytest.raises(AlertError, match="HTTP 429"):
        post_to_slack(url, {"text": "x"}, attempts=4, backoff_seconds=0.02)
    assert len(received) == 4


def test_a_silent_webhook_times_out_each_attempt_and_gives_up(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    listener, held = socket.socket(), []
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(8)], daemon=True).start()
    started = time.monotonic()
    with pytest.raises(AlertError, match="Timeout") as error:
        post_to_slack(
            f"http://127.0.0.1:{listener.getsockname()[1]}/T0/SECRET",
            {"text": "x"},
            attempts=2,
            timeout_seconds=0.3,
            backoff_seconds=0.02,
        )
    elapsed = time.monotonic() - started
    listener.close()
    assert len(held) == 2 and 0.6 <= elapsed < 3.0 and "SECRET" not in str(error.value)


def test_the_webhook_never_reaches_a_log_record(scripted_slack, caplog):
    set_script, url, received = scripted_slack
    caplog.set_level(logging.DEBUG)  # slack_sdk logs the request URL at DEBUG and INFO
    set_script((429, {"Retry-After": "0"}), (500, {}))
    with pytest.raises(AlertError):
        post_to_slack(url, {"text": "x"}, attempts=3, backoff_seconds=0.02)
    with pytest.raises(AlertError):  # nothing listens: connection refused, retried, then reported
        post_to_slack(url.replace(url.split("/")[2], "127.0.0.1:9"), {"text": "x"}, attempts=2, backoff_seconds=0.02)
    assert len(received) == 3 and caplog.records and "SECRET" not in caplog.text


# --- webhooks that are malformed or carry credentials: refused without quoting them ---------------
@pytest.mark.parametrize("webhook", [f"hooks.slack.com/services/{SENTINEL}", f"https://hooks.slack.com/ser vices/{SENTINEL}"])
def test_a_malformed_webhook_fails_without_quoting_it(webhook):
    with pytest.raises(AlertError) as error:
        post_to_slack(webhook, {"text": "x"}, attempts=1)
    assert SENTINEL not in str(error.value) and error.value.__cause__ is None


@pytest.mark.parametrize(
    "webhook",
    [
        f"https://u:{SENTINEL}@hooks.slack.com/services/T/B/X",
        f"http://:{SENTINEL}@127.0.0.1:9/hook",
        f"https://hooks.slack.com/services/T/B/X?token={SENTINEL}",
    ],
)
def test_a_webhook_with_credentials_is_refused_without_quoting_it(webhook):
    with pytest.raises(AlertError, match="carries credentials") as error:
        post_to_slack(webhook, {"text": "x"}, attempts=1)
    assert SENTINEL not in str(error.value)

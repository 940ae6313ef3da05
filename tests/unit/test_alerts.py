"""Slack alerts: posted to the webhook from the environment; the URL never leaks into messages."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from drape.alerts import gate_failure_message, send_slack
from drape.config import AlertsConfig


@pytest.fixture
def webhook():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200 if "/ok" in self.path else 500)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()


def test_no_webhook_configured_skips(monkeypatch):
    monkeypatch.delenv("DRAPE_SLACK_WEBHOOK_URL", raising=False)
    assert send_slack(AlertsConfig(), "hello") is False


def test_posts_to_the_webhook(monkeypatch, webhook):
    url, received = webhook
    monkeypatch.setenv("DRAPE_SLACK_WEBHOOK_URL", f"{url}/ok/T000/SECRET")
    text = gate_failure_message("texture", "demo-run", ["texture: mean 0.1 < threshold 0.16"], "report.json")
    assert send_slack(AlertsConfig(), text) is True
    assert "texture" in received[0]["text"] and "0.16" in received[0]["text"]


def test_failure_does_not_leak_the_url(monkeypatch, webhook):
    url, _ = webhook
    monkeypatch.setenv("DRAPE_SLACK_WEBHOOK_URL", f"{url}/fail/T000/SECRET")
    with pytest.raises(RuntimeError) as error:
        send_slack(AlertsConfig(), "x")
    assert "SECRET" not in str(error.value) and "DRAPE_SLACK_WEBHOOK_URL" in str(error.value)

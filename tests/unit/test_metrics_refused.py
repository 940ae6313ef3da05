"""A Pushgateway that answers and refuses one group's series (HTTP 400: inconsistent with what the
group holds) is not an outage: that push fails and is said, the group is not held, and later pushes
go through (before, the 400 marked the gateway down and every later push re-sent the refused group
and failed on it)."""

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from drape.ops import metrics
from tests.conftest import tiny_config


class _Gateway(BaseHTTPRequestHandler):
    paths: list[str] = []

    def _answer(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).paths.append(self.path)
        self.send_response(400 if "/stage/bad" in self.path else 200)
        self.end_headers()

    do_POST = do_PUT = _answer

    def log_message(self, *args):
        pass


def test_a_refused_group_is_said_and_does_not_poison_later_pushes(tmp_path, capsys):
    server = HTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        config = tiny_config(tmp_path / "drape", metrics={"pushgateway_url": url, "job": "refused-test"})
        assert not metrics.push_metrics(config, {"run": "r", "stage": "bad"})
        assert "refused the series" in capsys.readouterr().err
        _Gateway.paths.clear()
        assert metrics.push_metrics(config, {"run": "r", "stage": "good"})
        assert metrics.push_metrics(config, {"run": "r", "stage": "later"})
        assert not any("/stage/bad" in path for path in _Gateway.paths), _Gateway.paths  # never sent again
        assert metrics.flush_metrics(config)
    finally:
        server.shutdown()

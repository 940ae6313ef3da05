"""Shared fixtures: a tiny pipeline config rooted in a temporary directory, small datasets."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from drape.config import deep_merge, parse_config  # noqa: E402

import yaml  # noqa: E402

TESTS = Path(__file__).parent
TINY = TESTS / "configs" / "tiny.yaml"


def tiny_config(root: Path, **overrides):
    """The tiny test config with live storage, MLflow and the object store under `root`."""
    data = yaml.safe_load(TINY.read_text())
    data = deep_merge(data, {"paths": {"root": str(root)}})
    return parse_config(deep_merge(data, overrides), str(TINY))


@pytest.fixture
def config(tmp_path):
    return tiny_config(tmp_path / "drape")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A small synthetic dataset built once per session: (directory, manifest, config)."""
    from drape.data.dataset import build_dataset

    root = tmp_path_factory.mktemp("dataset")
    cfg = tiny_config(root / "drape", data={"samples_per_stage": {"identity": 24, "texture": 16, "geometry": 16, "denoise": 16},
                                            "control_samples": 6, "shard_max_samples": 10})
    manifest = build_dataset(cfg, root / "shards")
    return root / "shards", manifest, cfg


@pytest.fixture
def slack_webhook():
    """A local HTTP server standing in for Slack: (base URL, received payloads).

    ``/ok/...`` answers 200; ``/seq/429,500,200/...`` answers those codes in turn (429 with
    Retry-After: 1) and then repeats the last; anything else answers 500.
    """
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if self.path.startswith("/seq/"):
                codes = [int(c) for c in self.path.split("/")[2].split(",")]
                code = codes[min(len(received), len(codes)) - 1]
            else:
                code = 200 if self.path.startswith("/ok") else 500
            self.send_response(code)
            if code == 429:
                self.send_header("Retry-After", "1")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()

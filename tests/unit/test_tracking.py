"""drape/ops/tracking.py: a registry error is never read as 'no baseline', and a tracking server
that never answers fails within the HTTP bounds drape sets for MLflow (an operator's own win)."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import tiny_config


def test_a_registry_error_is_never_no_baseline(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    from drape.ops.tracking import RegistryError, Tracker

    tracker = Tracker(tiny_config(tmp_path))
    assert tracker.get_baseline("identity") is None  # a first run: the model does not exist

    def down(*args, **kwargs):
        raise MlflowException("database is locked", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(tracker.client, "get_model_version_by_alias", down)
    monkeypatch.setattr(tracker.client, "get_registered_model", down)
    with pytest.raises(RegistryError, match="not treating it as 'no baseline'"):
        tracker.get_baseline("identity")
    with pytest.raises(RegistryError):
        tracker.aliases()


def test_a_silent_tracking_server_fails_within_mlflows_bounds_which_drape_sets(tmp_path, monkeypatch):
    import socket
    import threading

    from mlflow.exceptions import MlflowException

    from drape.ops.tracking import MLFLOW_HTTP_BOUNDS, Tracker

    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    server, held = socket.socket(), []
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    config = tiny_config(tmp_path, tracking={"uri": endpoint})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the operator's setting wins over drape's default
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(MlflowException, match=endpoint):
        Tracker(config)
    assert time.monotonic() - started < 10
    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name)
    Tracker(tiny_config(tmp_path / "local"))  # unset, drape's bounds apply (MLflow's own: 120 s, 7 retries)
    assert {name: os.environ[name] for name in MLFLOW_HTTP_BOUNDS} == {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "18",  # 3 attempts × 18 s and 6 s of backoff: tracking.max_wait_seconds 60
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    }
    Tracker(tiny_config(tmp_path / "short", tracking={"max_wait_seconds": 15}))  # drape's own value follows the config
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"

"""One wait budget for the object store (`storage.max_wait_seconds`, issue 68): connect, read and
retries together fit it, by default within 60 s, and an endpoint that accepts TCP and never answers
is a StorageError naming the endpoint and the budget once it is spent."""

from __future__ import annotations

import time

import pytest

from drape.config import ConfigError, StorageConfig, load_config
from drape.storage.network import attempts_within, worst_wait
from drape.storage.store import ObjectStore, StorageError, open_store
from tests.conftest import silent_endpoint


def test_the_default_budget_is_at_most_a_minute_and_the_attempts_fit_it():
    storage = StorageConfig()
    attempts = attempts_within(
        storage.max_wait_seconds, storage.retry_attempts, storage.connect_timeout_seconds, storage.read_timeout_seconds
    )
    assert storage.max_wait_seconds <= 60 and attempts >= 2  # still retries a 503 or a reset
    assert worst_wait(attempts, storage.connect_timeout_seconds, storage.read_timeout_seconds) <= storage.max_wait_seconds
    assert worst_wait(attempts + 1, storage.connect_timeout_seconds, storage.read_timeout_seconds) > storage.max_wait_seconds
    assert worst_wait(8, 10, 20) > 120  # the defaults before the budget: 8 × (10 + 20) s and backoff


def test_a_budget_shorter_than_one_attempt_fails_at_load_naming_the_fields(tmp_path):
    with pytest.raises(ConfigError, match=r"storage.max_wait_seconds 5 is shorter than one attempt"):
        load_config("configs/demo.yaml", {"storage": {"max_wait_seconds": 5, "read_timeout_seconds": 10}})
    with pytest.raises(ConfigError, match="max_wait_seconds"):
        load_config("configs/demo.yaml", {"storage": {"max_wait_seconds": float("nan")}})


def test_a_silent_endpoint_is_a_clear_error_within_the_budget_whatever_retry_attempts_says(monkeypatch):
    endpoint = silent_endpoint(monkeypatch)
    overrides = {"object_store_url": "s3://silent/x", "endpoint_url": endpoint, "retry_attempts": 20}
    overrides |= {"connect_timeout_seconds": 0.5, "read_timeout_seconds": 0.5, "max_wait_seconds": 3}
    store = open_store(load_config("configs/demo.yaml", {"storage": overrides}))
    assert store.retry_attempts == 1  # 2 × 1 s + a full backoff would not fit 3 s
    started = time.monotonic()
    with pytest.raises(StorageError, match=rf"endpoint {endpoint} did not answer.*storage.max_wait_seconds 3 "):
        store.read_bytes("datasets/a/v1/manifest.json")
    assert time.monotonic() - started <= 3 + 3  # the budget, and slack for a loaded machine (the default waited > 150 s)


def test_a_budget_with_room_keeps_the_retries_a_flaky_store_needs():
    store = ObjectStore("s3://bucket/x", endpoint_url="http://127.0.0.1:9", retry_attempts=8, max_wait=60)
    assert store.retry_attempts == 3 and worst_wait(3, 5, 10) <= 60


def test_a_silent_tracking_server_is_an_error_within_tracking_max_wait_seconds(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    from drape.ops.tracking import MLFLOW_HTTP_BOUNDS, Tracker, mlflow_bounds
    from tests.conftest import tiny_config

    assert mlflow_bounds(60)["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "18"  # 3 × 18 s + 6 s of backoff: the default budget
    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    endpoint = silent_endpoint(monkeypatch)
    config = tiny_config(tmp_path, tracking={"uri": endpoint, "max_wait_seconds": 10})
    started = time.monotonic()
    with pytest.raises(MlflowException, match=endpoint):
        Tracker(config)
    assert time.monotonic() - started <= 10 + 3  # the budget, and slack for a loaded machine

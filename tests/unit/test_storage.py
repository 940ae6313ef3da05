"""Object store over fsspec: verified, atomic, idempotent; URLs logged without secrets; no key leaves
the store, and an endpoint that never answers fails within its bound, named."""

import time

import pytest

from drape.layout import UnsafePathError
from drape.storage.store import ObjectStore, StorageError, redact_url
from tests.conftest import silent_endpoint


def test_put_get_round_trip_is_verified(tmp_path):
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    local = tmp_path / "a.bin"
    local.write_bytes(b"x" * 1000)
    stored = store.put_file(local, "k/a.bin")
    assert stored.bytes == 1000 and store.exists("k/a.bin")
    assert store.list("k") == ["k/a.bin"]  # no temporary names left behind
    out = store.get_file("k/a.bin", tmp_path / "back" / "a.bin", sha256=stored.sha256)
    assert out.read_bytes() == b"x" * 1000
    with pytest.raises(StorageError, match="does not match expected"):
        store.get_file("k/a.bin", tmp_path / "bad", sha256="0" * 64)
    assert not (tmp_path / "bad").exists()


def test_errors_name_the_object(tmp_path):
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    with pytest.raises(StorageError, match="cannot upload, file not found"):
        store.put_file(tmp_path / "missing", "k")
    with pytest.raises(StorageError, match="missing in the object store"):
        store.read_bytes("nope")
    with pytest.raises(StorageError, match=r"objects/nope: missing"):
        store.verify("nope", size=1, sha256="x")


def test_redact_url_drops_credentials_and_query():
    assert redact_url("s3://KEY:SECRET@bucket/prefix?X-Amz-Signature=abc") == "s3://bucket/prefix"
    assert redact_url("http://user:pw@127.0.0.1:9000/b") == "http://127.0.0.1:9000/b"


# --- keys that leave the store; endpoints that never answer ---------------------------------------
def test_object_store_keys_cannot_leave_the_store(tmp_path):
    store = ObjectStore(f"file://{tmp_path}/objects")
    (tmp_path / "outside.txt").write_text("keep me")
    for key in ("../outside.txt", "/outside.txt", "a/../../outside.txt"):
        with pytest.raises(UnsafePathError):
            store.read_bytes(key)
        with pytest.raises(UnsafePathError):
            store.put_bytes(b"evil", key)
    assert (tmp_path / "outside.txt").read_text() == "keep me"
    assert store.list("") == []


def test_an_endpoint_that_accepts_and_never_answers_fails_within_its_bound(monkeypatch):
    endpoint = silent_endpoint(monkeypatch)
    # timeouts of 0.2 s: the endpoint accepts at once and never answers, so only the bound is waited for
    store = ObjectStore("s3://silent/x", endpoint_url=endpoint, connect_timeout=0.2, read_timeout=0.2, retry_attempts=2)
    started = time.monotonic()
    with pytest.raises(Exception, match="timeout"):
        store.read_bytes("datasets/a/v1/manifest.json")
    assert time.monotonic() - started < 10  # 2 attempts × 0.2 s, backoff, no s3fs retries on top
    with pytest.raises(StorageError, match="must not carry credentials"):
        ObjectStore("s3://AKIA:secret-key@silent/x")


def test_a_silent_endpoint_is_a_storage_error_naming_it_and_the_bound(monkeypatch):
    endpoint = silent_endpoint(monkeypatch)
    store = ObjectStore("s3://silent/x", endpoint_url=endpoint, connect_timeout=0.2, read_timeout=0.2, retry_attempts=1)
    for call in (lambda: store.exists("a/b"), lambda: store.list("a"), lambda: store.put_bytes(b"x", "a/b")):
        started = time.monotonic()
        with pytest.raises(StorageError, match=rf"endpoint {endpoint} did not answer.*read_timeout_seconds 0.2"):
            call()
        assert time.monotonic() - started < 10


def test_retry_attempts_counts_every_attempt_botocore_makes(monkeypatch):
    """storage.retry_attempts is the attempts of a request in all (what max_wait is computed for):
    botocore's `max_attempts` counted the retries after the first, one attempt (and its backoff) more."""
    accepted: list = []
    endpoint = silent_endpoint(monkeypatch, accepted)
    for attempts in (1, 2):
        store = ObjectStore(
            "s3://silent/x", endpoint_url=endpoint, connect_timeout=0.2, read_timeout=0.2, retry_attempts=attempts
        )
        before = len(accepted)
        with pytest.raises(StorageError, match=f"{attempts} attempt"):
            store.read_bytes("a/b")
        assert len(accepted) - before == attempts  # one connection an attempt: botocore never reuses a timed-out one

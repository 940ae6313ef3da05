"""Issue 51, class 5, mid-stream: an S3 endpoint that answers the headers and then stalls mid-body.

Through the fault proxy in front of the moto server, each way drape reads or writes (a download
as a restore does, an object read whole as a manifest is, a ranged read as the shard cache
pre-stages, a listing, an upload's answer) ends within its bound (storage.read_timeout_seconds ×
storage.retry_attempts, plus backoff) in a StorageError naming the endpoint, never an unnamed
timeout or s3fs's IndexError, and never quoting the secret key. Each test waits out two attempts of
0.5 s (`TIMEOUT_S`; 1 s each before, about 25 s in all).
"""

from __future__ import annotations

import time

import pytest

from drape.storage.store import ObjectStore, StorageError
from tests.integration.fault_proxy import FaultProxy

pytestmark = pytest.mark.slow

SECRET = "stall-secret-key-51b"  # the AWS secret in the environment: no error may quote it
# timeouts of 0.5 s (the stall is the wait each test spends: 2 attempts of it), not 1 s
TIMEOUT_S = 0.5
BOUND_S = 10.0  # 2 attempts × (0.5 s connect + 0.5 s read), botocore's backoff, moto's own latency


def _object_get(method: str, path: str) -> bool:
    return method == "GET" and "list-type=" not in path and "/stalls/" in path


def _listing(method: str, path: str) -> bool:
    return method == "GET" and "list-type=" in path


def _upload(method: str, path: str) -> bool:
    return method == "PUT" and "/stalls/up" in path


@pytest.fixture
def stalled(s3_bucket, tmp_path, monkeypatch):
    """(make a store behind a proxy that stalls the requests `when` picks, the file stored)."""
    bucket, endpoint = s3_bucket
    payload = tmp_path / "payload.bin"
    payload.write_bytes(bytes(range(256)) * 1200)
    ObjectStore(f"s3://{bucket}/drape", endpoint_url=endpoint).put_file(payload, "stalls/object.bin")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    proxies: list[FaultProxy] = []

    def make(when):
        proxies.append(FaultProxy(endpoint, body_stall=when, stall_seconds=60))
        store = ObjectStore(
            f"s3://{bucket}/drape",
            endpoint_url=proxies[-1].url,
            connect_timeout=TIMEOUT_S,
            read_timeout=TIMEOUT_S,
            retry_attempts=2,
        )
        return store, proxies[-1]

    yield make, payload
    for proxy in proxies:
        proxy.close()


def _fails_named_within_bound(call, proxy) -> str:
    started = time.monotonic()
    with pytest.raises(StorageError) as error:
        call()
    elapsed, message = time.monotonic() - started, str(error.value)
    assert elapsed < BOUND_S, f"{elapsed:.1f} s: {message}"
    assert f"the endpoint {proxy.url} did not answer in time, or stalled mid-response" in message
    assert f"read_timeout_seconds {TIMEOUT_S:g}, 2 attempt(s)" in message and SECRET not in message
    assert proxy.faults["body_stall"] >= 1, proxy.faults  # the stall was hit mid-body, not some other failure
    return message


def test_a_download_that_stalls_mid_body_fails_named(stalled, tmp_path):
    store, proxy = stalled[0](_object_get)
    message = _fails_named_within_bound(lambda: store.get_file("stalls/object.bin", tmp_path / "restored" / "object.bin"), proxy)
    assert "FSTimeoutError" in message
    assert not (tmp_path / "restored" / "object.bin").exists()  # nothing half-written under the final name


def test_a_whole_object_read_that_stalls_mid_body_fails_named(stalled):
    store, proxy = stalled[0](_object_get)
    _fails_named_within_bound(lambda: store.read_bytes("stalls/object.bin"), proxy)


def test_a_ranged_read_that_stalls_mid_body_fails_named_not_with_an_index_error(stalled):
    store, proxy = stalled[0](_object_get)

    def read_through():
        with store.open_read("stalls/object.bin", offset=100, block_bytes=1 << 20) as handle:
            return handle.read()

    _fails_named_within_bound(read_through, proxy)


def test_a_listing_that_stalls_mid_body_fails_named(stalled):
    store, proxy = stalled[0](_listing)
    _fails_named_within_bound(lambda: store.list("stalls"), proxy)


def test_an_upload_whose_answer_stalls_fails_named(stalled):
    make, payload = stalled
    store, proxy = make(_upload)
    _fails_named_within_bound(lambda: store.put_file(payload, "stalls/up.bin"), proxy)
    assert not store.exists("stalls/up.bin") or store.size("stalls/up.bin") == payload.stat().st_size  # never partial


def test_the_shard_cache_prestaging_through_a_stall_fails_named(s3_bucket, tmp_path, tiny_dataset, monkeypatch):
    from drape.data.cache import CacheError, ShardCache
    from drape.data.dataset import publish_dataset

    bucket, endpoint = s3_bucket
    directory, manifest, _ = tiny_dataset
    prefix = "datasets/stalls/v1"
    publish_dataset(directory, ObjectStore(f"s3://{bucket}/drape", endpoint_url=endpoint), prefix)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    proxy = FaultProxy(endpoint, body_stall=lambda method, path: method == "GET" and path.endswith(".tar"), stall_seconds=60)
    try:
        store = ObjectStore(
            f"s3://{bucket}/drape",
            endpoint_url=proxy.url,
            connect_timeout=TIMEOUT_S,
            read_timeout=TIMEOUT_S,
            retry_attempts=2,
        )
        cache = ShardCache(tmp_path / "cache", store, prefix, manifest, budget_bytes=1 << 30, concurrency=1)
        started = time.monotonic()
        with pytest.raises(CacheError) as error:
            cache.prestage("control")
        assert time.monotonic() - started < 2 * BOUND_S
    finally:
        proxy.close()
    message = str(error.value)
    assert f"the endpoint {proxy.url} did not answer in time, or stalled mid-response" in message and SECRET not in message
    assert not list((tmp_path / "cache").rglob("*.tar"))  # only a .part, never a shard under its name


def test_a_shopper_erase_whose_version_listing_stalls_fails_named(stalled):
    """`drape shopper forget` lists every object version through s3fs's client directly."""
    from drape.shoppers.forget import Subject
    from drape.shoppers.places import ObjectStorePlace

    store, proxy = stalled[0](lambda method, path: method == "GET" and "versions" in path)
    subject = Subject(shopper="s-51b", request="r1", requested_at="2026-12-04T00:00:00+00:00")
    _fails_named_within_bound(lambda: ObjectStorePlace(store).erase(subject), proxy)

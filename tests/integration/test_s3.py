"""The object store on S3, through s3fs and boto3 over HTTP to a moto server, as in production."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

import boto3
import pytest

from drape.config import RetentionConfig, RetentionRule
from drape.storage.lifecycle import apply_lifecycle
from drape.storage.retention import classify_stage_dir, execute_plan, plan_retention, read_archive_manifest, verify_archived
from drape.storage.store import ObjectStore, StorageError
from tests.conftest import wait_until

pytestmark = pytest.mark.slow


def _store(bucket, endpoint, **kwargs):
    return ObjectStore(f"s3://{bucket}/drape", endpoint_url=endpoint, **kwargs)


def _into_the_second_after(stamp: datetime) -> None:
    """Wait until the clock is past the whole second of `stamp`: S3 dates (LastModified) have one-second
    resolution, so what is written from then on is dated later than `stamp`."""
    wait_until(lambda: time.time() >= int(stamp.timestamp()) + 1, 5, f"the second after {stamp}", every=0.02)


def test_put_verify_get_with_tags_and_storage_class(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    store = _store(bucket, endpoint)
    local = tmp_path / "ckpt.safetensors"
    local.write_bytes(os.urandom(300_000))
    stored = store.put_file(
        local,
        "runs/r1/identity/checkpoints/w.safetensors",
        tags={"drape-kind": "checkpoint", "drape-outcome": "passed"},
        storage_class="STANDARD_IA",
    )
    assert stored.url == f"s3://{bucket}/drape/runs/r1/identity/checkpoints/w.safetensors"
    store.verify("runs/r1/identity/checkpoints/w.safetensors", size=stored.bytes, sha256=stored.sha256)
    assert store.get_tags("runs/r1/identity/checkpoints/w.safetensors") == {"drape-kind": "checkpoint", "drape-outcome": "passed"}
    head = boto3.client("s3", endpoint_url=endpoint).head_object(
        Bucket=bucket, Key="drape/runs/r1/identity/checkpoints/w.safetensors"
    )
    assert head["StorageClass"] == "STANDARD_IA"
    back = store.get_file("runs/r1/identity/checkpoints/w.safetensors", tmp_path / "back", sha256=stored.sha256)
    assert back.read_bytes() == local.read_bytes()
    assert store.list("runs") == ["runs/r1/identity/checkpoints/w.safetensors"]


def test_large_files_go_up_in_multipart_uploads(s3_bucket, tmp_path, monkeypatch):
    bucket, endpoint = s3_bucket
    store = _store(bucket, endpoint, multipart_chunk_bytes=5 * 2**20)
    calls = []
    original = store.fs._call_s3

    async def spy(method, *args, **kwargs):
        calls.append(method)
        return await original(method, *args, **kwargs)

    monkeypatch.setattr(store.fs, "_call_s3", spy)
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(11 * 2**20 + 7))
    stored = store.put_file(local, "big.bin")
    assert "create_multipart_upload" in calls and calls.count("upload_part") == 3 and "complete_multipart_upload" in calls
    store.verify("big.bin", size=stored.bytes, sha256=stored.sha256)


def test_a_copy_that_does_not_verify_is_removed_and_reported(s3_bucket, tmp_path, monkeypatch):
    bucket, endpoint = s3_bucket
    store = _store(bucket, endpoint)
    local = tmp_path / "a.bin"
    local.write_bytes(b"payload" * 100)
    monkeypatch.setattr(store, "sha256", lambda key: "0" * 64)  # the store returns other bytes than were sent
    with pytest.raises(StorageError, match="sha256 mismatch"):
        store.put_file(local, "a.bin")
    monkeypatch.undo()
    assert not store.exists("a.bin") and local.exists()


def test_archive_to_s3_tags_objects_and_frees_live_only_after_verifying(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    stage = tmp_path / "live" / "runs" / "r1" / "texture"
    (stage / "checkpoints" / "step-0000010").mkdir(parents=True)
    (stage / "checkpoints" / "step-0000010" / "manifest.json").write_text("{}")
    (stage / "gate").mkdir()
    (stage / "gate" / "report.json").write_text('{"verdict": "fail"}')
    store = _store(bucket, endpoint)
    policy = RetentionConfig(
        rules={"checkpoint": RetentionRule(lifetime_days=30, storage_class="STANDARD_IA")}, failed_lifetime_days=3
    )
    plan = plan_retention(classify_stage_dir(stage, "failed_candidate"), policy, key_root="runs/r1/texture")
    result = execute_plan(plan, store, "archive/manifests/r1/texture", run_id="r1", stage="texture")
    assert result.archived_files == 2 and not any(p.is_file() for p in stage.rglob("*"))
    records = read_archive_manifest(store)
    verify_archived(store, records)
    tags = store.get_tags("runs/r1/texture/gate/report.json")
    assert tags == {"drape-kind": "gate_report", "drape-outcome": "failed_candidate", "drape-stage": "texture"}


def test_lifecycle_rules_keyed_on_tags_are_accepted_and_read_back(s3_bucket):
    bucket, endpoint = s3_bucket
    policy = RetentionConfig(
        rules={"checkpoint": RetentionRule(lifetime_days=90), "gate_report": RetentionRule(lifetime_days=None)},
        failed_lifetime_days=7,
    )
    rules = {rule["ID"]: rule for rule in apply_lifecycle(_store(bucket, endpoint), policy)}
    passed = rules["drape-checkpoint-passed"]
    assert passed["Expiration"]["Days"] == 90 and passed["Status"] == "Enabled"
    assert passed["Filter"]["And"]["Prefix"] == "drape/runs/"
    assert {"Key": "drape-kind", "Value": "checkpoint"} in passed["Filter"]["And"]["Tags"]
    assert rules["drape-gate_report-failed_candidate"]["Expiration"]["Days"] == 7
    assert "drape-gate_report-passed" not in rules  # kept forever: no rule
    assert not any("baseline-" in rule_id and rule_id.endswith("-baseline") for rule_id in rules)
    assert rules["drape-noncurrent-versions"]["NoncurrentVersionExpiration"]["NoncurrentDays"] == 1


@pytest.mark.parametrize("size,single_copy_limit", [(300_000, None), (12 * 2**20, 2**20)], ids=["copy", "part-copy"])
def test_restamp_retags_and_restarts_the_lifecycle_clock(s3_bucket, tmp_path, size, single_copy_limit):
    bucket, endpoint = s3_bucket
    store = _store(bucket, endpoint)
    local = tmp_path / "w.safetensors"
    local.write_bytes(os.urandom(size))
    key = "runs/r1/identity/checkpoints/step-0000100/w.safetensors"
    stored = store.put_file(
        local, key, tags={"drape-kind": "checkpoint", "drape-outcome": "baseline"}, storage_class="STANDARD_IA"
    )
    client = boto3.client("s3", endpoint_url=endpoint)
    before = client.head_object(Bucket=bucket, Key=f"drape/{key}")
    _into_the_second_after(before["LastModified"])
    limits = {"single_copy_limit": single_copy_limit, "part_bytes": 5 * 2**20} if single_copy_limit else {}
    store.restamp(
        key,
        {"drape-kind": "checkpoint", "drape-outcome": "superseded_baseline"},
        size=stored.bytes,
        sha256=stored.sha256,
        **limits,
    )
    after = client.head_object(Bucket=bucket, Key=f"drape/{key}")
    assert after["LastModified"] > before["LastModified"]  # lifecycle days count from here
    assert after["StorageClass"] == "STANDARD_IA" and after["ContentLength"] == size
    assert store.get_tags(key) == {"drape-kind": "checkpoint", "drape-outcome": "superseded_baseline"}
    assert store.sha256(key) == stored.sha256
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_sweep_on_s3_retags_a_superseded_baseline_and_restarts_its_clock(s3_bucket, tmp_path):
    from datetime import timedelta

    from drape.storage.sweep import sweep

    bucket, endpoint = s3_bucket
    store = _store(bucket, endpoint)
    stage = tmp_path / "live" / "runs" / "r1" / "identity"
    (stage / "checkpoints" / "step-0000010").mkdir(parents=True)
    (stage / "checkpoints" / "step-0000010" / "model.safetensors").write_bytes(os.urandom(50_000))
    policy = RetentionConfig(baseline_grace_days=30)
    execute_plan(
        plan_retention(classify_stage_dir(stage, "passed"), policy, key_root="runs/r1/identity"),
        store,
        "archive/manifests/r1/identity",
        run_id="r1",
        stage="identity",
    )
    key = "runs/r1/identity/checkpoints/step-0000010/model.safetensors"
    client = boto3.client("s3", endpoint_url=endpoint)
    uploaded = client.head_object(Bucket=bucket, Key=f"drape/{key}")["LastModified"]
    assert store.get_tags(key)["drape-outcome"] == "baseline"
    assert sweep(store, policy, {"identity": "r1"}).retagged == []  # still the current baseline
    _into_the_second_after(uploaded)
    now = datetime.now(UTC)
    result = sweep(store, policy, {"identity": "r2"}, now=now)  # a later run's checkpoint is the baseline now
    assert result.retagged == [key]
    assert store.get_tags(key)["drape-outcome"] == "superseded_baseline"
    assert client.head_object(Bucket=bucket, Key=f"drape/{key}")["LastModified"] > uploaded
    record = next(r for r in read_archive_manifest(store) if r["key"] == key)
    assert record["outcome"] == "superseded_baseline" and record["expires_at"] == (now + timedelta(days=30)).isoformat()
    verify_archived(store, [record])


def test_lifecycle_on_a_file_store_is_a_clear_error(tmp_path):
    with pytest.raises(StorageError, match="lifecycle rules need an s3:// object store"):
        apply_lifecycle(ObjectStore(f"file://{tmp_path}"), RetentionConfig())


def test_s3_faults_are_retried_with_backoff(s3_bucket, tmp_path):
    """500, 503 SlowDown, connection resets and stalls past the read timeout: everything lands."""
    from tests.integration.fault_proxy import FaultProxy

    bucket, endpoint = s3_bucket
    # a stall of 1 s past a read timeout of 0.5 s: each stall costs the client half a second, not 1 s
    proxy = FaultProxy(endpoint, {2: "slowdown", 4: "internal", 6: "reset", 8: "stall"}, period=9, stall_seconds=1.0)
    try:
        store = ObjectStore(
            f"s3://{bucket}/faulty", endpoint_url=proxy.url, multipart_chunk_bytes=5 * 2**20, retry_attempts=10, read_timeout=0.5
        )
        stored = []
        for index, size in enumerate((1000, 300_000, 11 * 2**20)):
            local = tmp_path / f"f{index}"
            local.write_bytes(os.urandom(size))
            stored.append((local, store.put_file(local, f"f{index}", tags={"drape-kind": "checkpoint"})))
        for local, item in stored:
            back = store.get_file(item.url.rsplit("/", 1)[1], tmp_path / "back" / local.name, sha256=item.sha256)
            assert back.read_bytes() == local.read_bytes()
        assert sorted(store.list("")) == ["f0", "f1", "f2"]
    finally:
        proxy.close()
    assert {"slowdown", "internal", "reset", "stall"} <= set(proxy.faults), proxy.faults


def test_prestage_from_s3_through_faults_resumes_and_verifies(s3_bucket, tmp_path, tiny_dataset):
    """Shards pre-staged over HTTP with 503s and resets in the way, one download resumed from a part."""
    from drape.data.cache import ShardCache
    from drape.data.dataset import publish_dataset
    from tests.integration.fault_proxy import FaultProxy

    bucket, endpoint = s3_bucket
    directory, manifest, _ = tiny_dataset
    prefix = "datasets/synth-tryon/v1"
    publish_dataset(directory, _store(bucket, endpoint), prefix)
    proxy = FaultProxy(endpoint, {3: "slowdown", 7: "reset"}, period=10)
    try:
        store = _store(bucket, proxy.url, retry_attempts=8)
        cache = ShardCache(tmp_path / "cache", store, prefix, manifest, budget_bytes=1 << 30, concurrency=4)
        first = manifest["splits"]["identity"][0]
        local = cache.local_path(first)
        local.parent.mkdir(parents=True)
        local.with_name(f".{local.name}.part").write_bytes((directory / first["path"]).read_bytes()[:1000])
        result = cache.prestage("identity", keep=["control"])
    finally:
        proxy.close()
    assert result.downloaded == len(manifest["splits"]["identity"]) and sum(proxy.faults.values()) > 0
    for shard in manifest["splits"]["identity"]:
        assert cache.local_path(shard).read_bytes() == (directory / shard["path"]).read_bytes()

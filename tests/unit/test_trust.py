"""Trust boundaries: each test tries one attack or bad input and checks it is refused, named and harmless."""

from __future__ import annotations

import json
import logging
import math
import pickle

import pytest
import torch

from drape.config import ConfigError, deep_merge, parse_config
from drape.data.cache import ShardCache
from drape.data.dataset import ManifestError, check_dataset_manifest, read_manifest
from drape.layout import UnsafePathError, contained, safe_key, safe_name
from drape.ops.alerts import AlertError, post_to_slack
from drape.secrets import redact
from drape.storage.restore import restore_stage
from drape.storage.store import ObjectStore, StorageError
from drape.storage.sweep import sweep
from drape.training.checkpoint import CheckpointError
from drape.training.distributed import DistContext, ShardedCheckpointer, load_sharded
from scheduler.dispatch.dispatcher import unplaceable
from scheduler.engines import job_environment
from scheduler.queue.store import JobSpec, JobStore, QueueError
from tests.conftest import TINY, silent_endpoint, tiny_config

SHA = "0" * 64


# --- path containment --------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "a\x00b", ".."])
def test_unsafe_keys_are_refused_with_the_key_named(key):
    with pytest.raises(UnsafePathError, match="refused"):
        safe_key(key, "test key")


def test_contained_refuses_a_symlink_out_of_the_root(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert contained(tmp_path / "root", "a/b.tar", "k") == (tmp_path / "root" / "a" / "b.tar").resolve()
    with pytest.raises(UnsafePathError, match="outside"):
        contained(tmp_path / "root", "link/evil.tar", "shard path")
    for name in ("..", ".hidden", "a/b", ""):
        with pytest.raises(UnsafePathError):
            safe_name(name, "run id")


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


def _manifest(path: str, **fields) -> dict:
    shard = {"path": path, "bytes": 10, "sha256": SHA, "samples": 1}
    return {"name": "synthetic", "version": "v1", "splits": {"identity": [shard], "control": [shard]}, **fields}


@pytest.mark.parametrize(
    ("manifest", "match"),
    [
        (_manifest("../../../outside/evil.tar"), r"splits\.identity\[0\]\.path"),
        (_manifest("/abs/evil.tar"), "absolute"),
        (_manifest("identity/shard-00000.tar", name="../up"), "name"),
        (_manifest("identity/shard-00000.tar", version="v1/../../x"), "version"),
        ({"name": "synthetic", "version": "v1", "splits": {"identity": [{"path": "a.tar"}]}}, "bytes and samples"),
        ([], "expected a JSON object"),
    ],
)
def test_dataset_manifests_that_leave_the_cache_are_refused(manifest, match):
    with pytest.raises(ManifestError, match=match):
        check_dataset_manifest(manifest, "s3://bucket/datasets/synthetic/v1/manifest.json")


def test_prestage_and_eviction_never_touch_a_file_outside_the_cache(tmp_path):
    """The attack of the issue: a shard path of ../../../outside/evil.tar in the store's manifest."""
    store = ObjectStore(f"file://{tmp_path}/objects")
    victim = tmp_path / "outside" / "evil.tar"
    victim.parent.mkdir()
    victim.write_text("not the cache's")
    store.put_bytes(json.dumps(_manifest("../../../outside/evil.tar")).encode(), "datasets/synthetic/v1/manifest.json")
    with pytest.raises(ManifestError, match="evil.tar"):
        read_manifest(store, "datasets/synthetic/v1")
    with pytest.raises(ManifestError):
        ShardCache(
            tmp_path / "cache", store, "datasets/synthetic/v1", _manifest("../../../outside/evil.tar"), budget_bytes=1 << 30
        )
    assert victim.read_text() == "not the cache's"


def test_a_manifest_that_is_not_json_names_the_object(tmp_path):
    store = ObjectStore(f"file://{tmp_path}/objects")
    store.put_bytes(b"{not json", "datasets/synthetic/v1/manifest.json")
    with pytest.raises(ManifestError, match=r"manifest\.json: not JSON"):
        read_manifest(store, "datasets/synthetic/v1")


def _archive_record(key: str, **fields) -> dict:
    record = {"key": key, "run_id": "run-1", "stage": "identity", "kind": "checkpoint", "outcome": "passed"}
    return {**record, "bytes": 4, "sha256": SHA, "archived_at": "2026-01-01T00:00:00+00:00", "expires_at": None, **fields}


def _write_records(tmp_path, records: list[dict]) -> ObjectStore:
    store = ObjectStore(f"file://{tmp_path}/objects")
    lines = "".join(json.dumps(r) + "\n" for r in records)
    target = tmp_path / "objects" / "archive" / "manifests" / "run-1" / "identity-x.jsonl"  # as an attacker writes it
    target.parent.mkdir(parents=True)
    target.write_text(lines)
    return store


def test_restore_refuses_a_record_key_that_leaves_the_destination(tmp_path):
    store = _write_records(tmp_path, [_archive_record("runs/run-1/identity/../../../../outside.txt")])
    with pytest.raises(UnsafePathError):
        restore_stage(store, "run-1", "identity", tmp_path / "out")
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "out").exists()


def test_sweep_refuses_a_record_key_with_dotdot_and_deletes_nothing(tmp_path):
    (tmp_path / "precious.txt").write_text("keep")
    record = _archive_record("../precious.txt", expires_at="2000-01-01T00:00:00+00:00")
    store = _write_records(tmp_path, [record])
    with pytest.raises(UnsafePathError, match="precious"):
        sweep(store, tiny_config(tmp_path / "d").retention, {})
    assert (tmp_path / "precious.txt").read_text() == "keep"


def test_sweep_with_an_empty_registry_supersedes_no_baseline(tmp_path):
    """A wrong tracking.uri shows no baselines: the sweep must not start every baseline's expiry."""
    store = _write_records(tmp_path, [_archive_record("runs/run-1/identity/checkpoints/step-1/a", outcome="baseline")])
    with pytest.raises(StorageError, match="tracking.uri"):
        sweep(store, tiny_config(tmp_path / "d").retention, {})
    assert sweep(store, tiny_config(tmp_path / "d").retention, {}, allow_unregistered=True, dry_run=True).retagged


def test_an_archive_record_that_is_not_json_names_object_and_line(tmp_path):
    store = _write_records(tmp_path, [])
    (tmp_path / "objects" / "archive" / "manifests" / "run-1" / "identity-x.jsonl").write_text('{"key": "a"}\n{oops\n')
    with pytest.raises(StorageError, match="line 2"):
        sweep(store, tiny_config(tmp_path / "d").retention, {})


# --- secrets -----------------------------------------------------------------------------------
SENTINEL = "s3cr3t-SENTINEL-9f2c"


@pytest.mark.parametrize(
    ("section", "field", "url"),
    [
        ("queue", "url", f"postgresql://drape:{SENTINEL}@db:5432/queue"),
        ("tracking", "uri", f"http://user:{SENTINEL}@mlflow:5000"),
        ("metrics", "pushgateway_url", f"http://u:{SENTINEL}@pushgateway:9091"),
        ("queue", "prometheus_url", f"http://prom:9090/?token={SENTINEL}"),
        ("storage", "object_store_url", f"s3://AKIA:{SENTINEL}@bucket/drape"),
    ],
)
def test_no_config_url_may_carry_a_password_and_the_error_never_echoes_it(section, field, url):
    import yaml

    data = deep_merge(yaml.safe_load(TINY.read_text()), {section: {field: url}})
    with pytest.raises(ConfigError) as error:
        parse_config(data, "tiny.yaml")
    assert f"{section}.{field} must not carry credentials" in str(error.value)
    assert SENTINEL not in str(error.value)


def test_a_user_name_alone_is_not_a_secret(tmp_path):
    config = tiny_config(tmp_path, queue={"url": "postgresql://drape@db:5432/queue"})
    assert config.queue.url == "postgresql://drape@db:5432/queue"


def test_redact_removes_env_secrets_userinfo_tokens_and_webhooks(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL)
    text = (
        f"key {SENTINEL}; postgresql://u:pw12345@db/q; https://x/y?X-Amz-Signature=abcdef&ok=1; "
        "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
    )
    cleaned = redact(text)
    for secret in (SENTINEL, "pw12345", "abcdef", "XXXXSECRET"):
        assert secret not in cleaned
    assert "ok=1" in cleaned and "db/q" in cleaned


def test_log_records_are_redacted(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", SENTINEL)
    record = logging.getLogger("botocore").makeRecord("botocore", logging.ERROR, __file__, 1, "no %s", (SENTINEL,), None)
    assert SENTINEL not in record.getMessage() and "no ***" == record.getMessage()  # any logger: drape's factory


@pytest.mark.parametrize("webhook", [f"hooks.slack.com/services/{SENTINEL}", f"https://hooks.slack.com/ser vices/{SENTINEL}"])
def test_a_malformed_webhook_fails_without_quoting_it(webhook):
    with pytest.raises(AlertError) as error:
        post_to_slack(webhook, {"text": "x"}, attempts=1)
    assert SENTINEL not in str(error.value) and error.value.__cause__ is None


def test_a_local_job_gets_an_explicit_environment(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", SENTINEL)
    monkeypatch.setenv("SOME_TOKEN", SENTINEL)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("DRAPE_CRASH_AT", "x")
    env = job_environment(tiny_config(TINY.parent).queue.job_environment)
    assert "PGPASSWORD" not in env and "SOME_TOKEN" not in env
    assert env["AWS_SECRET_ACCESS_KEY"] == "aws-secret" and env["DRAPE_CRASH_AT"] == "x" and "PATH" in env
    assert "AWS_SECRET_ACCESS_KEY" not in job_environment(())


# --- code execution ----------------------------------------------------------------------------
class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _dcp_checkpoint(path):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    ShardedCheckpointer(DistContext(), use_async=False).save(path, model, optimizer, None, {"step": 1})
    return model


def test_a_dcp_checkpoint_loads_without_pickle(tmp_path):
    saved = _dcp_checkpoint(tmp_path / "step-0000001.dcp")
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_sharded(tmp_path / "step-0000001.dcp", model, optimizer, None)
    assert torch.equal(model.weight, saved.weight)
    assert optimizer.param_groups[0]["lr"] == 1e-3


def test_a_crafted_dcp_metadata_is_refused_even_with_a_matching_manifest(tmp_path):
    """The sha256 manifest proves integrity, not origin: an attacker rewrites both."""
    from drape.storage.checksum import sha256_file

    path = tmp_path / "step-0000001.dcp"
    _dcp_checkpoint(path)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][".metadata"] = sha256_file(path / ".metadata")
    (path / "manifest.json").write_text(json.dumps(manifest))
    model = torch.nn.Linear(4, 3)
    with pytest.raises(CheckpointError, match="DCP metadata refers to"):
        load_sharded(path, model, torch.optim.AdamW(model.parameters()), None)
    assert not marker.exists()


# --- gates ------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [-1.0, 0.0, 1.5, math.nan])
def test_thresholds_outside_zero_one_are_refused(tmp_path, threshold):
    with pytest.raises(ConfigError, match="min_similarity"):
        tiny_config(tmp_path, gates={"identity": {"min_similarity": threshold}})


# constant outputs (one colour, near-constant, mostly one colour): tests/unit/test_trust_outputs.py


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


# --- waits and bad input -----------------------------------------------------------------------
@pytest.mark.parametrize("mem", [math.nan, math.inf, -1.0, 0.0])
def test_queue_refuses_memory_that_is_not_a_finite_positive_number(tmp_path, mem):
    store = JobStore(f"sqlite:///{tmp_path}/q.db")
    with pytest.raises(QueueError, match="finite mem_gib"):
        store.submit(JobSpec(kind="stage-training", command=["true"], gpus=1, mem_gib=mem, duration_s=60.0))


def test_a_job_no_node_can_hold_is_refused_with_what_to_do(tmp_path):
    from scheduler.dispatch.dispatcher import submit_and_wait

    config = tiny_config(tmp_path, queue={"enabled": True, "cpu_slot_gib": 16.0})
    with pytest.raises(QueueError, match="no node of the fleet can hold it.*Lower the job's memory"):
        submit_and_wait(
            config, JobSpec(kind="stage-training", command=["true"], gpus=1, mem_gib=500.0, duration_s=60.0), timeout_s=5
        )
    assert JobStore(config.queue_url).jobs() == []
    assert unplaceable(1, 8.0, [_gpu("n1", 16.0)]) is None
    assert "2 GPU(s)" in unplaceable(2, 8.0, [_gpu("n1", 16.0), _gpu("n2", 16.0)])


def test_a_queued_job_past_the_placement_timeout_fails_with_the_reason(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher
    from scheduler.dispatch.fleet import FleetView

    config = tiny_config(tmp_path, queue={"enabled": True, "placement_timeout_seconds": 60})
    store = JobStore(config.queue_url)
    busy = _gpu("n1", 16.0)
    busy.allocated_gib, busy.jobs = 16.0, 4
    job = store.submit(JobSpec(kind="stage-training", command=["true"], gpus=1, mem_gib=8.0, duration_s=60.0), now=0.0)
    Dispatcher(config, store, fleet=lambda: FleetView([busy], "local", "")).cycle(now=30.0)
    assert store.get(job)["state"] == "queued"
    Dispatcher(config, store, fleet=lambda: FleetView([busy], "local", "")).cycle(now=90.0)
    assert store.get(job)["state"] == "failed" and "placement_timeout_seconds" in store.get(job)["message"]


def _gpu(node: str, total: float):
    from scheduler.policy import GpuState

    return GpuState(uuid=f"{node}-gpu0", node=node, model="H100-80GB", total_gib=total)


def test_a_missing_previous_baseline_is_an_error_not_fresh_weights(tmp_path):
    from drape import Mode
    from drape.layout import LiveLayout
    from drape.pipeline.stages import start_checkpoint

    class Context:
        mode, layout = Mode.FULL, LiveLayout(tmp_path)

    assert start_checkpoint(Context(), "identity") is None
    with pytest.raises(FileNotFoundError, match="identity baseline.*drape storage restore"):
        start_checkpoint(Context(), "texture")


def test_an_endpoint_that_accepts_and_never_answers_fails_within_its_bound(monkeypatch):
    import time

    endpoint = silent_endpoint(monkeypatch)
    store = ObjectStore("s3://silent/x", endpoint_url=endpoint, connect_timeout=1, read_timeout=1, retry_attempts=2)
    started = time.monotonic()
    with pytest.raises(Exception, match="timeout"):
        store.read_bytes("datasets/a/v1/manifest.json")
    assert time.monotonic() - started < 15  # 2 attempts × 1 s, backoff, no s3fs retries on top
    with pytest.raises(StorageError, match="must not carry credentials"):
        ObjectStore("s3://AKIA:secret-key@silent/x")


def test_cli_errors_are_one_redacted_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from drape.cli import app

    result = CliRunner().invoke(app, ["data", "shard", "synthetic", "--out", f"s3://AKIA:{SENTINEL}@bucket/x"])
    assert result.exit_code == 1 and SENTINEL not in result.output and "must not carry credentials" in result.output
    control = tmp_path / "outputs"
    control.mkdir()
    (control / "junk.png").write_text("not a png")
    from drape.gates.run import read_outputs

    with pytest.raises(ValueError, match="not a readable PNG"):
        read_outputs(control, ["junk"])

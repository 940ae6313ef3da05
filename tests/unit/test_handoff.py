"""Hand-offs through the object store (drape/storage/handoff.py, drape/training/jobs/apart.py): trees
published whole and fetched verified, checkpoints published as saved and adopted at archive, the
newest of a node's and the store's checkpoints, and the stage job as a store URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drape import Outcome
from drape.config import RetentionConfig
from drape.layout import archive_manifest_prefix
from drape.storage.handoff import (
    HandoffError,
    adopt_published,
    fetch_checkpoint,
    get_tree,
    newest_published,
    publish_checkpoint,
    put_tree,
)
from drape.storage.retention import read_archive_manifest
from drape.storage.store import ObjectStore, open_store
from drape.training.jobs.apart import CheckpointPublisher, restore_newest

POLICY = RetentionConfig(failed_lifetime_days=3, rules={"checkpoint": {"lifetime_days": 30}})


@pytest.fixture
def store(tmp_path) -> ObjectStore:
    return ObjectStore(f"file://{tmp_path / 'objects'}")


def _checkpoint(directory: Path, step: int, *, sharded: bool = False, payload: bytes = b"w") -> Path:
    path = directory / (f"step-{step:07d}" + (".dcp" if sharded else ""))
    (path / "inner").mkdir(parents=True)
    (path / "model.safetensors").write_bytes(payload * 1000)
    (path / "inner" / "rank0").write_bytes(payload + b"-rank0")
    (path / "manifest.json").write_text(json.dumps({"step": step}))
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_tree_comes_back_whole_and_verified(store, tmp_path):
    source = _checkpoint(tmp_path / "src", 10)
    records = put_tree(store, source, "handoff/baselines/identity/v1-run")
    assert {r["path"] for r in records} == {"model.safetensors", "inner/rank0", "manifest.json"}
    fetched = get_tree(store, "handoff/baselines/identity/v1-run", tmp_path / "node-b" / "weights")
    assert _files(fetched) == _files(source)
    # a copy that does not match its file list is refused, and nothing half-fetched is left
    store.put_bytes(b"tampered", "handoff/baselines/identity/v1-run/inner/rank0")
    with pytest.raises(Exception, match="sha256"):
        get_tree(store, "handoff/baselines/identity/v1-run", tmp_path / "node-c" / "weights")
    assert not (tmp_path / "node-c" / "weights").exists()


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b"])
def test_a_file_list_that_leads_outside_its_folder_is_refused(store, tmp_path, path):
    store.put_bytes(b"x", "handoff/evil/x")
    index = {"files": [{"path": path, "bytes": 1, "sha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"}]}
    store.put_bytes(json.dumps(index).encode(), "handoff/evil/_files.json")
    with pytest.raises(HandoffError):
        get_tree(store, "handoff/evil", tmp_path / "out")
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("record", [{"path": "a"}, {"path": "a", "bytes": -1, "sha256": "0" * 64}, "not a dict"])
def test_a_damaged_file_list_is_named(store, tmp_path, record):
    store.put_bytes(json.dumps({"files": [record]}).encode(), "handoff/bad/_files.json")
    with pytest.raises(HandoffError, match="handoff/bad/_files.json"):
        get_tree(store, "handoff/bad", tmp_path / "out")
    with pytest.raises(HandoffError, match="no such hand-off"):
        get_tree(store, "handoff/never", tmp_path / "out")


def test_published_checkpoints_resume_on_another_node_and_take_the_stage_outcome(store, tmp_path):
    node_a = tmp_path / "node-a" / "checkpoints"
    for step, sharded in ((20, True), (40, True), (60, False)):
        publish_checkpoint(store, _checkpoint(node_a, step, sharded=sharded), POLICY, run_id="r1", stage="texture")
    assert (node_a / "step-0000060").is_dir()  # the live copy is the node's cache: kept
    assert newest_published(store, "r1", "texture") == "step-0000060"
    records = read_archive_manifest(store, archive_manifest_prefix("r1"))
    assert {r["outcome"] for r in records} == {Outcome.ABORTED}  # until the flow's archive decides
    assert all(r["expires_at"] for r in records)  # an abandoned stage's expire as an aborted one's

    node_b = tmp_path / "node-b" / "checkpoints"
    fetched = fetch_checkpoint(store, "r1", "texture", "step-0000040.dcp", node_b)
    assert _files(fetched) == _files(node_a / "step-0000040.dcp")
    with pytest.raises(HandoffError, match="no step-0000099"):
        fetch_checkpoint(store, "r1", "texture", "step-0000099", node_b)

    # the archive recorded the promoted checkpoint itself; the intermediates take the stage's outcome
    done = {"runs/r1/texture/checkpoints/step-0000060"}
    adopted = adopt_published(store, POLICY, run_id="r1", stage="texture", outcome=Outcome.PASSED, done=done)
    assert adopted[0] == 2 * 3 and adopted[1] > 2 * 1000  # objects and bytes: two checkpoints of three files
    after = {r["key"].split("/")[4]: r for r in read_archive_manifest(store, archive_manifest_prefix("r1"))}
    assert after["step-0000020.dcp"]["outcome"] == after["step-0000040.dcp"]["outcome"] == Outcome.PASSED
    assert after["step-0000060"]["outcome"] == Outcome.ABORTED  # left to the archive, which holds it
    assert adopt_published(store, POLICY, run_id="r1", stage="texture", outcome=Outcome.PASSED, done=done) == (0, 0)


def test_a_node_resumes_from_the_newer_of_its_own_and_the_stores_checkpoint(store, tmp_path):
    stage_dir = tmp_path / "node" / "runs" / "r2" / "geometry"
    assert restore_newest(store, "r2", "geometry", stage_dir) is None  # nothing anywhere: a fresh start
    other = tmp_path / "other" / "checkpoints"
    publish_checkpoint(store, _checkpoint(other, 40, sharded=True), POLICY, run_id="r2", stage="geometry")
    _checkpoint(stage_dir / "checkpoints", 20, sharded=True, payload=b"old")  # this node stopped at 20
    restored = restore_newest(store, "r2", "geometry", stage_dir)
    assert restored is not None and restored.name == "step-0000040.dcp"
    assert _files(restored) == _files(other / "step-0000040.dcp")
    _checkpoint(stage_dir / "checkpoints", 60, sharded=True)  # newer here than in the store: kept
    assert restore_newest(store, "r2", "geometry", stage_dir) is None


def test_the_publisher_uploads_in_order_off_the_loop_and_reports_a_failure(store, tmp_path):
    directory = tmp_path / "checkpoints"
    publisher = CheckpointPublisher(store, POLICY, run_id="r3", stage="denoise")
    for step in (2, 4):
        publisher(_checkpoint(directory, step))
    assert publisher.close() > 0
    assert newest_published(store, "r3", "denoise") == "step-0000004"
    failing = CheckpointPublisher(store, POLICY, run_id="r3", stage="denoise")
    failing(directory / "step-0000099")  # never saved: its upload fails
    with pytest.raises(RuntimeError, match="could not be published"):
        failing.close()
    failing = CheckpointPublisher(store, POLICY, run_id="r3", stage="denoise")
    failing(directory / "step-0000099")
    assert failing.close(raise_errors=False) == 0  # beside a training error, the training error is the one raised


def test_a_stage_job_travels_as_a_store_url(tmp_path):
    from drape.training.jobs.stage_job import StageJob
    from tests.conftest import tiny_config

    config = tiny_config(tmp_path / "drape", queue={"enabled": True})
    assert config.trains_apart
    store = open_store(config)
    job = StageJob(config, "texture", tmp_path / "flow-side", run_id="r4", handoff=True, init_key="handoff/baselines/x")
    command = job.publish(store)
    assert command[1:4] == ["-m", "drape.train", "--job"] and command[4].endswith("runs/r4/texture/job.json")
    read = StageJob.read(command[4])
    assert read == job and read.init_key == "handoff/baselines/x"
    # run apart, the stage folder is the node's own, whatever the file says
    assert read.out_dir == Path(config.paths.root).resolve() / "live" / "runs" / "r4" / "texture"
    store.put_bytes(json.dumps({"schema": "drape.stage_job/v1", "stage": "texture"}).encode(), "runs/r4/texture/job.json")
    with pytest.raises(ValueError, match="lacks"):
        StageJob.read(command[4])


def test_a_checkpoint_counts_only_once_every_node_published_its_shards(store, tmp_path):
    """Multi-node: rank 0's node publishes its shards and the manifest, the other node its own; until
    both are in, the newest whole checkpoint is the one before, and every node resumes from it."""
    from drape.training.jobs.apart import align_to

    node_0, node_1 = tmp_path / "node-0" / "checkpoints", tmp_path / "node-1" / "checkpoints"
    for step in (20, 40):
        main = node_0 / f"step-{step:07d}.dcp"
        main.mkdir(parents=True)
        (main / "__0_0.distcp").write_bytes(b"rank 0")
        (main / "manifest.json").write_text(json.dumps({"files": {"__0_0.distcp": "x", "__1_0.distcp": "y"}}))
        publish_checkpoint(store, main, POLICY, run_id="m", stage="identity")
    other = node_1 / "step-0000020.dcp"
    other.mkdir(parents=True)
    (other / "__1_0.distcp").write_bytes(b"rank 1")
    publish_checkpoint(store, other, POLICY, run_id="m", stage="identity")  # node 1 was lost before its step 40
    assert newest_published(store, "m", "identity") == "step-0000020.dcp"
    # node 0 holds step 40 (not whole anywhere) and step 20 without rank 1's shard: both replaced
    stage_dir = tmp_path / "node-0"
    restored = align_to(store, "m", "identity", stage_dir, "step-0000020.dcp")
    assert restored is not None and sorted(p.name for p in restored.iterdir()) == [
        "__0_0.distcp",
        "__1_0.distcp",
        "manifest.json",
    ]
    assert not (node_0 / "step-0000040.dcp").exists()
    assert align_to(store, "m", "identity", stage_dir, "step-0000020.dcp") is None  # whole here now
    assert align_to(store, "m", "identity", tmp_path / "fresh", None) is None  # nothing whole: from the start


def test_the_sweep_deletes_superseded_baselines_hand_offs_after_the_grace(store, tmp_path):
    from datetime import UTC, datetime, timedelta

    from drape.storage.handoff import baseline_weights_key, tree_index
    from drape.storage.sweep import sweep

    weights = _checkpoint(tmp_path / "baseline", 100)
    old, current = baseline_weights_key("identity", "3-run-a"), baseline_weights_key("identity", "4-run-b")
    other_stage = baseline_weights_key("texture", "1-run-a")
    for prefix in (old, current, other_stage):
        put_tree(store, weights, prefix)
    policy = RetentionConfig(baseline_grace_days=30)
    runs = {"identity": "run-b"}  # texture has no baseline in the registry: its hand-offs stay
    now = datetime.now(UTC)
    assert sweep(store, policy, runs, now=now + timedelta(days=29), allow_unregistered=True).handoffs == []
    later = now + timedelta(days=31)
    planned = sweep(store, policy, runs, now=later, dry_run=True, allow_unregistered=True)
    assert planned.handoffs == [old] and tree_index(store, old)  # a dry run deletes nothing
    done = sweep(store, policy, runs, now=later, allow_unregistered=True)
    assert done.handoffs == [old] and done.freed_bytes == sum(r["bytes"] for r in tree_index(store, current))
    assert store.list(old) == []
    for kept in (current, other_stage):
        get_tree(store, kept, tmp_path / "fetched" / kept.replace("/", "_"))  # whole and verified


def test_the_checkpoint_a_job_ends_on_is_published_even_when_this_run_saved_nothing(store, tmp_path):
    """A retry that resumed from the last step's checkpoint its killed run saved but never published
    trains no step: closing the publisher with that checkpoint as `final` publishes it, and only when
    the store does not record it yet."""
    directory = tmp_path / "checkpoints"
    saved_by_the_killed_run = _checkpoint(directory, 60)

    def records() -> int:
        return len(read_archive_manifest(store, archive_manifest_prefix("r4")))

    retry = CheckpointPublisher(store, POLICY, run_id="r4", stage="texture")
    assert newest_published(store, "r4", "texture") is None
    assert retry.close(final=saved_by_the_killed_run) > 0
    assert newest_published(store, "r4", "texture") == "step-0000060"
    once = records()
    assert once > 0
    recorded = CheckpointPublisher(store, POLICY, run_id="r4", stage="texture")
    assert recorded.close(final=saved_by_the_killed_run) == 0 and records() == once  # in the store: not sent again
    queued = CheckpointPublisher(store, POLICY, run_id="r4", stage="texture")
    queued(_checkpoint(directory, 80))
    assert queued.close(final=directory / "step-0000080") > 0 and records() == 2 * once  # the queued upload, not a second

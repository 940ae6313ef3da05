"""Frozen bases in the archive (drape/storage/bases.py, retention.py, sweep.py): the first run over a
base archives it once with its own records; a run over a base already in the store archives only its
stage tensors, and its records name the base; the sweep gives a base the lifetime of the longest-lived
checkpoint naming it, never frees one that an archived or live stage checkpoint names, and frees it,
with its records saying so, once nothing does."""

from datetime import UTC, datetime, timedelta

import pytest
import torch

from drape.config import RetentionConfig
from drape.layout import base_key, base_record_key
from drape.storage.bases import BASE_RECORD, EXPIRY_MARGIN, NAMES_BASE, named_bases
from drape.storage.restore import restore_stage
from drape.storage.retention import classify_stage_dir, execute_plan, plan_retention, read_archive_manifest
from drape.storage.store import ObjectStore, tree_bytes
from drape.storage.sweep import sweep
from drape.training.checkpoints.base import BASE_FILE
from drape.training.checkpoints.checkpoint import STAGE_FILE, load_model, save_checkpoint
from drape.training.recipes.model import build_model, trainable_parameter_names

PATTERNS = ["transformer.transformer_blocks.*.attn.*"]
POLICY = RetentionConfig(failed_lifetime_days=7, baseline_grace_days=30)
START = datetime(2026, 1, 1, tzinfo=UTC)
STAGES = ("identity", "texture", "geometry", "denoise")


@pytest.fixture
def trained(config):
    model = build_model(config)
    names = trainable_parameter_names(PATTERNS, [n for n, _ in model.named_parameters()], model.frozen_prefixes)
    return model, names


def _archive_run(model, names, live, store, run_id, outcome, now=START):
    """Four stages, one stage checkpoint each (the trained tensors moved each time), archived with `outcome`."""
    results = []
    for index, stage in enumerate(STAGES):
        with torch.no_grad():
            dict(model.named_parameters())[names[0]].add_(1.0)
        stage_dir = live / "runs" / run_id / stage
        save_checkpoint(
            stage_dir / "checkpoints" / "step-0000004",
            model=model, optimizer=None, trainable_names=names, ema=None,
            manifest={"stage": stage, "step": index}, bases=live / "bases",
        )  # fmt: skip
        actions = plan_retention(classify_stage_dir(stage_dir, outcome), POLICY, key_root=f"runs/{run_id}/{stage}")
        results.append(execute_plan(actions, store, f"archive/manifests/{run_id}/{stage}", run_id=run_id, stage=stage, now=now))
    return results


def _base_records(store, digest):
    return {r["key"]: r for r in read_archive_manifest(store, include_deleted=True) if r.get(BASE_RECORD) == digest}


def test_the_first_run_archives_the_base_once_and_a_run_on_it_only_its_stage_tensors(trained, tmp_path):
    model, names = trained
    store, live = ObjectStore(f"file://{tmp_path / 'objects'}"), tmp_path / "live"
    first = _archive_run(model, names, live, store, "run-1", "baseline")
    digest = next(iter(_digests(store)))
    base_bytes = tree_bytes(live / "bases" / digest)
    left = [f for f in (live / "runs" / "run-1" / "identity" / "checkpoints").rglob("*") if f.is_file()]
    assert not left  # freed: archived and verified (a baseline's live copy is under baselines/)
    records = read_archive_manifest(store)
    checkpoint_records = [r for r in records if r["key"].startswith("runs/")]
    assert checkpoint_records and all(r[NAMES_BASE] == digest for r in checkpoint_records)
    per_stage = [sum(r["bytes"] for r in checkpoint_records if r["stage"] == stage) for stage in STAGES]
    # the first stage's archive sends the base; the three after it refer to it
    assert [result.archived_bytes for result in first] == [per_stage[0] + base_bytes, *per_stage[1:]]
    assert set(_base_records(store, digest)) == {base_key(digest, BASE_FILE), base_key(digest, "manifest.json")}
    assert all(r["expires_at"] is None and r["lifetime"] for r in _base_records(store, digest).values())
    written = store.read_bytes(base_record_key(digest))
    # a second run over the registered base: only its stage tensors, and no new base record
    second = _archive_run(model, names, tmp_path / "live2", store, "run-2", "baseline")
    run_2 = [r for r in read_archive_manifest(store) if r["key"].startswith("runs/run-2/")]
    assert sum(r.archived_bytes for r in second) == sum(r["bytes"] for r in run_2)  # the base is not sent again
    assert all(r[NAMES_BASE] == digest for r in run_2)
    assert all(STAGE_FILE in k or "manifest" in k or "config" in k for k in store.list("runs/run-2"))
    assert store.read_bytes(base_record_key(digest)) == written and store.list("bases") == sorted(_base_records(store, digest))
    # a restore of a run-2 stage brings the base back and the model is whole
    restored = restore_stage(store, "run-2", "denoise", tmp_path / "restored")
    assert restored[-1] == tmp_path / "restored" / "bases" / digest / BASE_FILE
    loaded = load_model(tmp_path / "restored" / "checkpoints" / "step-0000004")
    assert torch.equal(loaded.state_dict()[names[0]], model.state_dict()[names[0]])


def test_the_sweep_never_frees_a_base_an_archived_or_live_checkpoint_names(trained, tmp_path):
    model, names = trained
    store, live = ObjectStore(f"file://{tmp_path / 'objects'}"), tmp_path / "live"
    _archive_run(model, names, live, store, "run-1", "baseline")
    _archive_run(model, names, live, store, "run-2", "failed_candidate", now=START + timedelta(days=10))
    digest = next(iter(_digests(store)))
    base_objects = [base_key(digest, "manifest.json"), base_key(digest, BASE_FILE)]
    current = dict.fromkeys(STAGES, "run-1")
    # run-1's baselines are current (kept forever): the base is kept and its record says so, long after run-2's expiry
    late = START + timedelta(days=400)
    result = sweep(store, POLICY, current, now=late)
    assert not set(base_objects) & set(result.deleted) and all(store.exists(k) for k in base_objects)
    assert all(r["expires_at"] is None for r in _base_records(store, digest).values())
    # run-3 becomes every stage's baseline: run-1's are superseded, 30 days' grace from now
    result = sweep(store, POLICY, dict.fromkeys(STAGES, "run-3"), now=late, allow_unregistered=True)
    expected = (late + timedelta(days=30) + EXPIRY_MARGIN).isoformat()
    assert {r["expires_at"] for r in _base_records(store, digest).values()} == {expected}
    assert all(store.exists(k) for k in base_objects)
    # past the grace, a live stage checkpoint (a run in progress over it) still names the base: it stays
    save_checkpoint(
        live / "runs" / "run-4" / "identity" / "checkpoints" / "step-0000001",
        model=model, optimizer=None, trainable_names=names, ema=None, manifest={"stage": "identity", "step": 1},
        bases=live / "bases",
    )  # fmt: skip
    after = late + timedelta(days=32)
    result = sweep(store, POLICY, dict.fromkeys(STAGES, "run-3"), now=after, live_bases=named_bases(live))
    assert named_bases(live) == {digest} and all(store.exists(k) for k in base_objects)
    assert {r["expires_at"] for r in _base_records(store, digest).values()} == {None}
    assert not any(k in result.deleted for k in base_objects)
    # nothing live names it and every archived checkpoint naming it has expired: the base goes, recorded
    later = after + timedelta(minutes=1)  # (sweeps at one instant would tie on recorded_at)
    result = sweep(store, POLICY, dict.fromkeys(STAGES, "run-3"), now=later, live_bases=set())
    assert [k for k in result.deleted if k.startswith("bases/")] == base_objects  # its manifest first: uncommitted
    assert not any(store.exists(k) for k in base_objects)
    assert all(r["deleted_at"] for r in _base_records(store, digest).values())
    assert not [r for r in read_archive_manifest(store) if r.get(NAMES_BASE) == digest]  # nothing names it now


def test_a_base_named_by_an_unexpired_checkpoint_outlives_it_by_a_day(trained, tmp_path):
    model, names = trained
    store, live = ObjectStore(f"file://{tmp_path / 'objects'}"), tmp_path / "live"
    _archive_run(model, names, live, store, "run-1", "failed_candidate")
    digest = next(iter(_digests(store)))
    expiry = START + timedelta(days=7)
    sweep(store, POLICY, {}, now=START + timedelta(days=1))
    assert {r["expires_at"] for r in _base_records(store, digest).values()} == {(expiry + EXPIRY_MARGIN).isoformat()}
    result = sweep(store, POLICY, {}, now=expiry + timedelta(hours=1))  # the checkpoints go, the base not yet
    assert any(k.startswith("runs/") for k in result.deleted) and store.exists(base_key(digest, BASE_FILE))
    result = sweep(store, POLICY, {}, now=expiry + EXPIRY_MARGIN, dry_run=True)
    assert base_key(digest, BASE_FILE) in result.deleted and store.exists(base_key(digest, BASE_FILE))  # dry run
    sweep(store, POLICY, {}, now=expiry + EXPIRY_MARGIN)
    assert not store.exists(base_key(digest, BASE_FILE))
    # a later run over the same weights publishes it again: recorded again, with no end while named forever
    _archive_run(model, names, live, store, "run-2", "baseline", now=expiry + timedelta(days=2))
    assert store.exists(base_key(digest, BASE_FILE)) and store.exists(base_record_key(digest))
    assert all(not r.get("deleted_at") and r["expires_at"] is None for r in _base_records(store, digest).values())


def _digests(store):
    return {r[BASE_RECORD] for r in read_archive_manifest(store, include_deleted=True) if r.get(BASE_RECORD)}


def test_a_checkpoint_whose_base_is_nowhere_is_not_archived(trained, tmp_path):
    import shutil

    from drape.storage.store import StorageError

    model, names = trained
    store, live = ObjectStore(f"file://{tmp_path / 'objects'}"), tmp_path / "live"
    stage_dir = live / "runs" / "run-1" / "identity"
    save_checkpoint(stage_dir / "checkpoints" / "step-0000001", model=model, optimizer=None, trainable_names=names, ema=None,
                    manifest={"step": 1}, bases=live / "bases")  # fmt: skip
    shutil.rmtree(live / "bases")
    actions = plan_retention(classify_stage_dir(stage_dir, "failed_candidate"), POLICY, key_root="runs/run-1/identity")
    with pytest.raises(StorageError, match="nothing could reassemble it"):
        execute_plan(actions, store, "archive/manifests/run-1/identity", run_id="run-1", stage="identity")
    assert (stage_dir / "checkpoints" / "step-0000001" / STAGE_FILE).is_file() and not store.list("runs")

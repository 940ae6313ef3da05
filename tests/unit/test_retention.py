"""Retention plan and execution: archive, verify by reading back, only then free live storage; archive
records an attacker or a damaged upload wrote are refused by restore and sweep, naming what is wrong."""

import json

import pytest

from drape.config import RetentionConfig, RetentionRule
from drape.layout import UnsafePathError
from drape.storage.restore import restore_stage
from drape.storage.retention import (
    classify_stage_dir,
    execute_plan,
    live_until,
    plan_retention,
    read_archive_manifest,
    resolve,
    verify_archived,
)
from drape.storage.store import ObjectStore, StorageError
from drape.storage.sweep import sweep
from tests.conftest import tiny_config


def _stage_dir(tmp_path):
    stage = tmp_path / "live" / "runs" / "r1" / "texture"
    for relative, size in {
        "checkpoints/step-0000100/model/w.safetensors": 300,
        "checkpoints/step-0000100/manifest.json": 20,
        "checkpoints/step-0000050/manifest.json": 20,
        "gate/outputs/control-00000.png": 50,
        "gate/latents.safetensors": 40,
        "gate/report.json": 30,
        "gate/grid.png": 60,
        "superseded-baseline/checkpoint/manifest.json": 25,
        "superseded-baseline/outputs/control-00000.png": 50,
    }.items():
        path = stage / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(range(256))[: size % 256] * (size // 256 + 1))
    return stage


POLICY = RetentionConfig(
    rules={
        "checkpoint": RetentionRule(lifetime_days=90, storage_class="STANDARD_IA"),
        "gate_report": RetentionRule(lifetime_days=None),
    },
    failed_lifetime_days=7,
)


def test_plan_classifies_kinds_and_lifetimes(tmp_path):
    artifacts = classify_stage_dir(_stage_dir(tmp_path), "passed")
    kinds = {a.relative: (a.kind, a.outcome) for a in artifacts}
    assert kinds == {
        "checkpoints/step-0000050": ("checkpoint", "passed"),
        "checkpoints/step-0000100": ("checkpoint", "baseline"),
        "gate/outputs": ("validation_output", "passed"),
        "gate/latents.safetensors": ("latent_snapshot", "passed"),
        "gate/report.json": ("gate_report", "passed"),
        "gate/grid.png": ("validation_output", "passed"),
        "superseded-baseline/checkpoint": ("checkpoint", "superseded_baseline"),
        "superseded-baseline/outputs": ("validation_output", "superseded_baseline"),
    }
    plan = {a.artifact.relative: a for a in plan_retention(artifacts, POLICY, key_root="runs/r1/texture")}
    assert (
        plan["checkpoints/step-0000050"].lifetime_days == 90 and plan["checkpoints/step-0000050"].storage_class == "STANDARD_IA"
    )
    assert plan["checkpoints/step-0000100"].lifetime_days is None  # the promoted checkpoint: kept while it is the baseline
    assert plan["gate/report.json"].lifetime_days is None  # the audit trail never expires
    assert plan["checkpoints/step-0000100"].key_prefix == "runs/r1/texture/checkpoints/step-0000100"
    failed = plan_retention(
        classify_stage_dir(tmp_path / "live" / "runs" / "r1" / "texture", "failed_candidate"), POLICY, key_root="k"
    )
    assert {a.lifetime_days for a in failed if a.artifact.outcome == "failed_candidate"} == {7}


def test_execute_archives_verifies_then_frees(tmp_path):
    stage = _stage_dir(tmp_path)
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    plan = plan_retention(classify_stage_dir(stage, "passed"), POLICY, key_root="runs/r1/texture")
    result = execute_plan(plan, store, "archive/manifests/r1/texture", run_id="r1", stage="texture")
    assert result.archived_files == 9 and result.freed_bytes == result.archived_bytes > 0
    assert not [p for p in stage.rglob("*") if p.is_file()]
    records = read_archive_manifest(store)
    assert len(records) == 9 and {r["kind"] for r in records} >= {"checkpoint", "gate_report", "latent_snapshot"}
    verify_archived(store, records)
    again = execute_plan(plan, store, "archive/manifests/r1/texture", run_id="r1", stage="texture")
    assert again.archived_files == 0  # idempotent: nothing left to archive


def test_nothing_is_freed_when_a_copy_does_not_verify(tmp_path, monkeypatch):
    stage = _stage_dir(tmp_path)
    before = sorted(p for p in stage.rglob("*") if p.is_file())
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    real_verify = store.verify

    def verify(key, *, size, sha256):
        if ".tmp-" in key:
            raise StorageError(f"{key}: sha256 mismatch (injected)")
        return real_verify(key, size=size, sha256=sha256)

    monkeypatch.setattr(store, "verify", verify)
    plan = plan_retention(classify_stage_dir(stage, "passed"), POLICY, key_root="runs/r1/texture")
    with pytest.raises(StorageError, match="injected"):
        execute_plan(plan, store, "archive/manifests/r1/texture", run_id="r1", stage="texture")
    assert sorted(p for p in stage.rglob("*") if p.is_file()) == before
    assert not store.list("archive")


def test_policy_resolves_per_kind_and_outcome():
    from drape.config import OutcomeRule

    policy = RetentionConfig(
        rules={
            "checkpoint": RetentionRule(
                lifetime_days=90,
                storage_class="STANDARD_IA",
                outcomes={
                    "passed": OutcomeRule(lifetime_days=14, storage_class="GLACIER_IR"),
                    "failed_candidate": OutcomeRule(lifetime_days=2),
                },
            )
        },
        failed_lifetime_days=7,
        baseline_grace_days=30,
    )
    assert resolve(policy, "checkpoint", "passed") == (14, "GLACIER_IR")
    assert resolve(policy, "checkpoint", "failed_candidate") == (2, "STANDARD_IA")
    assert resolve(policy, "checkpoint", "aborted") == (7, "STANDARD_IA")
    assert resolve(policy, "checkpoint", "superseded_baseline") == (30, "STANDARD_IA")
    assert resolve(policy, "checkpoint", "baseline") == (None, "STANDARD_IA")  # a current baseline never expires
    assert resolve(policy, "gate_report", "passed") == (None, "STANDARD")


def test_unknown_storage_class_or_outcome_is_a_config_error():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="storage_class"):
        RetentionRule(storage_class="COLD")
    with pytest.raises(ValidationError, match="outcomes"):
        RetentionRule(outcomes={"won": {"lifetime_days": 1}})


def test_live_until_resolves_per_kind_and_outcome_and_baselines_stay_live():
    from pydantic import ValidationError

    from drape.config import OutcomeRule

    policy = RetentionConfig(
        rules={
            "checkpoint": RetentionRule(live_until="run_end", outcomes={"failed_candidate": OutcomeRule(live_until="stage_end")}),
            "latent_snapshot": RetentionRule(live_until="baseline"),
            "gate_report": RetentionRule(),
        }
    )
    assert live_until(policy, "checkpoint", "passed") == "run_end"
    assert live_until(policy, "checkpoint", "failed_candidate") == "stage_end"
    assert live_until(policy, "checkpoint", "baseline") == "baseline"  # the next stage starts from it: always live
    assert live_until(policy, "validation_output", "baseline") == "baseline"  # the coherence reference
    assert live_until(policy, "latent_snapshot", "baseline") == "baseline"
    assert live_until(policy, "latent_snapshot", "passed") == "stage_end"  # 'baseline' means nothing for other outcomes
    assert live_until(policy, "gate_report", "baseline") == "stage_end"  # the default
    with pytest.raises(ValidationError, match="checkpoint.outcomes.baseline.live_until must be 'baseline'"):
        RetentionConfig(rules={"checkpoint": RetentionRule(outcomes={"baseline": OutcomeRule(live_until="stage_end")})})


RUN_END = RetentionConfig(
    rules={"checkpoint": RetentionRule(live_until="run_end"), "validation_output": RetentionRule(live_until="run_end")}
)


def test_run_end_artifacts_stay_live_after_the_stage_and_go_at_run_end(tmp_path):
    from drape.storage.retention import release_run

    stage = _stage_dir(tmp_path)
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    plan = plan_retention(classify_stage_dir(stage, "passed"), RUN_END, key_root="runs/r1/texture")
    result = execute_plan(plan, store, "archive/manifests/r1/texture", run_id="r1", stage="texture")
    assert result.archived_files == 9
    left = {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()}
    # the promoted checkpoint's stage copy goes (its live copy is baselines/<stage>/); the rest waits for run end
    assert left == {
        "checkpoints/step-0000050/manifest.json",
        "gate/outputs/control-00000.png",
        "gate/grid.png",
        "superseded-baseline/checkpoint/manifest.json",
        "superseded-baseline/outputs/control-00000.png",
    }
    stray = stage / "gate" / "not-archived.txt"
    stray.write_text("written after the archive")
    changed = stage / "gate" / "grid.png"
    changed.write_bytes(b"changed after its copy was archived")
    released = release_run(store, stage.parent, "r1")
    assert released.freed_files == 4 and sorted(released.kept) == sorted([str(changed), str(stray)])
    assert {p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()} == {
        "gate/grid.png",
        "gate/not-archived.txt",
    }
    assert release_run(store, stage.parent, "r1").freed_files == 0  # idempotent


def test_run_end_release_keeps_a_file_whose_archived_copy_is_gone(tmp_path):
    from drape.storage.retention import release_run

    stage = _stage_dir(tmp_path)
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    execute_plan(
        plan_retention(classify_stage_dir(stage, "passed"), RUN_END, key_root="runs/r1/texture"),
        store,
        "archive/manifests/r1/texture",
        run_id="r1",
        stage="texture",
    )
    store.fs.rm(store.path("runs/r1/texture/gate/grid.png"))  # e.g. expired by the sweep during a long run
    released = release_run(store, stage.parent, "r1")
    assert released.kept == [str(stage / "gate" / "grid.png")] and (stage / "gate" / "grid.png").is_file()


# --- archive records as an attacker or a damaged upload writes them: restore and sweep ------------
SHA = "0" * 64


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

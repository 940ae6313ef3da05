"""kill -9 at any point of an archive loses no artifact, and rerunning completes idempotently."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drape.storage.checksum import sha256_file
from drape.storage.retention import read_archive_manifest, verify_archived
from drape.storage.store import ObjectStore

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from drape.config import RetentionConfig
from drape.storage.retention import classify_stage_dir, execute_plan, plan_retention
from drape.storage.store import ObjectStore
stage_dir, store_url = sys.argv[1:3]
plan = plan_retention(classify_stage_dir(stage_dir, "passed"), RetentionConfig(), key_root="runs/r1/texture")
execute_plan(plan, ObjectStore(store_url), "archive/manifests/r1/texture", run_id="r1", stage="texture")
"""
FILES = {
    "checkpoints/step-0000010/model/w.safetensors": 40_000,
    "checkpoints/step-0000010/manifest.json": 300,
    "checkpoints/step-0000020/model/w.safetensors": 40_000,
    "gate/outputs/control-00000.png": 2_000,
    "gate/outputs/control-00001.png": 2_000,
    "gate/report.json": 500,
    "gate/latents.safetensors": 8_000,
}


def _archive(stage: Path, store_url: str, crash_at: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DRAPE_CRASH_AT", None)
    if crash_at:
        env["DRAPE_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", SCRIPT, str(stage), store_url], env=env, timeout=120).returncode


@pytest.mark.parametrize(
    "crash_at", ["after-upload-1", "after-upload-4", "before-manifest", "after-manifest", "after-first-free"]
)
def test_kill_9_loses_nothing_and_rerun_completes(tmp_path, crash_at):
    stage = tmp_path / "live" / "runs" / "r1" / "texture"
    originals = {}
    for relative, size in FILES.items():
        (stage / relative).parent.mkdir(parents=True, exist_ok=True)
        (stage / relative).write_bytes(os.urandom(size))
        originals[relative] = sha256_file(stage / relative)
    store_url = f"file://{tmp_path / 'objects'}"
    store = ObjectStore(store_url)

    assert _archive(stage, store_url, crash_at) == -9
    recorded = {r["key"]: r for r in read_archive_manifest(store)}
    for relative, digest in originals.items():
        local = stage / relative
        if local.exists():
            assert sha256_file(local) == digest, relative
        else:  # freed only because a recorded, verified copy exists
            record = recorded[f"runs/r1/texture/{relative}"]
            assert record["sha256"] == digest
            store.verify(record["key"], size=record["bytes"], sha256=digest)

    assert _archive(stage, store_url, None) == 0
    assert not [p for p in stage.rglob("*") if p.is_file()]
    records = read_archive_manifest(store)
    assert sorted(r["key"] for r in records) == sorted(f"runs/r1/texture/{relative}" for relative in FILES)
    assert all(r["sha256"] == originals[r["key"].removeprefix("runs/r1/texture/")] for r in records)
    verify_archived(store, records)
    assert not [p for p in (tmp_path / "objects").rglob("*") if ".tmp-" in p.name]  # no temporary leftovers

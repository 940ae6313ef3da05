"""Bring an archived stage back to live storage, every file verified against its archive record."""

from __future__ import annotations

from pathlib import Path

from drape.layout import run_key
from drape.storage.retention import read_archive_manifest
from drape.storage.store import ObjectStore


def restore_stage(store: ObjectStore, run_id: str, stage: str, destination: str | Path) -> list[Path]:
    """Bring a stage's archived files back under `destination`, each verified against its record."""
    records = [r for r in read_archive_manifest(store) if r["run_id"] == run_id and r["stage"] == stage]
    if not records:
        raise FileNotFoundError(f"no archived artifacts for run {run_id!r} stage {stage!r} in {store!r}")
    prefix = run_key(run_id, stage) + "/"
    return [store.get_file(r["key"], Path(destination) / r["key"].removeprefix(prefix), sha256=r["sha256"]) for r in records]

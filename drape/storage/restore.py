"""Bring an archived stage back to live storage, every file verified against its archive record,
with the frozen base its stage checkpoints name (`drape.storage.bases`)."""

from __future__ import annotations

from pathlib import Path

from drape.layout import BASES, UnsafePathError, contained, run_key, safe_key
from drape.storage.bases import BASE_RECORD, fetch_bases
from drape.storage.retention import read_archive_manifest
from drape.storage.store import ObjectStore
from drape.training.checkpoints.base import BASE_FILE


def restore_stage(
    store: ObjectStore, run_id: str, stage: str, destination: str | Path, *, bases: Path | None = None
) -> list[Path]:
    """Bring a stage's archived files back under `destination`, each verified against its record,
    and the frozen base each of its stage checkpoints names into `bases` (default
    ``<destination>/bases``) unless a ``bases/`` above it holds it already."""
    records = [  # a base's own records: it comes back by what names it (below)
        r for r in read_archive_manifest(store) if r["run_id"] == run_id and r["stage"] == stage and not r.get(BASE_RECORD)
    ]
    if not records:
        raise FileNotFoundError(f"no archived artifacts for run {run_id!r} stage {stage!r} in {store!r}")
    prefix = run_key(run_id, stage) + "/"
    targets = []
    for record in records:  # every record checked before anything is written
        key = safe_key(record.get("key"), "archive record key")
        if not key.startswith(prefix):
            raise UnsafePathError(f"archive record key {key!r} is not under {prefix!r}, the stage it is recorded for")
        targets.append((key, contained(destination, key.removeprefix(prefix), "archive record key"), record["sha256"]))
    files = [store.get_file(key, local, sha256=sha256) for key, local, sha256 in targets]
    checkpoints = sorted({file.parent for file in files if file.name == "manifest.json"})
    return files + [base / BASE_FILE for base in fetch_bases(store, checkpoints, bases or Path(destination) / BASES)]

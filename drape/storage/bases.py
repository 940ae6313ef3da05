"""Frozen bases in the object store: one copy each, under ``bases/<sha256>/``, shared by every run.

A stage checkpoint (`drape.training.checkpoints.checkpoint`) names the frozen base it was trained on by its
content hash; the base itself (``base.safetensors`` + ``manifest.json``, `drape.training.checkpoints.base`)
goes to the object store once, the first time a checkpoint that names it is published, snapshot
or archived (`publish_bases`), and comes back next to any checkpoint fetched onto a node that
lacks it (`fetch_bases`): a node that shares nothing but the object store can reassemble the
model. An upload is read back and verified before anything local is freed (`put_file`); a base
already in the store is not sent again, so four stages over one base archive it once.

Bases are tagged kind 'checkpoint', outcome 'baseline': no lifecycle rule expires them (every
checkpoint of every run over the same pretrained weights names the same base). A live base no
live checkpoint names any more goes once its copy in the store is verified (`prune_live_bases`).

A base's lifetime is in the archive records. Every archived file of a stage checkpoint records the
base it names (``"base": <sha256>``); the base itself gets its own records once, the first time an
archive names it (``archive/manifests/bases/<sha256>.jsonl``, ``"frozen_base": <sha256>``): a run
over a base already in the store archives only its stage tensors and refers to it. The base lives
as long as the longest-lived archived checkpoint that names it, plus a day (`EXPIRY_MARGIN`: S3's
lifecycle rules act up to a day after an object's date), and never while a live checkpoint names
it; the retention sweep keeps its record's ``expires_at`` to that (`base_lifetimes`) and deletes it,
on every store, once it is due.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

from drape import ArtifactKind, Outcome
from drape.jsonfile import parse_json_object, read_json_object
from drape.layout import base_key, base_record_key
from drape.storage.checksum import sha256_file
from drape.storage.durable import fsync_dir, fsync_tree
from drape.storage.retention import TAG_KIND, TAG_OUTCOME
from drape.storage.store import ObjectStore, StorageError
from drape.training.checkpoints.base import BASE_FILE, check_digest

MANIFEST = "manifest.json"
_TAGS = {TAG_KIND: str(ArtifactKind.CHECKPOINT), TAG_OUTCOME: str(Outcome.BASELINE)}
NAMES_BASE = "base"  # on the archive record of a stage checkpoint's file: the base it names
BASE_RECORD = "frozen_base"  # on a base's own archive records: its sha256
LIFETIME = "as long as the longest-lived archived checkpoint naming it, plus a day; never while a live one names it"
EXPIRY_MARGIN = timedelta(days=1)


def named_base(checkpoint: str | Path) -> str | None:
    """The content hash of the base a checkpoint folder's manifest names (None: a whole checkpoint,
    or no manifest); a malformed one is a ValueError naming the file."""
    manifest = Path(checkpoint) / MANIFEST
    if not manifest.is_file():
        return None
    base = read_json_object(manifest, "checkpoint manifest").get("base")
    if base is None:
        return None
    return check_digest(base.get("sha256") if isinstance(base, dict) else None, str(manifest))


def publish_base(store: ObjectStore, base_dir: Path) -> int:
    """Upload a live base folder (its file, then its manifest: the manifest commits it), each read
    back and verified; the bytes sent (0 when the store holds it already)."""
    digest = check_digest(base_dir.name, str(base_dir))
    if store.exists(base_key(digest, MANIFEST)):
        return 0
    stored = store.put_file(base_dir / BASE_FILE, base_key(digest, BASE_FILE), tags=_TAGS)
    record = read_json_object(base_dir / MANIFEST, "base manifest")
    if record.get("files", {}).get(BASE_FILE) != stored.sha256:
        raise StorageError(f"{base_dir / BASE_FILE}: its sha256 is not the one in {base_dir / MANIFEST}; not publishing it")
    manifest = store.put_file(base_dir / MANIFEST, base_key(digest, MANIFEST), tags=_TAGS)
    return stored.bytes + manifest.bytes


def publish_bases(store: ObjectStore, checkpoints: Iterable[str | Path]) -> int:
    """Publish the base every checkpoint in `checkpoints` names (each once); the bytes sent."""
    from drape.training.checkpoints.checkpoint import base_of

    sent, done = 0, set()
    for checkpoint in checkpoints:
        digest = named_base(checkpoint)
        if digest is None or digest in done:
            continue
        base_dir = base_of(checkpoint)
        assert base_dir is not None
        sent += publish_base(store, base_dir)
        done.add(digest)
    return sent


def fetch_base(store: ObjectStore, digest: str, bases: Path) -> Path:
    """``<bases>/<digest>``, downloaded from the store when not there (verified against the stored
    manifest's sha256, renamed into place whole); its content hash is checked when a model loads."""
    check_digest(digest, "base to fetch")
    local = bases / digest
    if (local / BASE_FILE).is_file() and (local / MANIFEST).is_file():
        return local
    if not store.exists(base_key(digest, MANIFEST)):
        raise StorageError(f"base {digest}: not in the object store ({store.key_url(base_key(digest))}); it was never published")
    record = parse_json_object(store, base_key(digest, MANIFEST), "base manifest")
    expected = record.get("files", {}).get(BASE_FILE) if isinstance(record.get("files"), dict) else None
    if record.get("sha256") != digest or not isinstance(expected, str):
        raise StorageError(f"{store.key_url(base_key(digest, MANIFEST))}: not the manifest of base {digest}")
    staging = bases / f".{digest}.fetching"
    shutil.rmtree(staging, ignore_errors=True)
    store.get_file(base_key(digest, BASE_FILE), staging / BASE_FILE, sha256=expected)
    store.get_file(base_key(digest, MANIFEST), staging / MANIFEST)
    fsync_tree(staging)
    shutil.rmtree(local, ignore_errors=True)
    os.replace(staging, local)
    fsync_dir(bases)
    return local


def fetch_bases(store: ObjectStore, checkpoints: Iterable[str | Path], bases: Path | None) -> list[Path]:
    """The base of every stage checkpoint in `checkpoints` under `bases`, fetched where missing
    (a base already above the checkpoint, in any ``bases/`` folder, is used as it is; with `bases`
    None, one that is not there is a StorageError: the caller said where none may go)."""
    from drape.training.checkpoints.base import find_base

    found = []
    for checkpoint in checkpoints:
        digest = named_base(checkpoint)
        if digest is None:
            continue
        local = find_base(checkpoint, digest)
        if local is None and bases is None:
            raise StorageError(f"{checkpoint} names the frozen base {digest}, which is not on this node; pass where bases go")
        found.append(local or fetch_base(store, digest, bases))  # type: ignore[arg-type]
    return found


def named_bases(live: Path) -> set[str]:
    """The bases the checkpoints under `live` name (a folder that is not there names none)."""
    if not live.is_dir():
        return set()
    return {digest for manifest in live.rglob(MANIFEST) if (digest := _quiet_named(manifest.parent))}


def prune_live_bases(store: ObjectStore, bases: Path, live: Path) -> int:
    """Free the live bases that no checkpoint under `live` names, each only once its copy in the
    store reads back whole and matching; the bytes freed."""
    named = named_bases(live)
    freed = 0
    for base_dir in sorted(bases.iterdir()) if bases.is_dir() else []:
        if base_dir.name in named or not (base_dir / MANIFEST).is_file():
            continue
        record = read_json_object(base_dir / MANIFEST, "base manifest")
        size = (base_dir / BASE_FILE).stat().st_size
        try:
            store.verify(base_key(base_dir.name, BASE_FILE), size=size, sha256=record["files"][BASE_FILE])
        except (StorageError, KeyError, TypeError):
            continue  # no verified copy: it stays
        shutil.rmtree(base_dir)
        freed += size
    return freed


def _quiet_named(folder: Path) -> str | None:
    try:
        return named_base(folder)
    except ValueError:
        return None


def archive_bases(
    store: ObjectStore, checkpoints: Iterable[Path], *, run_id: str, stage: str, now: datetime, record: bool = True
) -> tuple[dict[Path, str], int]:
    """For each checkpoint folder in `checkpoints` that names a base: the base published (once,
    verified) and its archive records written (once, `record_base`). Returns checkpoint → the base
    it names, and the bytes of the bases recorded now: the archive that records a base counts it,
    whoever uploaded it (0 for a base the archive holds already: the run refers to it). Without
    `record` (a trainer publishing a checkpoint as it saves), published only: the stage's archive records it."""
    from drape.training.checkpoints.base import find_base

    named, recorded = dict[Path, str](), 0
    for checkpoint in checkpoints:
        digest = _quiet_named(checkpoint) if checkpoint.is_dir() else None  # unreadable: archived as it is
        if digest is None:
            continue
        base_dir = find_base(checkpoint, digest)
        if base_dir is None and not store.exists(base_key(digest, MANIFEST)):
            raise StorageError(
                f"{checkpoint} names the frozen base {digest}, which is in no bases/ above it and not in the object "
                f"store: nothing could reassemble it; bring the base back ({store.key_url(base_key(digest))}) first"
            )
        if base_dir is not None and digest not in named.values():  # else in the store: it is recorded by an archive that has it
            publish_base(store, base_dir)
            recorded += record_base(store, base_dir, run_id=run_id, stage=stage, now=now) if record else 0
        named[checkpoint] = digest
    return named, recorded


def record_base(store: ObjectStore, base_dir: Path, *, run_id: str, stage: str, now: datetime) -> int:
    """Write a published base's archive records (its manifest's first: deleting it uncommits the
    base) unless the store has them; the bytes they record (0: there already). `run_id`, `stage`:
    the first archive that named it. Its ``expires_at`` starts empty: the sweep keeps it
    (`base_lifetimes`), and removes the records' object when it deletes the base (the sweep's own
    manifest keeps the deletion), so a base published again is recorded again."""
    digest = check_digest(base_dir.name, str(base_dir))
    key = base_record_key(digest)
    if store.exists(key):
        return 0
    files = read_json_object(base_dir / MANIFEST, "base manifest").get("files", {})
    records: list[dict] = []
    for name in (MANIFEST, BASE_FILE):
        sha256 = files.get(BASE_FILE) if name == BASE_FILE else sha256_file(base_dir / MANIFEST)
        stored = base_key(digest, name)
        records.append(
            {
                "key": stored,
                "url": store.key_url(stored),
                "bytes": (base_dir / name).stat().st_size,
                "sha256": sha256,
                "run_id": run_id,
                "stage": stage,
                "kind": str(ArtifactKind.CHECKPOINT),
                "outcome": str(Outcome.BASELINE),
                "storage_class": "STANDARD",
                "archived_at": now.isoformat(),
                "expires_at": None,
                BASE_RECORD: digest,
                "lifetime": LIFETIME,
            }
        )
    store.put_bytes("".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode(), key)
    return sum((base_dir / name).stat().st_size for name in (MANIFEST, BASE_FILE))


def base_lifetimes(records: list[dict], updates: list[dict], live: set[str], now: datetime) -> list[dict]:
    """New records for the bases in `records` (the archive's, one per key) whose lifetime changed,
    given the sweep's `updates` to the rest and the bases `live` checkpoints name: ``expires_at``
    the latest of the archived checkpoints naming it, plus `EXPIRY_MARGIN` (None: one of them is
    kept forever, or a live checkpoint names it; once none does, the end it was given, else now);
    ``deleted_at`` once that is past."""
    current = {record["key"]: record for record in records} | {update["key"]: update for update in updates}
    holders: dict[str, list[str | None]] = {}
    for record in current.values():
        if record.get(NAMES_BASE) and not record.get("deleted_at"):
            holders.setdefault(record[NAMES_BASE], []).append(record.get("expires_at"))
    changed, stamp = [], now.isoformat()
    for record in sorted(records, key=lambda r: not r["key"].endswith(f"/{MANIFEST}")):  # manifests first
        digest = record.get(BASE_RECORD)
        if not digest:
            continue
        check_digest(digest, f"archive record of {record['key']}")
        expiries = holders.get(digest, [])
        due = None
        if digest not in live and expiries and None not in expiries:
            due = max(datetime.fromisoformat(e) for e in expiries if e) + EXPIRY_MARGIN
        elif digest not in live and not expiries:  # nothing names it now: the end it was given, else now
            due = datetime.fromisoformat(record["expires_at"]) if record.get("expires_at") else now
        expires = due.isoformat() if due else None
        if due is not None and due <= now:
            changed.append({**record, "expires_at": expires, "deleted_at": stamp, "recorded_at": stamp})
        elif record.get("expires_at") != expires:
            changed.append({**record, "expires_at": expires, "recorded_at": stamp})
    return changed

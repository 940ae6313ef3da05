"""Frozen bases in the object store: one copy each, under ``bases/<sha256>/``, shared by every run.

A stage checkpoint (`drape.training.checkpoint`) names the frozen base it was trained on by its
content hash; the base itself (``base.safetensors`` + ``manifest.json``, `drape.training.base`)
goes to the object store once, the first time a checkpoint that names it is published, snapshot
or archived (`publish_bases`), and comes back next to any checkpoint fetched onto a node that
lacks it (`fetch_bases`): a node that shares nothing but the object store can reassemble the
model. An upload is read back and verified before anything local is freed (`put_file`); a base
already in the store is not sent again, so four stages over one base archive it once.

Bases are tagged kind 'checkpoint', outcome 'baseline': no lifecycle rule expires them (every
checkpoint of every run over the same pretrained weights names the same base). A live base no
live checkpoint names any more goes once its copy in the store is verified (`prune_live_bases`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from drape import ArtifactKind, Outcome
from drape.jsonfile import parse_json_object, read_json_object
from drape.layout import base_key
from drape.storage.durable import fsync_dir, fsync_tree
from drape.storage.retention import TAG_KIND, TAG_OUTCOME
from drape.storage.store import ObjectStore, StorageError
from drape.training.base import BASE_FILE, check_digest

MANIFEST = "manifest.json"
_TAGS = {TAG_KIND: str(ArtifactKind.CHECKPOINT), TAG_OUTCOME: str(Outcome.BASELINE)}


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
    from drape.training.checkpoint import base_of

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
    from drape.training.base import find_base

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


def prune_live_bases(store: ObjectStore, bases: Path, live: Path) -> int:
    """Free the live bases that no checkpoint under `live` names, each only once its copy in the
    store reads back whole and matching; the bytes freed."""
    named = {digest for manifest in live.rglob(MANIFEST) if (digest := _quiet_named(manifest.parent))}
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

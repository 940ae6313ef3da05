"""The dataset manifest: the one file that names a dataset version's splits and shards.

A format module (the bottom of `drape.data`, beside `shards`): where a dataset lives in the
object store, how its control set and manifest are named by content, how a manifest read from
anywhere is checked before a path in it is used, and how a version is published (shards first,
the manifest last: its presence commits the version). Readers, datasets and importers build on it;
it imports nothing of theirs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from drape import layout
from drape.config import PipelineConfig
from drape.storage.checksum import sha256_bytes
from drape.storage.store import ObjectStore

MANIFEST = layout.DATASET_MANIFEST


def dataset_prefix(config: PipelineConfig) -> str:
    """The object-store prefix of the config's dataset (`drape.layout`)."""
    return layout.dataset_prefix(config.data.name, config.data.version)


def control_set_id(shards: list[dict]) -> str:
    """Content hash naming the control set: its shards' hashes in order."""
    return "control-" + sha256_bytes("".join(s["sha256"] for s in shards).encode())[:16]


def manifest_hash(manifest: dict) -> str:
    return sha256_bytes(json.dumps(manifest, sort_keys=True).encode())


def publish_dataset(local_dir: str | Path, store: ObjectStore, prefix: str) -> None:
    """Upload every shard (verified), then the manifest, which commits the dataset.

    A committed dataset version is immutable: publishing over one is an error.
    """
    local_dir = Path(local_dir)
    if store.exists(f"{prefix}/{MANIFEST}"):
        raise FileExistsError(f"{store.key_url(prefix)} already exists; dataset versions are immutable, choose a new version")
    manifest = json.loads((local_dir / MANIFEST).read_text())
    for shards in manifest["splits"].values():
        for shard in shards:
            store.put_file(local_dir / shard["path"], f"{prefix}/{shard['path']}")
    store.put_file(local_dir / MANIFEST, f"{prefix}/{MANIFEST}")


class ManifestError(ValueError):
    """A dataset manifest that cannot be trusted: the message names it, the field and what was expected."""


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_dataset_manifest(manifest: object, where: str) -> dict:
    """`manifest` (read from `where`) if it is a dataset manifest whose every name and shard path
    stays inside the cache and store (`layout.safe_name`, `layout.safe_key`) and whose shard
    records are well-formed; ManifestError naming the field otherwise."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
    try:
        layout.safe_name(manifest.get("name"), f"{where}: name")
        layout.safe_name(manifest.get("version"), f"{where}: version")
        splits = manifest.get("splits")
        if not isinstance(splits, dict) or not splits:
            raise ManifestError(f"{where}: splits: expected an object of split name → shard list")
        for split, shards in splits.items():
            layout.safe_name(split, f"{where}: split")
            if not isinstance(shards, list):
                raise ManifestError(f"{where}: splits.{split}: expected a list of shards")
            for i, shard in enumerate(shards):
                at = f"{where}: splits.{split}[{i}]"
                if not isinstance(shard, dict):
                    raise ManifestError(f"{at}: expected an object with path, bytes, sha256, samples")
                layout.safe_key(shard.get("path"), f"{at}.path")
                if not (_count(shard.get("bytes")) and _count(shard.get("samples"))):
                    raise ManifestError(f"{at}: bytes and samples must be integers >= 0")
                if not isinstance(shard.get("sha256"), str) or not _SHA256.fullmatch(shard["sha256"]):
                    raise ManifestError(f"{at}.sha256: expected 64 lowercase hex digits")
    except layout.UnsafePathError as error:
        raise ManifestError(str(error)) from None
    return manifest


def read_manifest(store: ObjectStore, prefix: str) -> dict | None:
    """The dataset manifest under `prefix`, checked (`check_dataset_manifest`); None when absent."""
    key = f"{prefix}/{MANIFEST}"
    if not store.exists(key):
        return None
    try:
        manifest = json.loads(store.read_bytes(key))
    except (ValueError, UnicodeDecodeError) as error:
        raise ManifestError(f"{store.key_url(key)}: not JSON ({error}); the dataset manifest is damaged") from None
    return check_dataset_manifest(manifest, store.key_url(key))

"""Hand-offs through the object store: what one node's process gives another's.

Nodes share nothing but the object store (docs/topology.md). The flow publishes a stage job's
spec and the weights it starts from; the trainer publishes every checkpoint once it is saved and
its result at the end; the flow fetches the candidate it gates. So a stage resumes on any node
from what the store holds, and a node's disk is a cache: losing it loses nothing but time.

- A checkpoint the trainer publishes is archived as the retention code archives anything (read
  back and verified, recorded in the run's archive manifest) with the outcome 'aborted' and its
  live copy kept: until the flow's archive step gives the stage its outcome, an abandoned stage's
  checkpoints expire like an aborted one's (`adopt_published` restamps them).
- A tree (the starting weights) is complete only once its file list, written last, is there.
- Everything read back is untrusted: keys stay inside their folder, sizes and hashes are checked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from drape import ArtifactKind, Outcome
from drape.jsonfile import parse_json_object
from drape.layout import UnsafePathError, archive_manifest_prefix, checkpoint_step, contained, new_manifest_key, run_key
from drape.storage.bases import fetch_bases
from drape.storage.durable import fsync_dir, fsync_tree
from drape.storage.retention import (
    LiveArtifact,
    RetentionAction,
    execute_plan,
    object_tags,
    read_archive_manifest,
    resolve,
)
from drape.storage.store import ObjectStore, StorageError

TREE_INDEX = "_files.json"
PUBLISHED = Outcome.ABORTED  # a published checkpoint's outcome until the flow's archive decides it
_FOLDERS = {"checkpoints": ArtifactKind.CHECKPOINT, "adapters": ArtifactKind.ADAPTER}


class HandoffError(StorageError):
    """A hand-off object that is missing, damaged or points outside its folder."""


def job_key(run_id: str, stage: str) -> str:
    return run_key(run_id, stage, "job.json")


def result_key(run_id: str, stage: str) -> str:
    return run_key(run_id, stage, "train-result.json")


def baseline_weights_key(stage: str, version: str) -> str:
    """Where a baseline's weights are handed to the nodes that start from them (one copy per version)."""
    return f"handoff/baselines/{stage}/v{version}"


# --- trees: a folder published whole --------------------------------------------------------------
def put_tree(store: ObjectStore, local_dir: str | Path, prefix: str) -> list[dict]:
    """Upload every file under `local_dir` (each verified), then its file list: the tree counts from then."""
    local = Path(local_dir)
    if store.exists(f"{prefix}/{TREE_INDEX}"):
        return tree_index(store, prefix)  # published already (by this or an earlier run)
    records = []
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        relative = file.relative_to(local).as_posix()
        stored = store.put_file(file, f"{prefix}/{relative}")
        records.append({"path": relative, "bytes": stored.bytes, "sha256": stored.sha256})
    store.put_bytes(json.dumps({"files": records}, sort_keys=True).encode(), f"{prefix}/{TREE_INDEX}")
    return records


def tree_index(store: ObjectStore, prefix: str) -> list[dict]:
    """The file list of a published tree, checked: relative paths, sizes, sha256 digests."""
    where = store.key_url(f"{prefix}/{TREE_INDEX}")
    try:
        files = parse_json_object(store, f"{prefix}/{TREE_INDEX}", "tree index")["files"]
    except StorageError:
        raise HandoffError(f"{where}: no such hand-off (was it published?)") from None
    except (ValueError, KeyError, TypeError) as error:
        raise HandoffError(f"{where}: not a hand-off file list ({error})") from None
    if not isinstance(files, list):
        raise HandoffError(f"{where}: 'files' is not a list")
    for record in files:
        if not (
            isinstance(record, dict)
            and isinstance(record.get("path"), str)
            and isinstance(record.get("bytes"), int)
            and 0 <= record["bytes"] < 2**44
            and re.fullmatch(r"[0-9a-f]{64}", str(record.get("sha256")))
        ):
            raise HandoffError(f"{where}: a file record needs path, bytes (0 to 16 TiB) and a sha256: {record!r}"[:400])
    return files


def get_tree(store: ObjectStore, prefix: str, local_dir: str | Path) -> Path:
    """Download a published tree to `local_dir`, each file verified; whole or not at all."""
    destination = Path(local_dir)
    staging = destination.with_name(f".{destination.name}.fetching")
    shutil.rmtree(staging, ignore_errors=True)
    for record in tree_index(store, prefix):
        try:
            target = contained(staging, record["path"], f"hand-off file {record['path']!r}")
        except UnsafePathError as error:
            raise HandoffError(f"{store.key_url(prefix)}: {error}") from None
        store.get_file(f"{prefix}/{record['path']}", target, sha256=record["sha256"])
    staging.mkdir(parents=True, exist_ok=True)
    fsync_tree(staging)
    shutil.rmtree(destination, ignore_errors=True)
    os.replace(staging, destination)
    fsync_dir(destination.parent)
    return destination


def published_at(store: ObjectStore, prefix: str) -> datetime:
    """When a tree was published: its file list's modification time (S3 LastModified), in UTC."""
    info = store.fs.info(store.path(f"{prefix}/{TREE_INDEX}"))
    stamp = info.get("LastModified") or info.get("mtime") or info.get("created")
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    return datetime.fromtimestamp(float(stamp), UTC)


def superseded_handoffs(
    store: ObjectStore, current_baseline_runs: dict[str, str], *, now: datetime, grace_days: float
) -> list[str]:
    """Baseline hand-offs (`handoff/baselines/<stage>/v<version>-<run>`) of a run that is no longer its
    stage's baseline, published more than `grace_days` before `now`: copies of archived baselines
    that no job starts from any more (a run that started from one has had the grace to fetch it).
    A stage without a current baseline keeps its hand-offs (an empty registry supersedes nothing)."""
    found = []
    for key in store.list("handoff/baselines"):
        parts = key.split("/")
        if len(parts) < 5 or parts[-1] != TREE_INDEX:
            continue
        stage, folder = parts[2], parts[3]
        run = folder.split("-", 1)[1] if folder.startswith("v") and "-" in folder else None
        current = current_baseline_runs.get(stage)
        prefix = "/".join(parts[:4])
        if run and current and run != current and (now - published_at(store, prefix)).total_seconds() > grace_days * 86400:
            found.append(prefix)
    return sorted(found)


def remove_tree(store: ObjectStore, prefix: str) -> int:
    """Delete a published tree: its file list first (it no longer counts), then its files; the bytes freed."""
    files = tree_index(store, prefix)
    store.fs.rm(store.path(f"{prefix}/{TREE_INDEX}"))
    for record in files:
        key = f"{prefix}/{record['path']}"
        if store.exists(key):
            store.fs.rm(store.path(key))
    return sum(record["bytes"] for record in files)


# --- checkpoints: published as the trainer saves them ---------------------------------------------
def publish_checkpoint(store: ObjectStore, path: str | Path, policy, *, run_id: str, stage: str) -> int:
    """Archive one checkpoint (or adapter) folder as 'published', keep its live copy; returns bytes sent."""
    path = Path(path)
    folder = path.parent.name
    if folder not in _FOLDERS:
        raise ValueError(f"{path}: a published checkpoint lives in one of {sorted(_FOLDERS)}")
    if not path.is_dir() or not any(p.is_file() for p in path.rglob("*")):
        raise HandoffError(f"{path}: no checkpoint files there: nothing to publish")
    artifact = LiveArtifact(str(path), _FOLDERS[folder], PUBLISHED, f"{folder}/{path.name}")
    lifetime, storage_class = resolve(policy, artifact.kind, PUBLISHED)
    action = RetentionAction(artifact, run_key(run_id, stage, artifact.relative), lifetime, storage_class, "run_end")
    prefix = archive_manifest_prefix(run_id, stage)
    # execute_plan sends the frozen base it names first: another node can then reassemble it (the
    # stage's archive records it, counted in the stage's archived bytes)
    return execute_plan([action], store, prefix, run_id=run_id, stage=stage, record_bases=False).archived_bytes


_STEP = re.compile(r"/(checkpoints|adapters)/(step-(\d+)(?:\.dcp)?)/")


def published(store: ObjectStore, run_id: str, stage: str, folder: str = "checkpoints") -> dict[str, list[dict]]:
    """name → archive records of every checkpoint (or adapter) of the stage in the store."""
    found: dict[str, list[dict]] = {}
    for record in read_archive_manifest(store, archive_manifest_prefix(run_id)):
        match = _STEP.search("/" + record["key"])
        if record.get("run_id") == run_id and record.get("stage") == stage and match and match.group(1) == folder:
            found.setdefault(match.group(2), []).append(record)
    return found


def newest_published(store: ObjectStore, run_id: str, stage: str, folder: str = "checkpoints") -> str | None:
    """The newest checkpoint of the stage that is whole in the store (`is_complete`), or None."""
    names = published(store, run_id, stage, folder)
    for name in sorted(names, key=lambda n: (checkpoint_step(n), not n.endswith(".dcp")), reverse=True):
        if is_complete(store, name, names[name]):
            return name
    return None


def is_complete(store: ObjectStore, name: str, records: list[dict]) -> bool:
    """Whether every file the checkpoint's manifest lists is recorded: the nodes of a multi-node job
    publish their own ranks' shards, and the manifest (rank 0's) may be there before the others'."""
    held = {record["key"].split(f"/{name}/", 1)[1] for record in records}
    manifest = next((r for r in records if r["key"].endswith(f"/{name}/manifest.json")), None)
    if manifest is None:
        return False
    try:
        listed = parse_json_object(store, manifest["key"], "checkpoint manifest").get("files", {})
    except (StorageError, ValueError, AttributeError):
        return False
    return isinstance(listed, dict) and set(listed) <= held


def fetch_checkpoint(
    store: ObjectStore, run_id: str, stage: str, name: str, directory: str | Path, *, bases: Path | None = None
) -> Path:
    """Bring checkpoint `name` of the stage back from the store into `directory` (verified, whole),
    and the frozen base it names into `bases` when no ``bases/`` above it holds it (`drape.storage.bases`)."""
    directory = Path(directory)
    folder = directory.name
    records = published(store, run_id, stage, folder if folder in _FOLDERS else "checkpoints").get(name)
    if not records:
        raise HandoffError(f"run {run_id} stage {stage}: no {name} in the object store's archive records")
    destination, staging = directory / name, directory / f".{name}.restoring"
    shutil.rmtree(staging, ignore_errors=True)  # a restore killed half-way
    for record in records:
        relative = record["key"].split(f"/{name}/", 1)[1]
        try:
            target = contained(staging, relative, f"archive record key {record['key']!r}")
        except UnsafePathError as error:
            raise HandoffError(f"{error}; it leads outside {destination}") from None
        store.get_file(record["key"], target, sha256=record["sha256"])
    fsync_tree(staging)
    shutil.rmtree(destination, ignore_errors=True)
    fetch_bases(store, [staging], bases)  # before it counts: a checkpoint here can be reassembled
    os.replace(staging, destination)  # whole, or not there: never a half checkpoint to resume from
    fsync_dir(directory)
    return destination


def adopt_published(store: ObjectStore, policy, *, run_id: str, stage: str, outcome: str, done: set[str]) -> tuple[int, int]:
    """Give the stage's published checkpoints that the archive did not just record
    (`done`: key prefixes) the stage's `outcome`: a new record each, and on S3 the tags and class
    its lifecycle rules read.
    Returns the objects and bytes adopted (part of the stage's archive)."""
    now = datetime.now(UTC)
    adopted = []
    for record in read_archive_manifest(store, archive_manifest_prefix(run_id)):  # the run's manifests (a folder)
        just_archived = any(record["key"] == prefix or record["key"].startswith(prefix + "/") for prefix in done)
        if record.get("outcome") != PUBLISHED or just_archived or record.get("stage") != stage:
            continue
        lifetime, storage_class = resolve(policy, record["kind"], outcome)
        if store.is_s3:
            artifact = LiveArtifact("", record["kind"], outcome, "")
            tags = object_tags(artifact, stage)
            store.restamp(record["key"], tags, size=record["bytes"], sha256=record["sha256"], storage_class=storage_class)
        expires = (now + timedelta(days=lifetime)).isoformat() if lifetime else None
        adopted.append({**record, "outcome": outcome, "storage_class": storage_class, "recorded_at": now.isoformat(),
                        "expires_at": expires})  # fmt: skip
    if adopted:
        key = new_manifest_key(archive_manifest_prefix(run_id, stage), now)
        store.put_bytes("".join(json.dumps(r, sort_keys=True) + "\n" for r in adopted).encode(), key)
    return len(adopted), sum(int(r["bytes"]) for r in adopted)

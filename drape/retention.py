"""Retention: move what neither the active run nor a current baseline needs to the object store.

`plan_retention` is pure: from the artifacts found in a finished stage's live directory and the
policy it decides, per artifact, the object key, lifetime and storage class. `execute_plan`
uploads each artifact, verifies the copy by reading it back (size + sha256), and only then frees
the live copy; every archived file is recorded in an append-only JSON-lines manifest object
(one object per archive call, never rewritten).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from drape.config import RetentionConfig
from drape.storage import ObjectStore, remove_tree

OUTCOMES = ("baseline", "superseded_baseline", "passed", "failed_candidate", "aborted")


@dataclass(frozen=True)
class LiveArtifact:
    path: str  # file or directory in live storage
    kind: str
    outcome: str
    relative: str  # path under the stage directory, used in the object key


@dataclass(frozen=True)
class RetentionAction:
    artifact: LiveArtifact
    key_prefix: str
    lifetime_days: int | None
    storage_class: str
    free_live: bool


def classify_stage_dir(stage_dir: str | Path, outcome: str) -> list[LiveArtifact]:
    """Artifacts a stage left in its live directory (checkpoints, gate files, superseded baseline).

    When the stage passed, its newest checkpoint is the one just promoted: it is archived as
    outcome 'baseline' (kept while it is the baseline; the sweep retags it once superseded).
    """
    stage_dir, found = Path(stage_dir), []
    steps = sorted((stage_dir / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1])) \
        if (stage_dir / "checkpoints").is_dir() else []
    for step in steps:
        promoted = outcome == "passed" and step == steps[-1]
        found.append(LiveArtifact(str(step), "checkpoint", "baseline" if promoted else outcome, f"checkpoints/{step.name}"))
    kinds = {"gate/outputs": "validation_output", "gate/latents.safetensors": "latent_snapshot",
             "gate/report.json": "gate_report", "gate/grid.png": "validation_output"}
    for relative, kind in kinds.items():
        path = stage_dir / relative
        if path.exists():
            found.append(LiveArtifact(str(path), kind, outcome, relative))
    superseded = stage_dir / "superseded-baseline"
    if superseded.exists():
        for child in sorted(superseded.iterdir()):
            kind = "checkpoint" if child.name == "checkpoint" else "validation_output"
            found.append(LiveArtifact(str(child), kind, "superseded_baseline", f"superseded-baseline/{child.name}"))
    return found


def plan_retention(artifacts: list[LiveArtifact], policy: RetentionConfig, *, key_root: str) -> list[RetentionAction]:
    """One action per artifact: archive under `key_root`, with the policy's lifetime and class."""
    actions = []
    for artifact in artifacts:
        lifetime, storage_class = policy.resolve(artifact.kind, artifact.outcome)
        actions.append(RetentionAction(artifact, f"{key_root}/{artifact.relative}", lifetime, storage_class,
                                       free_live=policy.rule_for(artifact.kind).archive))
    return actions


def _files(path: Path) -> list[tuple[Path, str]]:
    if path.is_file():
        return [(path, "")]
    return [(p, str(p.relative_to(path))) for p in sorted(path.rglob("*")) if p.is_file()]


TAG_KIND, TAG_OUTCOME, TAG_STAGE = "drape-kind", "drape-outcome", "drape-stage"


def object_tags(artifact: LiveArtifact, stage: str) -> dict[str, str]:
    """The tags drape sets at upload; S3 lifecycle rules select on kind and outcome."""
    return {TAG_KIND: artifact.kind, TAG_OUTCOME: artifact.outcome, TAG_STAGE: stage}


@dataclass
class ArchiveResult:
    archived_files: int = 0
    archived_bytes: int = 0
    freed_bytes: int = 0
    manifest_key: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: SIGKILL this process when DRAPE_CRASH_AT names `name`."""
    if os.environ.get("DRAPE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def execute_plan(actions: list[RetentionAction], store: ObjectStore, manifest_prefix: str, *, run_id: str,
                 stage: str, now: datetime | None = None) -> ArchiveResult:
    """Upload and verify every file, write a new manifest object, then free the live copies.

    Killed at any point, nothing is lost and a rerun completes: live files are freed only after
    the manifest recording their verified copies is published; verified objects are not uploaded
    again; each call writes its own manifest object (``<prefix>-<time>-<id>.jsonl``), never
    rewriting one, and readers keep one record per key.
    """
    now = now or datetime.now(timezone.utc)  # lifetimes count from here
    manifest_key = f"{manifest_prefix}-{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}.jsonl"
    result, records = ArchiveResult(manifest_key=manifest_key), []
    for action in actions:
        for file, inner in _files(Path(action.artifact.path)):
            key = f"{action.key_prefix}/{inner}" if inner else action.key_prefix
            stored = store.put_file(file, key, tags=object_tags(action.artifact, stage), storage_class=action.storage_class)
            expires = (now + timedelta(days=action.lifetime_days)).isoformat() if action.lifetime_days else None
            records.append({"key": key, "url": stored.url, "bytes": stored.bytes, "sha256": stored.sha256, "run_id": run_id,
                            "stage": stage, "kind": action.artifact.kind, "outcome": action.artifact.outcome,
                            "storage_class": action.storage_class, "archived_at": now.isoformat(), "expires_at": expires})
            result.archived_files += 1
            result.archived_bytes += stored.bytes
            crash_point(f"after-upload-{result.archived_files}")
    if not records:
        return result
    crash_point("before-manifest")
    store.put_bytes("".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode(), manifest_key)
    crash_point("after-manifest")
    for action in actions:
        if action.free_live:
            path = Path(action.artifact.path)
            for file, _ in _files(path):
                result.freed_bytes += file.stat().st_size
            remove_tree(path)
            crash_point("after-first-free")
    return result


def read_archive_manifest(store: ObjectStore, prefix: str = "archive/manifests", *, include_deleted: bool = False) -> list[dict]:
    """One record per archived key, the most recent (by `recorded_at`, else `archived_at`), from
    every manifest object under `prefix`; keys the sweep deleted are left out unless asked for."""
    records: dict[str, dict] = {}
    for key in store.list(prefix):
        for line in store.read_bytes(key).decode().splitlines():
            if line.strip():
                record = json.loads(line)
                current = records.get(record["key"])
                if current is None or _recorded(record) >= _recorded(current):
                    records[record["key"]] = record
    return [r for r in records.values() if include_deleted or not r.get("deleted_at")]


def _recorded(record: dict) -> str:
    return record.get("recorded_at") or record["archived_at"]


def verify_archived(store: ObjectStore, records: list[dict]) -> None:
    """Read every archived object back and check size and sha256 against its record."""
    for record in records:
        store.verify(record["key"], size=record["bytes"], sha256=record["sha256"])

"""Retention: move what neither the active run nor a current baseline needs to the object store.

`plan_retention` is pure: from the artifacts found in a finished stage's live directory and the
policy it decides, per artifact, the object key, lifetime, storage class and how long the live
copy stays. `execute_plan` uploads each artifact, verifies the copy by reading it back (size +
sha256), and only then frees the live copies due at stage end; every archived file is recorded in
an append-only JSON-lines manifest object (one object per archive call, never rewritten). A stage
checkpoint's records name its frozen base, which is archived once for every run over it and lives
as long as a checkpoint naming it (`drape.storage.bases`).
`release_run` frees, when the run ends, what the policy kept live until then, each file checked
against its archived copy first.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from drape import ArtifactKind, Outcome
from drape.config import BASELINE_LIVE_KINDS, OutcomeRule, RetentionConfig, RetentionRule
from drape.layout import (
    ADAPTERS,
    ARCHIVE_MANIFESTS,
    GATE_FILES,
    SUPERSEDED_BASELINE,
    StagePaths,
    archive_manifest_prefix,
    artifact_kind,
    checkpoint_dirs,
    is_sharded_checkpoint,
    new_manifest_key,
    run_key_of,
)
from drape.storage.checksum import sha256_file
from drape.storage.store import ObjectStore, StorageError, remove_tree


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
    live_until: str  # 'stage_end', 'run_end' or 'baseline' (RetentionConfig.live_until)

    @property
    def free_at_stage_end(self) -> bool:
        # a baseline's live copy is the one in baselines/<stage>/; the stage directory's goes now
        return self.live_until != "run_end"


def classify_stage_dir(stage_dir: str | Path, outcome: str) -> list[LiveArtifact]:
    """Artifacts a stage left in its live directory (checkpoints, gate files, superseded baseline).

    Checkpoints are whole (``step-N``) or sharded intermediates (``step-N.dcp``), named and ordered
    by `drape.layout`. When the stage passed, its newest whole checkpoint is the one just promoted:
    it is archived as outcome 'baseline' (kept while it is the baseline; the sweep retags it once
    superseded). A LoRA pass's adapters (``adapters/step-N``) are kind 'adapter', with the stage's
    outcome: they live as long as `retention.rules.adapter` says, apart from the merged checkpoint.
    """
    paths, found = StagePaths(Path(stage_dir)), []
    steps = checkpoint_dirs(paths.checkpoints)
    whole = [step for step in steps if not is_sharded_checkpoint(step)]
    promoted = whole[-1] if outcome == Outcome.PASSED and whole else None
    for step in steps:
        found.append(
            LiveArtifact(
                str(step), ArtifactKind.CHECKPOINT, Outcome.BASELINE if step == promoted else outcome, f"checkpoints/{step.name}"
            )
        )
    for adapter in checkpoint_dirs(paths.adapters):  # a LoRA pass's adapters: their own kind and lifetime
        found.append(LiveArtifact(str(adapter), ArtifactKind.ADAPTER, outcome, f"{ADAPTERS}/{adapter.name}"))
    for relative in GATE_FILES:
        if (paths.root / relative).exists():
            found.append(LiveArtifact(str(paths.root / relative), artifact_kind(relative), outcome, relative))
    if paths.superseded_baseline.exists():
        for child in sorted(paths.superseded_baseline.iterdir()):
            relative = f"{SUPERSEDED_BASELINE}/{child.name}"
            found.append(LiveArtifact(str(child), artifact_kind(relative), Outcome.SUPERSEDED_BASELINE, relative))
    return found


def _rule(policy: RetentionConfig, kind: str) -> RetentionRule:
    return policy.rules.get(kind, RetentionRule())


def resolve(policy: RetentionConfig, kind: str, outcome: str) -> tuple[int | None, str]:
    """(lifetime in days or None for forever, storage class) of an archived `kind` with `outcome`."""
    rule = _rule(policy, kind)
    override = rule.outcomes.get(outcome, OutcomeRule())
    storage_class = override.storage_class or rule.storage_class
    if outcome == Outcome.BASELINE:
        return None, storage_class
    defaults: dict[str, int] = {
        Outcome.SUPERSEDED_BASELINE: policy.baseline_grace_days,
        Outcome.FAILED_CANDIDATE: policy.failed_lifetime_days,
        Outcome.ABORTED: policy.failed_lifetime_days,
    }
    return override.lifetime_days or defaults.get(outcome, rule.lifetime_days), storage_class


def live_until(policy: RetentionConfig, kind: str, outcome: str) -> str:
    """'stage_end', 'run_end' or 'baseline' (only ever for outcome 'baseline') for a `kind` with `outcome`."""
    if outcome == Outcome.BASELINE and kind in BASELINE_LIVE_KINDS:
        return "baseline"
    rule = _rule(policy, kind)
    chosen = rule.outcomes.get(outcome, OutcomeRule()).live_until or rule.live_until
    return "stage_end" if chosen == "baseline" and outcome != Outcome.BASELINE else chosen


def plan_retention(artifacts: list[LiveArtifact], policy: RetentionConfig, *, key_root: str) -> list[RetentionAction]:
    """One action per artifact: archive under `key_root`, with the policy's lifetime and class."""
    actions = []
    for artifact in artifacts:
        lifetime, storage_class = resolve(policy, artifact.kind, artifact.outcome)
        actions.append(
            RetentionAction(
                artifact,
                f"{key_root}/{artifact.relative}",
                lifetime,
                storage_class,
                live_until(policy, artifact.kind, artifact.outcome),
            )
        )
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


def execute_plan(
    actions: list[RetentionAction],
    store: ObjectStore,
    manifest_prefix: str,
    *,
    run_id: str,
    stage: str,
    now: datetime | None = None,
    record_bases: bool = True,
) -> ArchiveResult:
    """Upload and verify every file, write a new manifest object, then free the live copies due now.

    Killed at any point, nothing is lost and a rerun completes: live files are freed only after
    the manifest recording their verified copies is published; verified objects are not uploaded
    again; each call writes its own manifest object (``<prefix>-<time>-<id>.jsonl``), never
    rewriting one, and readers keep one record per key.
    """
    from drape.storage.bases import NAMES_BASE, archive_bases  # bases.py reads this module's tags

    now = now or datetime.now(UTC)  # lifetimes count from here
    manifest_key = new_manifest_key(manifest_prefix, now)
    result, records = ArchiveResult(manifest_key=manifest_key), []
    # the frozen bases the checkpoints name go first (once in the store for every run over them, verified)
    checkpoints = [Path(a.artifact.path) for a in actions if a.artifact.kind == ArtifactKind.CHECKPOINT]
    named, result.archived_bytes = archive_bases(store, checkpoints, run_id=run_id, stage=stage, now=now, record=record_bases)
    for action in actions:
        base = named.get(Path(action.artifact.path))
        for file, inner in _files(Path(action.artifact.path)):
            key = f"{action.key_prefix}/{inner}" if inner else action.key_prefix
            tags = object_tags(action.artifact, stage)
            stored = store.put_file(file, key, tags=tags, storage_class=action.storage_class)
            if store.is_s3 and store.get_tags(key) != tags:  # there already (a trainer published it): retag it
                store.restamp(key, tags, size=stored.bytes, sha256=stored.sha256, storage_class=action.storage_class)
            record = _record(action, key, stored, run_id=run_id, stage=stage, now=now)
            records.append({**record, NAMES_BASE: base} if base else record)
            result.archived_files += 1
            result.archived_bytes += stored.bytes
            crash_point(f"after-upload-{result.archived_files}")
    if not records:
        return result
    crash_point("before-manifest")
    store.put_bytes("".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode(), manifest_key)
    crash_point("after-manifest")
    for action in actions:
        if action.free_at_stage_end:
            path = Path(action.artifact.path)
            for file, _ in _files(path):
                result.freed_bytes += file.stat().st_size
            remove_tree(path)
            crash_point("after-first-free")
    return result


def _record(action: RetentionAction, key: str, stored, *, run_id: str, stage: str, now: datetime) -> dict:
    """The archive record of one verified object: what it is, where, and until when it lives."""
    expires = (now + timedelta(days=action.lifetime_days)).isoformat() if action.lifetime_days else None
    return {
        "key": key,
        "url": stored.url,
        "bytes": stored.bytes,
        "sha256": stored.sha256,
        "run_id": run_id,
        "stage": stage,
        "kind": action.artifact.kind,
        "outcome": action.artifact.outcome,
        "storage_class": action.storage_class,
        "archived_at": now.isoformat(),
        "expires_at": expires,
    }


@dataclass
class ReleaseResult:
    freed_files: int = 0
    freed_bytes: int = 0
    kept: list[str] = field(default_factory=list)  # live files with no verified archived copy: never freed

    def to_dict(self) -> dict:
        return asdict(self)


def release_run(store: ObjectStore, run_dir: str | Path, run_id: str) -> ReleaseResult:
    """At run end: free what stayed live until then, each file only when its archived copy is verified.

    A live file under ``runs/<run_id>/`` is freed when the run's archive manifest records its key
    with the same size and sha256 as the local file and the object reads back with them; anything
    else stays where it is and is listed in `kept`. Killed part-way, a rerun finishes the job.
    """
    run_dir, result = Path(run_dir), ReleaseResult()
    if not run_dir.is_dir():
        return result
    records = {r["key"]: r for r in read_archive_manifest(store, archive_manifest_prefix(run_id))}  # run ids: fixed length
    for file in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        key = run_key_of(run_dir, run_id, file)
        record, size = records.get(key), file.stat().st_size
        if record is None or record["bytes"] != size or sha256_file(file) != record["sha256"]:
            result.kept.append(str(file))
            continue
        try:
            store.verify(key, size=size, sha256=record["sha256"])
        except StorageError:  # the copy is gone or bad (e.g. expired during a long run): keep the live file
            result.kept.append(str(file))
            continue
        file.unlink()
        result.freed_files += 1
        result.freed_bytes += size
        crash_point("after-first-release")
    return result


def read_archive_manifest(store: ObjectStore, prefix: str = ARCHIVE_MANIFESTS, *, include_deleted: bool = False) -> list[dict]:
    """One record per archived key, the most recent (by `recorded_at`, else `archived_at`), from
    every manifest object under `prefix`; keys the sweep deleted are left out unless asked for."""
    records: dict[str, dict] = {}
    for key in store.list(prefix):
        for number, line in enumerate(store.read_bytes(key).decode(errors="replace").splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError as error:
                    raise StorageError(f"{store.key_url(key)} line {number}: not a JSON archive record ({error})") from None
                if not isinstance(record, dict) or not isinstance(record.get("key"), str):
                    raise StorageError(f"{store.key_url(key)} line {number}: an archive record needs a string 'key'")
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

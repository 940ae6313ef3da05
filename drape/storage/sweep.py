"""The retention sweep: enforce lifetimes where lifecycle rules cannot, retag superseded baselines.

1. Archived checkpoints recorded as outcome 'baseline' whose run is no longer the stage's current
   baseline (the `drape-tryon` alias points elsewhere) become 'superseded_baseline', expiring
   `baseline_grace_days` from now. On S3 each is copied onto itself with the new tags
   (`ObjectStore.restamp`): its tags select the superseded-baseline lifecycle rule and its new
   creation date makes S3 count the grace period from now.
2. On stores without lifecycle rules (file://), objects past their `expires_at` are deleted.
3. Hand-off copies of superseded baselines (`handoff/baselines/<stage>/v<version>-<run>`, the
   weights stage jobs start from; drape/storage/handoff.py) published more than
   `baseline_grace_days` ago are deleted, on every store: they are copies of archived checkpoints.
4. Frozen bases (`drape.storage.bases`): each base's record takes the lifetime of the archived
   checkpoints that name it (`base_lifetimes`; never due while one is kept forever or a live
   checkpoint names it) and the base is deleted, on every store, once that is past.
Each change is appended as a new manifest object under ``archive/manifests/sweep/``; nothing is
rewritten. `dry_run` reports what would change and changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from drape import Outcome
from drape.config import RetentionConfig
from drape.layout import SWEEP_MANIFESTS, base_record_key, new_manifest_key, safe_key
from drape.storage.bases import BASE_RECORD, base_lifetimes
from drape.storage.handoff import remove_tree, superseded_handoffs
from drape.storage.retention import TAG_KIND, TAG_OUTCOME, TAG_STAGE, read_archive_manifest, resolve
from drape.storage.store import ObjectStore, StorageError
from drape.training.checkpoints.base import BASE_FILE


@dataclass
class SweepResult:
    retagged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    handoffs: list[str] = field(default_factory=list)  # superseded baselines' hand-off copies (deleted)
    freed_bytes: int = 0
    manifest_key: str = ""


def sweep(
    store: ObjectStore,
    policy: RetentionConfig,
    current_baseline_runs: dict[str, str],
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    allow_unregistered: bool = False,
    live_bases: set[str] | None = None,
) -> SweepResult:
    """`current_baseline_runs` maps stage → run id of its current baseline (from the registry);
    `live_bases`: the bases live checkpoints name (`drape.storage.bases.named_bases`), never due.

    A stage whose archived baselines have no baseline in the registry at all stops the sweep
    before any change (a wrong `tracking.uri` shows an empty registry: superseding every baseline
    would start their expiry), unless `allow_unregistered`."""
    now = now or datetime.now(UTC)
    result, updates = SweepResult(), []
    records = read_archive_manifest(store)
    if not allow_unregistered:
        _check_registered(records, current_baseline_runs)
    for record in records:
        safe_key(record.get("key"), "archive record key")  # one bad record stops the sweep before any change
        if record.get(BASE_RECORD):  # a base lives by what names it: step 4
            continue
        if record["outcome"] == Outcome.BASELINE and current_baseline_runs.get(record["stage"]) != record["run_id"]:
            grace = resolve(policy, record["kind"], Outcome.SUPERSEDED_BASELINE)[0] or policy.baseline_grace_days
            expires = (now + timedelta(days=grace)).isoformat()
            updates.append(
                {**record, "outcome": Outcome.SUPERSEDED_BASELINE.value, "expires_at": expires, "recorded_at": now.isoformat()}
            )
            result.retagged.append(record["key"])
        elif not store.is_s3 and record["expires_at"] and datetime.fromisoformat(record["expires_at"]) <= now:
            updates.append({**record, "deleted_at": now.isoformat(), "recorded_at": now.isoformat()})
            result.deleted.append(record["key"])
            result.freed_bytes += record["bytes"]
    _bases(records, updates, live_bases or set(), now, result)
    result.handoffs = superseded_handoffs(store, current_baseline_runs, now=now, grace_days=policy.baseline_grace_days)
    if dry_run:
        return result
    for prefix in result.handoffs:
        result.freed_bytes += remove_tree(store, prefix)
    if not updates:
        return result
    result.manifest_key = new_manifest_key(SWEEP_MANIFESTS, now, separator="/")
    store.put_bytes("".join(json.dumps(u, sort_keys=True) + "\n" for u in updates).encode(), result.manifest_key)
    for update in updates:  # the manifest says it first; then the store is made to match
        if update.get("deleted_at"):
            _delete(store, update)
        elif store.is_s3:
            store.restamp(
                update["key"],
                {TAG_KIND: update["kind"], TAG_OUTCOME: update["outcome"], TAG_STAGE: update["stage"]},
                size=update["bytes"],
                sha256=update["sha256"],
            )
    return result


def _check_registered(records: list[dict], current_baseline_runs: dict[str, str]) -> None:
    """StorageError when archived baselines of a stage have no baseline in the registry at all."""
    orphaned = sorted(
        {
            r["stage"]
            for r in records
            if r.get("outcome") == Outcome.BASELINE and not r.get(BASE_RECORD) and r.get("stage") not in current_baseline_runs
        }
    )
    if orphaned:
        raise StorageError(
            f"the archive holds baselines of stage(s) {', '.join(orphaned)} that the registry has no baseline for: "
            "is tracking.uri the registry that promoted them? Nothing was changed; to supersede them anyway, "
            "sweep with --allow-unregistered"
        )


def _bases(records: list[dict], updates: list[dict], live: set[str], now: datetime, result: SweepResult) -> None:
    """Step 4: the frozen bases' new lifetimes (`base_lifetimes`) added to `updates`, deletions to `result`."""
    for update in base_lifetimes(records, updates, live, now):
        updates.append(update)
        if update.get("deleted_at"):
            result.deleted.append(update["key"])
            result.freed_bytes += update["bytes"]


def _delete(store: ObjectStore, update: dict) -> None:
    """Delete an expired object; after a base's file, its records' object too (the sweep's manifest
    keeps the deletion): a base published again is recorded again."""
    keys = [update["key"]]
    if update.get(BASE_RECORD) and update["key"].endswith(f"/{BASE_FILE}"):
        keys.append(base_record_key(update[BASE_RECORD]))
    for key in keys:
        if store.exists(key):
            store.fs.rm(store.path(key))

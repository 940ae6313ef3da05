"""What operators run outside any pipeline run: pre-staging a dataset onto a node, the retention sweep."""

from __future__ import annotations

from datetime import datetime

from drape import STAGES
from drape.config import PipelineConfig
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, read_manifest
from drape.layout import live_root
from drape.ops.tracking import Tracker
from drape.storage.bases import named_bases
from drape.storage.store import open_store
from drape.storage.sweep import sweep as run_sweep


def prestage_dataset(config: PipelineConfig, stage: str, keep: list[str] | None = None, progress=None) -> dict:
    """Pre-stage a split of the config's dataset outside any run (operators, the prestage flow)."""
    store = open_store(config)
    manifest = read_manifest(store, dataset_prefix(config))
    if manifest is None:
        raise FileNotFoundError(f"no dataset at {store.key_url(dataset_prefix(config))}; run `drape data shard` first")
    cache = ShardCache.from_config(config, store, dataset_prefix(config), manifest)
    result = cache.prestage(stage, keep=keep if keep is not None else ["control"], progress=progress)
    return {**result.to_dict(), "directory": str(cache.dataset_dir / stage)}


def sweep(
    config: PipelineConfig, *, dry_run: bool = False, now: datetime | None = None, allow_unregistered: bool = False
) -> dict:
    """The retention sweep (`drape.storage.sweep`) against the registry's current baselines."""
    tracker = Tracker(config)
    current: dict[str, str] = {}
    for stage in STAGES:
        version = tracker.get_baseline(stage)
        if version is not None:
            current[stage] = version.tags.get("drape.run_id", "")
    result = run_sweep(
        open_store(config),
        config.retention,
        current,
        now=now,
        dry_run=dry_run,
        allow_unregistered=allow_unregistered,
        live_bases=named_bases(live_root(config)),  # a base a live checkpoint names is never due
    )
    return {
        "dry_run": dry_run,
        "retagged": result.retagged,
        "deleted": result.deleted,
        "handoffs": result.handoffs,
        "freed_bytes": result.freed_bytes,
        "manifest_key": result.manifest_key,
    }

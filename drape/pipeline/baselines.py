"""The live baseline a stage starts from, brought back when the flow's node has lost it.

The flow's disk is a cache like any node's: a flow pod rescheduled onto another node, or a node
whose disk was replaced, has no ``baselines/<stage>/``. The registry is the truth: the version
aliased ``<stage>-baseline`` holds the weights and control outputs `snapshot` logged
(``snapshot/checkpoint``, ``snapshot/outputs``), so the live copy is rebuilt from it, verified
against the checkpoint's manifest, and published by a rename: whole or not there.
"""

from __future__ import annotations

import json
import os

from drape import Mode, previous_stage
from drape.config import PipelineConfig
from drape.pipeline.run import RunContext, resources
from drape.storage.bases import fetch_bases
from drape.storage.durable import fsync_dir, fsync_tree, write_synced
from drape.storage.store import remove_tree
from drape.training.checkpoints.checkpoint import verify_checkpoint


def baseline_source(context: RunContext, stage: str) -> str | None:
    """The stage whose baseline `stage` starts from: its own in a fine-tune, else the one before it."""
    return stage if context.mode is Mode.FINETUNE else previous_stage(stage)


def ensure_live_baseline(config: PipelineConfig, context: RunContext, stage: str) -> bool:
    """Rebuild the live baseline `stage` starts from out of the registry when this node lacks it;
    True when it did. Nothing to do with no baseline registered (`start_checkpoint` says what is missing)."""
    source = baseline_source(context, stage)
    if source is None:
        return False
    paths = context.layout.baseline(source)
    if (paths.checkpoint / "manifest.json").is_file():
        return False
    tracker = resources(config, context).tracker
    version = tracker.get_baseline(source)
    if version is None:
        return False
    remove_tree(paths.staging)
    paths.staging.mkdir(parents=True)
    tracker.download(f"{version.source}/checkpoint", paths.staging)
    tracker.download(f"{version.source}/outputs", paths.staging)
    verify_checkpoint(paths.staging / "checkpoint")  # every file against the manifest's sha256
    fetch_bases(resources(config, context).store, [paths.staging / "checkpoint"], context.layout.bases)  # its frozen base
    record = {
        "version": str(version.version),
        "run_id": version.tags.get("drape.run_id", ""),
        "stage": source,
        "control_set": version.tags.get("drape.control_set", ""),
    }
    write_synced(paths.staging / "baseline.json", json.dumps(record))
    fsync_tree(paths.staging)
    remove_tree(paths.root)  # an incomplete copy (no manifest): the registry's is the verified one
    os.replace(paths.staging, paths.root)
    fsync_dir(paths.root.parent)
    print(f"baseline {source}: v{record['version']} restored from the registry onto this node (verified)")
    return True

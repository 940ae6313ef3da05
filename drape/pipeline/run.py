"""A pipeline run's lifecycle: its context (ids, where it lives), the resources its steps share,
and its start, close and summary."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from drape import STAGES, Mode, parse_mode, stages_from
from drape.config import PipelineConfig
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, ensure_dataset, manifest_hash, read_manifest
from drape.gates.report import GateReport
from drape.layout import LiveLayout, StagePaths, live_root, run_key
from drape.ops import metrics
from drape.ops.metrics import push_metrics
from drape.ops.tracking import Tracker
from drape.storage.retention import release_run
from drape.storage.store import ObjectStore, open_store, remove_empty_dirs, tree_bytes
from drape.training.trainer import TrainResult


class GateFailed(RuntimeError):
    """A candidate missed its gate; the message names stage, check, value and threshold."""


@dataclass(frozen=True)
class RunContext:
    run_id: str
    run_name: str
    mode: Mode
    live_root: str
    mlflow_run_id: str
    stage_run_ids: dict[str, str]
    dataset_prefix: str
    data_manifest_hash: str
    control_set: str

    @property
    def layout(self) -> LiveLayout:
        return LiveLayout(Path(self.live_root))

    def paths(self, stage: str) -> StagePaths:
        return self.layout.stage(self.run_id, stage)

    def stage_dir(self, stage: str) -> Path:
        return self.paths(stage).root

    def baseline_dir(self, stage: str) -> Path:
        return self.layout.baseline(stage).root


@dataclass
class RunResources:
    """What every step of one run talks to, built once per run (and per process)."""

    store: ObjectStore
    tracker: Tracker
    cache: ShardCache


_RESOURCES: dict[str, RunResources] = {}
_RESOURCES_LOCK = threading.Lock()


def resources(config: PipelineConfig, context: RunContext) -> RunResources:
    """The run's store, tracker and shard cache: those `start_run` opened, or (in another process, or
    after `close_run` dropped them) built once from the config and the dataset manifest."""
    with _RESOURCES_LOCK:
        if context.run_id not in _RESOURCES:
            store = open_store(config)
            manifest = read_manifest(store, context.dataset_prefix)
            if manifest is None:
                raise FileNotFoundError(f"run {context.run_id}: no dataset at {store.key_url(context.dataset_prefix)}")
            _RESOURCES[context.run_id] = RunResources(
                store, Tracker(config), ShardCache.from_config(config, store, context.dataset_prefix, manifest)
            )
        return _RESOURCES[context.run_id]


@contextmanager
def timed(config: PipelineConfig, context: RunContext, stage: str, step: str):
    """Time a stage's step into drape_stage_step_seconds, then push the run's series for the stage."""
    started = time.perf_counter()
    try:
        yield
    finally:
        labels = {"run": context.run_id, "stage": stage, "step": step}
        metrics.STAGE_STEP_SECONDS.labels(**labels).set(time.perf_counter() - started)
        metrics.STAGE_FINISHED.labels(**labels).set(time.time())
        push_metrics(config, grouping={"run": context.run_id, "stage": stage})


def start_run(config: PipelineConfig, *, run_name: str | None = None, mode: str = Mode.FULL, progress=None) -> RunContext:
    """Create the run: dataset ready in the object store, MLflow runs open, control set staged."""
    mode = parse_mode(mode)
    store, tracker = open_store(config), Tracker(config)
    manifest = ensure_dataset(config, store, progress)
    run_id = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    run_name = run_name or f"{config.name}-{mode}-{run_id}"
    tags = {"drape.run_id": run_id, "drape.config": config.name, "drape.mode": mode}
    parent = tracker.start_run(run_name, tags)
    tracker.log_params(parent, {"config": json.dumps(config.model_dump(mode="json"), sort_keys=True), "mode": mode})
    children: dict[str, str] = {
        stage: tracker.start_run(f"{run_name}/{stage}", {**tags, "drape.stage": stage}, parent) for stage in STAGES
    }
    context = RunContext(
        run_id,
        run_name,
        mode,
        str(live_root(config)),
        parent,
        children,
        dataset_prefix(config),
        manifest_hash(manifest),
        manifest["control_set"],
    )
    cache = ShardCache.from_config(config, store, context.dataset_prefix, manifest)
    with _RESOURCES_LOCK:  # what this run's steps share, from the store, tracker and manifest opened here
        _RESOURCES[run_id] = RunResources(store, tracker, cache)
    cache.prestage("control")
    return context


def evict_from(config: PipelineConfig, context: RunContext, stage: str) -> None:
    """The run is over at `stage`: the shards pre-staged for it and later stages leave live storage."""
    cache = resources(config, context).cache
    for later in stages_from(stage):
        cache.evict(later)


def close_run(config: PipelineConfig, context: RunContext, status: str) -> dict:
    """End the run: free what stayed live until run end (verified copies only), close the MLflow runs."""
    run, run_dir = resources(config, context), context.layout.run_dir(context.run_id)
    released = release_run(run.store, run_dir, context.run_id)
    if released.kept:
        print(
            f"drape: run {context.run_id}: {len(released.kept)} live file(s) have no verified archived copy and stay "
            f"live: {released.kept[:3]}{' …' if len(released.kept) > 3 else ''}",
            file=sys.stderr,
        )
    for stage_run in context.stage_run_ids.values():
        run.tracker.end_run(stage_run, status)
    run.tracker.end_run(context.mlflow_run_id, status)
    remove_empty_dirs(run_dir)
    with _RESOURCES_LOCK:
        _RESOURCES.pop(context.run_id, None)
    return released.to_dict()


@dataclass(frozen=True)
class StageRecord:
    """What one passed stage did: the summary's row."""

    train: TrainResult
    gate: GateReport
    snapshot: dict
    archive: dict

    def row(self) -> dict:
        checks = {
            n: {"value": c.lower, "mean": c.mean, "threshold": c.threshold, "passed": c.passed}
            for n, c in self.gate.checks.items()
        }
        return {
            "stage": self.train.stage,
            "steps": self.train.steps,
            "final_loss": self.train.final_loss,
            "train_seconds": self.train.train_seconds,
            "data_wait_fraction": self.train.data_wait_fraction,
            "checks": checks,
            "verdict": self.gate.verdict,
            "version": self.snapshot["version"],
            "archived_bytes": self.archive["archived_bytes"],
            "live_bytes": self.archive["live_bytes_after"],
        }


def summarize(config: PipelineConfig, context: RunContext, records: list[StageRecord]) -> dict:
    """Close the run and return its summary (what the CLI prints): one row per stage plus where to look."""
    object_store = repr(resources(config, context).store)
    released = close_run(config, context, "FINISHED")
    return {
        "run_id": context.run_id,
        "run_name": context.run_name,
        "stages": [record.row() for record in records],
        "live_bytes": tree_bytes(context.live_root),
        "released_at_run_end_bytes": released["freed_bytes"],
        "tracking_uri": config.tracking_uri,
        "object_store": object_store,
        "gate_reports": f"{run_key(context.run_id, '<stage>', 'gate/report.json')} in the object store; "
        f"MLflow run {context.mlflow_run_id}",
    }

"""A pipeline run's lifecycle: its context (ids, where it lives), the resources its steps share,
and its start, close and summary."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from drape import STAGES, Mode, parse_mode, stages_from
from drape.config import PipelineConfig
from drape.cost import timeline
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, ensure_dataset, manifest_hash, read_manifest
from drape.layout import LiveLayout, StagePaths, live_root, run_key
from drape.ops import metrics
from drape.ops.logsink import tolerate_full_disks
from drape.ops.metrics import push_metrics
from drape.ops.tracking import Tracker
from drape.pipeline.resume import ResumeError, load_context, mark_closed, save_context
from drape.storage.lease import RunLease, acquire
from drape.storage.retention import release_run
from drape.storage.store import ObjectStore, open_store, remove_empty_dirs, tree_bytes

if TYPE_CHECKING:
    from drape.cost.account import Attempt
    from drape.training.jobs.stage_job import StageJobResult


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
    resumed: bool = False  # reopened by `start_run(resume=...)`: stages check what the run did before

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
_LEASES: dict[str, RunLease] = {}  # run id → the lease this process drives it under (`drape.storage.lease`)


def resources(config: PipelineConfig, context: RunContext) -> RunResources:
    """The run's store, tracker and shard cache: those `start_run` opened, or (in another process, or
    after `close_run` dropped them) built once from the config and the dataset manifest. Raises
    LeaseLost once another process took over the run's lease: this one touches the run no more."""
    with _RESOURCES_LOCK:
        if (lease := _LEASES.get(context.run_id)) is not None:
            lease.check()
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
    """Time a stage's step into drape_stage_step_seconds and the run's cost timeline (with what the
    step puts in the dict it yields), then push the run's series for the stage."""
    started, started_at, extra = time.perf_counter(), time.time(), dict[str, float]()
    try:
        yield extra
    finally:
        labels = {"run": context.run_id, "stage": stage, "step": step}
        metrics.STAGE_STEP_SECONDS.labels(**labels).set(time.perf_counter() - started)
        metrics.STAGE_FINISHED.labels(**labels).set(time.time())
        push_metrics(config, grouping={"run": context.run_id, "stage": stage})
        timeline.record_step(resources(config, context).store, context.run_id, stage, step, started_at, time.time(), **extra)


def log_train_summary(
    config: PipelineConfig, context: RunContext, stage: str, job: StageJobResult, window: tuple[float, float] | None = None
) -> None:
    """A stage job's result into the metrics, its MLflow run and the run's cost timeline (`window`:
    the job's own start and end when it ran in this process; a queue job's is its allocation)."""
    labels, result, run = {"run": context.run_id, "stage": stage}, job.train, resources(config, context)
    metrics.TRAIN_THROUGHPUT.labels(**labels).set(result.samples_per_second)
    metrics.TRAIN_STEPS.labels(**labels).set(result.steps)
    metrics.STAGE_STEP_SECONDS.labels(**labels, step="train").set(result.train_seconds)
    metrics.STAGE_FINISHED.labels(**labels, step="train").set(time.time())
    push_metrics(config, grouping=labels)
    timeline.record_train(run.store, context.run_id, job, window)
    run.tracker.log_metrics(
        context.stage_run_ids[stage],
        {
            f"{stage}/train_seconds": result.train_seconds,
            f"{stage}/data_wait_fraction": result.data_wait_fraction,
            f"{stage}/checkpoint_stall_seconds": result.checkpoint_stall_seconds,
            f"{stage}/final_loss": result.final_loss,
            f"{stage}/shard_read_wait_seconds": job.shard_read_wait_seconds,
        },
        result.steps,
    )


def start_run(
    config: PipelineConfig,
    *,
    run_name: str | None = None,
    mode: str = Mode.FULL,
    progress=None,
    resume: str | None = None,
    flow_run_id: str | None = None,
) -> RunContext:
    """Create the run (dataset ready in the object store, MLflow runs open, control set staged),
    or with `resume`, reopen that run where it was (`drape.pipeline.resume`)."""
    tolerate_full_disks()  # a flow run a worker started logs to the worker's file: a full disk must not end the run
    store, tracker = open_store(config), Tracker(config)
    if resume:
        context = _reopen(config, store, tracker, resume, parse_mode(mode), flow_run_id)
        manifest = read_manifest(store, context.dataset_prefix)
        if manifest is None or manifest_hash(manifest) != context.data_manifest_hash:
            release_lease(resume)
            raise ResumeError(f"run {resume}: its dataset {context.dataset_prefix} is gone or changed since the run started")
    else:
        manifest = ensure_dataset(config, store, progress)
        context = _new_run(config, tracker, run_name, parse_mode(mode), manifest)
        _take_lease(config, store, context.run_id, flow_run_id)  # before run.json: nobody resumes it meanwhile
        save_context(store, context, config.name, flow_run_id)
    timeline.record_open(store, context.run_id)
    cache = ShardCache.from_config(config, store, context.dataset_prefix, manifest)
    with _RESOURCES_LOCK:  # what this run's steps share, from the store, tracker and manifest opened here
        _RESOURCES[context.run_id] = RunResources(store, tracker, cache)
    cache.prestage("control")
    return context


def _new_run(config: PipelineConfig, tracker: Tracker, run_name: str | None, mode: Mode, manifest: dict) -> RunContext:
    run_id = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    run_name = run_name or f"{config.name}-{mode}-{run_id}"
    tags = {"drape.run_id": run_id, "drape.config": config.name, "drape.mode": mode}
    parent = tracker.start_run(run_name, tags)
    tracker.log_params(parent, {"config": json.dumps(config.model_dump(mode="json"), sort_keys=True), "mode": mode})
    children: dict[str, str] = {
        stage: tracker.start_run(f"{run_name}/{stage}", {**tags, "drape.stage": stage}, parent) for stage in STAGES
    }
    return RunContext(
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


def _take_lease(config: PipelineConfig, store: ObjectStore, run_id: str, flow_run_id: str | None) -> None:
    """Drive `run_id` under its lease from now on; raises RunHeld when another live process drives it."""
    lease = acquire(store, run_id, seconds=config.storage.run_lease_seconds, flow_run_id=flow_run_id)
    with _RESOURCES_LOCK:
        _LEASES[run_id] = lease


def release_lease(run_id: str) -> None:
    """Give up this process's lease on `run_id` (if it holds one): the run can be resumed at once."""
    with _RESOURCES_LOCK:
        lease = _LEASES.pop(run_id, None)
    if lease is not None:
        lease.release()


def release_flow_run_leases(flow_run_id: str) -> list[str]:
    """Release the leases a flow run took (its failure or crash hook); the run ids released."""
    with _RESOURCES_LOCK:
        runs = [run_id for run_id, lease in _LEASES.items() if lease.holder.flow_run == flow_run_id]
    for run_id in runs:
        release_lease(run_id)
    return runs


def _reopen(
    config: PipelineConfig, store: ObjectStore, tracker: Tracker, run_id: str, mode: Mode, flow_run_id: str | None
) -> RunContext:
    saved = load_context(store, run_id, config.name, RunContext)
    if saved.mode != mode:
        raise ResumeError(f"run {run_id} is a {saved.mode} run, not {mode}; resume it with --mode {saved.mode}")
    _take_lease(config, store, run_id, flow_run_id)  # a second start of the run stops here, before MLflow is touched
    context = replace(saved, mode=parse_mode(saved.mode), live_root=str(live_root(config)), resumed=True)
    for mlflow_run in [context.mlflow_run_id, *context.stage_run_ids.values()]:
        tracker.reopen_run(mlflow_run)
    print(f"drape: resuming run {run_id} ({context.run_name}) in {context.layout.run_dir(run_id)}")
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
    mark_closed(run.store, context.run_id, status)
    timeline.record_close(run.store, context.run_id, status)
    remove_empty_dirs(run_dir)
    metrics.flush_metrics(config)  # what pushes held while the Pushgateway was down, sent again
    with _RESOURCES_LOCK:
        _RESOURCES.pop(context.run_id, None)
    release_lease(context.run_id)
    return released.to_dict()


def summarize(config: PipelineConfig, context: RunContext, rows: list[dict], attempts: list[Attempt] | None = None) -> dict:
    """Close the run and return its summary (what the CLI prints): one row per stage (`archive_passed`),
    its cost (`attempts`: its jobs' GPU allocations from the queue; None: they could not be read)
    and where to look."""
    from drape.cost.report import record_cost

    run = resources(config, context)
    object_store, store, tracker = repr(run.store), run.store, run.tracker
    released = close_run(config, context, "FINISHED")
    cost = (
        record_cost(config, store, tracker, context.run_id, context.mlflow_run_id, attempts)
        if attempts is not None
        else {"error": f"the queue's allocation log could not be read; later: drape cost report {context.run_id}"}
    )
    return {
        "cost": cost,
        "run_id": context.run_id,
        "run_name": context.run_name,
        "stages": rows,
        "live_bytes": tree_bytes(context.live_root),
        "released_at_run_end_bytes": released["freed_bytes"],
        "tracking_uri": config.tracking_uri,
        "object_store": object_store,
        "gate_reports": f"{run_key(context.run_id)}/<stage>/gate/report.json in the object store; "
        f"MLflow run {context.mlflow_run_id}",
    }

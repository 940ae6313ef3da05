"""The stage operations a pipeline run is made of, one function per box of the DAG.

Each is one call for a Prefect task (`tasks/`), and runs just as well without Prefect. What they
read and write in live storage and the object store is laid out by `drape.layout`. A run's
object store, tracker and shard cache are built once (`resources`) and shared by its steps.

Invariant after every archive: the current baselines (weights without optimizer state, and their
control outputs), the control set, the shards of the stage in progress or next, and what the
retention policy keeps live until the run ends (`live_until: run_end`; by default nothing), which
`close_run` frees once its archived copy is verified.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from drape import STAGES, Mode, Outcome, Stage, parse_mode, previous_stage, stages_from
from drape.config import PipelineConfig
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, ensure_dataset, load_split, manifest_hash, read_manifest
from drape.gates.report import GateReport
from drape.gates.run import evaluate_gate, provenance_problems
from drape.layout import LiveLayout, StagePaths, archive_manifest_prefix, live_root, run_key
from drape.ops import metrics
from drape.ops.alerts import notify_gate
from drape.ops.metrics import push_metrics
from drape.ops.tracking import Tracker
from drape.storage.retention import classify_stage_dir, execute_plan, live_until, plan_retention, release_run
from drape.storage.store import ObjectStore, open_store, remove_tree, tree_bytes
from drape.storage.sweep import sweep as run_sweep
from drape.training.checkpoint import export_weights
from drape.training.stage_job import StageJob, StageJobResult
from drape.training.trainer import TrainResult

__all__ = ["GateFailed", "RunContext", "StageRecord", "live_root"]


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
    """The run's store, tracker and shard cache (the dataset manifest read once); `close_run` drops them."""
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
def _timed(config: PipelineConfig, context: RunContext, stage: str, step: str):
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
    children = {stage: tracker.start_run(f"{run_name}/{stage}", {**tags, "drape.stage": stage}, parent) for stage in STAGES}
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
    resources(config, context).cache.prestage("control")
    return context


def prestage(config: PipelineConfig, context: RunContext, stage: str, progress=None) -> dict:
    """Pre-stage `stage`'s shards into the shard cache, verified, keeping the control set and the
    stage before it (which may still be training); returns what was staged and evicted."""
    keep = ["control", *filter(None, [previous_stage(stage)])]
    with _timed(config, context, stage, "prestage"):
        result = resources(config, context).cache.prestage(stage, keep=keep, progress=progress)
        metrics.PRESTAGED_BYTES.labels(run=context.run_id, stage=stage).set(result.bytes)
        metrics.PRESTAGE_DOWNLOADED.labels(run=context.run_id, stage=stage).set(result.downloaded_bytes)
    return result.to_dict()


def prestage_dataset(config: PipelineConfig, stage: str, keep: list[str] | None = None, progress=None) -> dict:
    """Pre-stage a split of the config's dataset outside any run (operators, the prestage flow)."""
    store = open_store(config)
    manifest = read_manifest(store, dataset_prefix(config))
    if manifest is None:
        raise FileNotFoundError(f"no dataset at {store.key_url(dataset_prefix(config))}; run `drape data shard` first")
    cache = ShardCache.from_config(config, store, dataset_prefix(config), manifest)
    result = cache.prestage(stage, keep=keep if keep is not None else ["control"], progress=progress)
    return {**result.to_dict(), "directory": str(cache.dataset_dir / stage)}


def start_checkpoint(context: RunContext, stage: str) -> str | None:
    """Where `stage` starts: a fine-tune from its own baseline, a full run from the previous stage's
    baseline (None: fresh weights)."""
    source = stage if context.mode is Mode.FINETUNE else previous_stage(stage)
    checkpoint = context.layout.baseline(source).checkpoint if source else None
    return str(checkpoint) if checkpoint is not None and checkpoint.is_dir() else None


def stage_job(config: PipelineConfig, context: RunContext, stage: str) -> StageJob:
    """The stage's training job in this run: from `start_checkpoint`, into the run's stage directory."""
    return StageJob(
        config,
        Stage(stage),
        context.stage_dir(stage),
        context.mode,
        start_checkpoint(context, stage),
        context.run_id,
        context.stage_run_ids[stage],
    )


def train(config: PipelineConfig, context: RunContext, stage: str, progress=None) -> TrainResult:
    """Train the stage in this process on its pre-staged shards; logs to the stage's MLflow run."""
    run = resources(config, context)
    result = stage_job(config, context, stage).run(cache=run.cache, tracker=run.tracker, progress=progress)
    _log_train_summary(config, context, stage, result)
    return result.train


def train_command(config: PipelineConfig, context: RunContext, stage: str) -> tuple[list[str], Path]:
    """The stage's training as a queue job: the command (`python -m drape.train --job …`) and the
    file its result lands in."""
    paths = context.paths(stage)
    paths.train_result.unlink(missing_ok=True)
    return stage_job(config, context, stage).write(paths.job_config, result=paths.train_result), paths.train_result


def finish_train(config: PipelineConfig, context: RunContext, stage: str, result_path: str | Path) -> TrainResult:
    """The TrainResult a queue job wrote; logs the stage summary and removes the job's files."""
    path = Path(result_path)
    if not path.is_file():
        raise RuntimeError(f"stage {stage}: the train job ended without writing {path}")
    result = StageJobResult.from_dict(json.loads(path.read_text()))
    _log_train_summary(config, context, stage, result)
    path.unlink()
    context.paths(stage).job_config.unlink(missing_ok=True)
    return result.train


def _log_train_summary(config: PipelineConfig, context: RunContext, stage: str, job: StageJobResult) -> None:
    labels, result = {"run": context.run_id, "stage": stage}, job.train
    metrics.TRAIN_THROUGHPUT.labels(**labels).set(result.samples_per_second)
    metrics.TRAIN_STEPS.labels(**labels).set(result.steps)
    metrics.STAGE_STEP_SECONDS.labels(**labels, step="train").set(result.train_seconds)
    metrics.STAGE_FINISHED.labels(**labels, step="train").set(time.time())
    push_metrics(config, grouping=labels)
    resources(config, context).tracker.log_metrics(
        context.stage_run_ids[stage],
        {
            f"{stage}/train_seconds": result.train_seconds,
            f"{stage}/data_wait_fraction": result.data_wait_fraction,
            f"{stage}/final_loss": result.final_loss,
            f"{stage}/shard_read_wait_seconds": job.shard_read_wait_seconds,
        },
        result.steps,
    )


def _baseline(context: RunContext, stage: str, tracker: Tracker) -> tuple[dict | None, Path | None]:
    """The stage baseline's version info and a local directory with its control outputs."""
    version = tracker.get_baseline(stage)
    if version is None:
        return None, None
    info = {
        "version": str(version.version),
        "run_id": version.tags.get("drape.run_id", ""),
        "control_set": version.tags.get("drape.control_set", ""),
    }
    if info["control_set"] != context.control_set:
        raise ValueError(
            f"stage {stage}: baseline v{info['version']} was judged on control set {info['control_set']!r}, "
            f"this run uses {context.control_set!r}; outputs on different control sets cannot be compared"
        )
    local = context.layout.baseline(stage)
    recorded = json.loads(local.record.read_text()) if local.record.is_file() else {}
    if recorded.get("version") == info["version"] and local.outputs.is_dir():
        return info, local.outputs
    return info, tracker.download(f"{version.source}/outputs", context.paths(stage).baseline_download)


def gate(
    config: PipelineConfig,
    context: RunContext,
    stage: str,
    checkpoint: str,
    *,
    webhook_url: str | None = None,
    links: dict[str, str] | None = None,
) -> GateReport:
    """Judge the candidate on the control set vs thresholds and the stage baseline; log the report.

    A passing gate alerts only when `alerts.notify_on_pass` is set; failures alert in `reject`.
    """
    with _timed(config, context, stage, "gate"):
        report = _gate(config, context, stage, checkpoint)
        labels = {"run": context.run_id, "stage": stage}
        for name, check in report.checks.items():
            for aggregate, value in check.aggregates().items():
                metrics.GATE_VALUE.labels(**labels, check=name, aggregate=aggregate).set(value)
            if check.threshold is not None:
                metrics.GATE_THRESHOLD.labels(**labels, check=name).set(check.threshold)
        metrics.GATE_PASSED.labels(**labels).set(1.0 if report.passed else 0.0)
    if report.passed:
        print(f"gate-{stage}: passed ({_notify(config, context, report, webhook_url, links)})")
    return report


def _gate(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str) -> GateReport:
    run = resources(config, context)
    run.cache.prestage("control")  # normally local already; restores it if an operator cleared the cache
    control = load_split(run.cache.dataset_dir, run.cache.manifest, "control")
    baseline, baseline_outputs = _baseline(context, stage, run.tracker)
    paths = context.paths(stage)
    provenance = provenance_problems(
        config,
        checkpoint,
        stage=stage,
        data_manifest_hash=context.data_manifest_hash,
        start_checkpoint=start_checkpoint(context, stage),
    )
    report = evaluate_gate(
        config,
        stage=stage,
        run_id=context.run_id,
        checkpoint=checkpoint,
        control=control,
        control_set=context.control_set,
        gate_dir=paths.gate,
        baseline=baseline,
        baseline_outputs_dir=baseline_outputs,
        provenance=provenance,
    )
    remove_tree(paths.baseline_download)
    stage_run = context.stage_run_ids[stage]
    aggregates = {
        f"gate/{name}/{aggregate}": value
        for name, check in report.checks.items()
        for aggregate, value in check.aggregates().items()
    }
    run.tracker.log_metrics(stage_run, {**aggregates, "gate/passed": float(report.passed)})
    run.tracker.set_tags(stage_run, {"drape.gate.verdict": report.verdict})
    run.tracker.log_artifact(stage_run, paths.gate_report, "gate")
    run.tracker.log_artifact(stage_run, paths.gate_grid, "gate")
    return report


def snapshot(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str, report: GateReport) -> dict:
    """Register the passed checkpoint as `drape-tryon` ``<stage>-baseline`` and make it the live baseline."""
    with _timed(config, context, stage, "snapshot"):
        result = _snapshot(config, context, stage, checkpoint, report)
        metrics.PROMOTIONS.labels(run=context.run_id, stage=stage).inc()
        metrics.BASELINE_VERSION.labels(run=context.run_id, stage=stage).set(float(result["version"]))
    return result


def _stage_baseline(config: PipelineConfig, paths: StagePaths, checkpoint: str, staging: Path) -> None:
    """Assemble the next baseline in `staging`: weights, control outputs, and what the policy keeps live."""
    remove_tree(staging)
    staging.mkdir(parents=True)
    export_weights(checkpoint, staging / "checkpoint")  # the full checkpoint is archived with the run
    shutil.copytree(paths.gate_outputs, staging / "outputs")
    for file, kind in ((paths.gate_latents, "latent_snapshot"), (paths.gate_report, "gate_report")):
        if file.is_file() and live_until(config.retention, kind, Outcome.BASELINE) == "baseline":
            shutil.copy2(file, staging / file.name)  # live while this is the baseline (retention policy)


def _snapshot(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str, report: GateReport) -> dict:
    tracker, stage_run = resources(config, context).tracker, context.stage_run_ids[stage]
    paths, baseline = context.paths(stage), context.layout.baseline(stage)
    _stage_baseline(config, paths, checkpoint, baseline.staging)
    tracker.log_artifacts(stage_run, baseline.staging / "checkpoint", "snapshot/checkpoint")
    source = tracker.log_artifacts(stage_run, baseline.staging / "outputs", "snapshot/outputs").removesuffix("/outputs")
    tags = {
        "drape.stage": stage,
        "drape.run_id": context.run_id,
        "drape.control_set": context.control_set,
        **{f"drape.gate.{name}": f"{check.mean:.6f}" for name, check in report.checks.items()},
    }
    version = tracker.register_baseline(stage_run, source, stage, tags)
    (baseline.staging / "baseline.json").write_text(
        json.dumps({"version": version, "run_id": context.run_id, "stage": stage, "control_set": context.control_set})
    )
    if baseline.root.exists():
        os.replace(baseline.root, paths.superseded_baseline)
    os.replace(baseline.staging, baseline.root)
    return {"stage": stage, "version": version, "alias": f"{stage}-baseline", "checkpoint": str(baseline.checkpoint)}


def archive(config: PipelineConfig, context: RunContext, stage: str, outcome: str = Outcome.PASSED) -> dict:
    """Archive the stage's leftovers (verified), free them, and drop its pre-staged shards."""
    with _timed(config, context, stage, "archive"):
        result = _archive(config, context, stage, outcome)
        labels = {"run": context.run_id, "stage": stage}
        metrics.ARCHIVED_BYTES.labels(**labels).set(result["archived_bytes"])
        metrics.LIVE_BYTES.labels(**labels).set(result["live_bytes_after"])
        if config.retention.live_budget_bytes:
            metrics.LIVE_BUDGET.labels(**labels).set(config.retention.live_budget_bytes)
    return result


def _archive(config: PipelineConfig, context: RunContext, stage: str, outcome: str) -> dict:
    run, root, stage_dir = resources(config, context), Path(context.live_root), context.stage_dir(stage)
    live_before = tree_bytes(root)
    actions = plan_retention(classify_stage_dir(stage_dir, outcome), config.retention, key_root=run_key(context.run_id, stage))
    result = execute_plan(actions, run.store, archive_manifest_prefix(context.run_id, stage), run_id=context.run_id, stage=stage)
    for shard in run.cache.shards(stage):  # the object store holds the verified original
        run.store.verify(f"{context.dataset_prefix}/{shard['path']}", size=shard["bytes"], sha256=shard["sha256"])
    run.cache.evict(stage)
    _remove_empty(stage_dir)
    live_after = tree_bytes(root)
    run.tracker.log_metrics(
        context.stage_run_ids[stage],
        {
            f"{stage}/archived_bytes": result.archived_bytes,
            f"{stage}/live_bytes_before": live_before,
            f"{stage}/live_bytes_after": live_after,
        },
    )
    return {**result.to_dict(), "stage": stage, "live_bytes_before": live_before, "live_bytes_after": live_after}


def sweep(config: PipelineConfig, *, dry_run: bool = False, now: datetime | None = None) -> dict:
    """The retention sweep (`drape.storage.sweep`) against the registry's current baselines."""
    tracker = Tracker(config)
    current = {}
    for stage in STAGES:
        version = tracker.get_baseline(stage)
        if version is not None:
            current[stage] = version.tags.get("drape.run_id", "")
    result = run_sweep(open_store(config), config.retention, current, now=now, dry_run=dry_run)
    return {
        "dry_run": dry_run,
        "retagged": result.retagged,
        "deleted": result.deleted,
        "freed_bytes": result.freed_bytes,
        "manifest_key": result.manifest_key,
    }


def _remove_empty(directory: Path) -> None:
    for path in (
        sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) if directory.exists() else []
    ):
        if not any(path.iterdir()):
            path.rmdir()
    if directory.exists() and not any(directory.iterdir()):
        directory.rmdir()


def _notify(
    config: PipelineConfig, context: RunContext, report: GateReport, webhook_url: str | None, links: dict[str, str] | None
) -> str:
    run = resources(config, context)
    location = run.store.key_url(run_key(context.run_id, report.stage, "gate/report.json"))
    links = {**(links or {}), "MLflow run": run.tracker.run_link(context.stage_run_ids[report.stage])}
    return notify_gate(
        config.alerts, report, run_name=context.run_name, report_location=location, links=links, webhook_url=webhook_url
    )


def _evict_from(config: PipelineConfig, context: RunContext, stage: str) -> None:
    """The run is over at `stage`: the shards pre-staged for it and later stages leave live storage."""
    cache = resources(config, context).cache
    for later in stages_from(stage):
        cache.evict(later)


def reject(
    config: PipelineConfig,
    context: RunContext,
    stage: str,
    report: GateReport,
    *,
    webhook_url: str | None = None,
    links: dict[str, str] | None = None,
) -> str:
    """A failed gate: archive the candidate with the short lifetime, alert Slack, close the runs.

    A Slack outage is noted in the returned message; it never turns the failure into anything else.
    """
    archive(config, context, stage, outcome=Outcome.FAILED_CANDIDATE)
    _evict_from(config, context, stage)
    alert = _notify(config, context, report, webhook_url, links)
    close_run(config, context, "FAILED")
    return f"gate failed at stage {stage}: " + "; ".join(report.failures()) + f" ({alert})"


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
    _remove_empty(run_dir)
    with _RESOURCES_LOCK:
        _RESOURCES.pop(context.run_id, None)
    return released.to_dict()


def abort(config: PipelineConfig, context: RunContext, stage: str, error: BaseException) -> None:
    """A stage failed for a reason other than its gate: archive what it left as 'aborted', close the run.

    Best effort on each step, so the original error is the one the flow reports; what could not be
    archived stays live (never freed without a verified copy).
    """
    steps = [
        ("archive", lambda: archive(config, context, stage, outcome=Outcome.ABORTED)),
        ("evict shards", lambda: _evict_from(config, context, stage)),
        ("close runs", lambda: close_run(config, context, "FAILED")),
    ]
    for name, step in steps:
        try:
            step()
        except Exception as failure:  # noqa: BLE001 - reported, the stage's own error is what matters
            print(
                f"drape: aborting run {context.run_id} after {type(error).__name__} at stage {stage}: {name} failed: {failure}",
                file=sys.stderr,
            )


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

"""The stage operations a pipeline run is made of, one function per box of the DAG.

Each is one call for a Prefect task (`tasks/`), and runs just as well without Prefect. Live
storage (``<root>/live``) holds::

    runs/<run id>/<stage>/checkpoints/step-N    the active run's candidate checkpoints
    runs/<run id>/<stage>/gate/                 outputs, latents, report.json, grid.png
    baselines/<stage>/                          the current baseline: checkpoint/, outputs/, baseline.json
                                                (+ latents.safetensors, report.json if the policy keeps
                                                those live while baseline)
    shards/<dataset>/<version>/<split>/         the shard cache (`data.cache`): pre-staged shards of
                                                the stage in progress or next, and the control set

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
import time
from contextlib import contextmanager
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from drape import STAGES
from drape.alerts import notify_gate
from drape.checkpoint import export_weights
from drape.config import PipelineConfig
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, ensure_dataset, load_split, manifest_hash, read_manifest
from drape.data.partition import load_stage_data, resolve_partitions
from drape.gate_report import GateReport
from drape.retention import ArchiveResult, classify_stage_dir, execute_plan, plan_retention, release_run
from drape.storage import open_store, remove_tree, tree_bytes
from drape.sweep import sweep as run_sweep
from drape import metrics
from drape.metrics import push_metrics
from drape.tracking import Tracker
from drape.train import TrainResult, train_stage
from drape.validate import evaluate_gate, provenance_problems


MODES = ("full", "finetune")  # full: each stage's `steps`; finetune: `finetune_steps` from the stage baselines


class GateFailed(RuntimeError):
    """A candidate missed its gate; the message names stage, check, value and threshold."""


@dataclass(frozen=True)
class RunContext:
    run_id: str
    run_name: str
    mode: str
    live_root: str
    mlflow_run_id: str
    stage_run_ids: dict[str, str]
    dataset_prefix: str
    data_manifest_hash: str
    control_set: str

    def stage_dir(self, stage: str) -> Path:
        return Path(self.live_root) / "runs" / self.run_id / stage

    def baseline_dir(self, stage: str) -> Path:
        return Path(self.live_root) / "baselines" / stage


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


def live_root(config: PipelineConfig) -> Path:
    return config.paths.root_path.resolve() / "live"


def start_run(config: PipelineConfig, *, run_name: str | None = None, mode: str = "full", progress=None) -> RunContext:
    """Create the run: dataset ready in the object store, MLflow runs open, control set staged."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    store, tracker = open_store(config), Tracker(config)
    manifest = ensure_dataset(config, store, progress)
    run_id = f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    run_name = run_name or f"{config.name}-{mode}-{run_id}"
    tags = {"drape.run_id": run_id, "drape.config": config.name, "drape.mode": mode}
    parent = tracker.start_run(run_name, tags)
    tracker.log_params(parent, {"config": json.dumps(config.model_dump(mode="json"), sort_keys=True), "mode": mode})
    children = {stage: tracker.start_run(f"{run_name}/{stage}", {**tags, "drape.stage": stage}, parent) for stage in STAGES}
    context = RunContext(run_id, run_name, mode, str(live_root(config)), parent, children, dataset_prefix(config),
                         manifest_hash(manifest), manifest["control_set"])
    shard_cache(config, context).prestage("control")
    return context


def _manifest(config: PipelineConfig, context: RunContext) -> dict:
    return json.loads(open_store(config).read_bytes(f"{context.dataset_prefix}/manifest.json"))


def shard_cache(config: PipelineConfig, context: RunContext) -> ShardCache:
    return ShardCache.from_config(config, open_store(config), context.dataset_prefix, _manifest(config, context))


def prestage(config: PipelineConfig, context: RunContext, stage: str, progress=None) -> dict:
    """Pre-stage `stage`'s shards into the shard cache, verified, keeping the control set and the
    stage before it (which may still be training); returns what was staged and evicted."""
    index = STAGES.index(stage)
    keep = ["control", *STAGES[max(index - 1, 0):index]]
    with _timed(config, context, stage, "prestage"):
        result = shard_cache(config, context).prestage(stage, keep=keep, progress=progress)
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


def previous_checkpoint(context: RunContext, stage: str) -> str | None:
    """Where `stage` starts: fine-tunes from its own baseline; a full run from the previous stage's baseline."""
    index = STAGES.index(stage)
    source = stage if context.mode == "finetune" else (STAGES[index - 1] if index else None)
    if source is None:
        return None
    checkpoint = context.baseline_dir(source) / "checkpoint"
    return str(checkpoint) if checkpoint.is_dir() else None


def train(config: PipelineConfig, context: RunContext, stage: str, init_checkpoint: str | None, progress=None) -> TrainResult:
    """Train the stage's parameter subset on its pre-staged shards, in this process; logs to the stage's MLflow run."""
    tracker, run = Tracker(config), context.stage_run_ids[stage]
    cache = shard_cache(config, context)
    partitions = resolve_partitions(config.train.data_partitions, 1, config.train.batch_size)
    data = load_stage_data(cache, stage, partitions=partitions, world_size=1, rank=0, prestage=False)  # pre-staged: local disk
    sink = lambda metrics, step: tracker.log_metrics(run, metrics, step)  # noqa: E731
    result = train_stage(config, stage=stage, data=data, out_dir=context.stage_dir(stage), init_checkpoint=init_checkpoint,
                         mode=context.mode, data_manifest_hash=context.data_manifest_hash, log_metrics=sink, progress=progress,
                         metric_labels={"run": context.run_id, "stage": stage})
    _log_train_summary(config, context, stage, result, cache.read_wait_seconds)
    return result


def train_command(config: PipelineConfig, context: RunContext, stage: str, init_checkpoint: str | None) -> tuple[list[str], Path]:
    """The trainer as a queue job: `python -m drape.train …` and the file its result lands in."""
    stage_dir = context.stage_dir(stage)
    stage_dir.mkdir(parents=True, exist_ok=True)
    config_path, result_path = stage_dir / "job-config.json", stage_dir / "train-result.json"
    config_path.write_text(config.model_dump_json(indent=2))
    result_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "drape.train", "--config", str(config_path), "--stage", stage, "--out", str(stage_dir),
               "--mode", context.mode, "--result", str(result_path), "--mlflow-run", context.stage_run_ids[stage],
               "--run-id", context.run_id]
    return command + (["--init", init_checkpoint] if init_checkpoint else []), result_path


def finish_train(config: PipelineConfig, context: RunContext, stage: str, result_path: str | Path) -> TrainResult:
    """The TrainResult a queue job wrote; logs the stage summary and removes the job's files."""
    path = Path(result_path)
    if not path.is_file():
        raise RuntimeError(f"stage {stage}: the train job ended without writing {path}")
    payload = json.loads(path.read_text())
    fields = {name: payload[name] for name in TrainResult.__dataclass_fields__}
    result = TrainResult(**fields)
    _log_train_summary(config, context, stage, result, payload.get("shard_read_wait_seconds", 0.0))
    path.unlink()
    (path.parent / "job-config.json").unlink(missing_ok=True)
    return result


def _log_train_summary(config: PipelineConfig, context: RunContext, stage: str, result: TrainResult, read_wait: float) -> None:
    labels = {"run": context.run_id, "stage": stage}
    metrics.TRAIN_THROUGHPUT.labels(**labels).set(result.samples_per_second)
    metrics.TRAIN_STEPS.labels(**labels).set(result.steps)
    metrics.STAGE_STEP_SECONDS.labels(**labels, step="train").set(result.train_seconds)
    metrics.STAGE_FINISHED.labels(**labels, step="train").set(time.time())
    push_metrics(config, grouping=labels)
    Tracker(config).log_metrics(context.stage_run_ids[stage], {
        f"{stage}/train_seconds": result.train_seconds, f"{stage}/data_wait_fraction": result.data_wait_fraction,
        f"{stage}/final_loss": result.final_loss, f"{stage}/shard_read_wait_seconds": read_wait}, result.steps)


def _baseline(config: PipelineConfig, context: RunContext, stage: str, tracker: Tracker) -> tuple[dict | None, Path | None]:
    """The stage baseline's version info and a local directory with its control outputs."""
    version = tracker.get_baseline(stage)
    if version is None:
        return None, None
    info = {"version": str(version.version), "run_id": version.tags.get("drape.run_id", ""),
            "control_set": version.tags.get("drape.control_set", "")}
    if info["control_set"] != context.control_set:
        raise ValueError(f"stage {stage}: baseline v{info['version']} was judged on control set {info['control_set']!r}, "
                         f"this run uses {context.control_set!r}; outputs on different control sets cannot be compared")
    local = context.baseline_dir(stage)
    recorded = json.loads((local / "baseline.json").read_text()) if (local / "baseline.json").is_file() else {}
    if recorded.get("version") == info["version"] and (local / "outputs").is_dir():
        return info, local / "outputs"
    cache = Path(context.live_root) / "runs" / context.run_id / stage / "baseline-download"
    return info, tracker.download(f"{version.source}/outputs", cache)


def gate(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str, *, webhook_url: str | None = None,
         links: dict[str, str] | None = None) -> GateReport:
    """Judge the candidate on the control set vs thresholds and the stage baseline; log the report.

    A passing gate alerts only when `alerts.notify_on_pass` is set; failures alert in `reject`.
    """
    with _timed(config, context, stage, "gate"):
        report = _gate(config, context, stage, checkpoint, webhook_url=webhook_url, links=links)
        labels = {"run": context.run_id, "stage": stage}
        for name, check in report.checks.items():
            for aggregate, value in (("lower", check.lower), ("mean", check.mean), ("min", check.minimum)):
                metrics.GATE_VALUE.labels(**labels, check=name, aggregate=aggregate).set(value)
            if check.threshold is not None:
                metrics.GATE_THRESHOLD.labels(**labels, check=name).set(check.threshold)
        metrics.GATE_PASSED.labels(**labels).set(1.0 if report.passed else 0.0)
    return report


def _gate(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str, *, webhook_url: str | None,
          links: dict[str, str] | None) -> GateReport:
    tracker, run = Tracker(config), context.stage_run_ids[stage]
    cache = shard_cache(config, context)
    cache.prestage("control")  # normally local already; restores it if an operator cleared the cache
    control = load_split(cache.dataset_dir, cache.manifest, "control")
    baseline, baseline_outputs = _baseline(config, context, stage, tracker)
    gate_dir = context.stage_dir(stage) / "gate"
    provenance = provenance_problems(config, checkpoint, stage=stage, data_manifest_hash=context.data_manifest_hash,
                                     start_checkpoint=previous_checkpoint(context, stage))
    report = evaluate_gate(config, stage=stage, run_id=context.run_id, checkpoint=checkpoint, control=control,
                           control_set=context.control_set, gate_dir=gate_dir, baseline=baseline,
                           baseline_outputs_dir=baseline_outputs, provenance=provenance)
    remove_tree(context.stage_dir(stage) / "baseline-download")
    aggregates = {f"gate/{name}/{aggregate}": getattr(check, attribute) for name, check in report.checks.items()
                  for aggregate, attribute in (("mean", "mean"), ("lower", "lower"), ("min", "minimum"))}
    tracker.log_metrics(run, {**aggregates, "gate/passed": float(report.passed)})
    tracker.set_tags(run, {"drape.gate.verdict": "pass" if report.passed else "fail"})
    tracker.log_artifact(run, gate_dir / "report.json", "gate")
    tracker.log_artifact(run, gate_dir / "grid.png", "gate")
    if report.passed:
        print(f"gate-{stage}: passed ({_notify(config, context, report, webhook_url, links)})")
    return report


def snapshot(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str, report: GateReport) -> dict:
    """Register the passed checkpoint as `drape-tryon` ``<stage>-baseline`` and make it the live baseline."""
    with _timed(config, context, stage, "snapshot"):
        result = _snapshot(config, context, stage, checkpoint, report)
        metrics.PROMOTIONS.labels(run=context.run_id, stage=stage).inc()
        metrics.BASELINE_VERSION.labels(run=context.run_id, stage=stage).set(float(result["version"]))
    return result


def _snapshot(config: PipelineConfig, context: RunContext, stage: str, checkpoint: str, report: GateReport) -> dict:
    tracker, run = Tracker(config), context.stage_run_ids[stage]
    gate_dir = context.stage_dir(stage) / "gate"
    staging = context.baseline_dir(stage).with_name(f".{stage}.tmp")
    remove_tree(staging)
    staging.mkdir(parents=True)
    export_weights(checkpoint, staging / "checkpoint")  # the full checkpoint is archived with the run
    shutil.copytree(gate_dir / "outputs", staging / "outputs")
    for name, kind in (("latents.safetensors", "latent_snapshot"), ("report.json", "gate_report")):
        if (gate_dir / name).is_file() and config.retention.live_until(kind, "baseline") == "baseline":
            shutil.copy2(gate_dir / name, staging / name)  # live while this is the baseline (retention policy)
    tracker.log_artifacts(run, staging / "checkpoint", "snapshot/checkpoint")
    source = tracker.log_artifacts(run, staging / "outputs", "snapshot/outputs").removesuffix("/outputs")
    tags = {"drape.stage": stage, "drape.run_id": context.run_id, "drape.control_set": context.control_set,
            **{f"drape.gate.{name}": f"{check.mean:.6f}" for name, check in report.checks.items()}}
    version = tracker.register_baseline(run, source, stage, tags)
    (staging / "baseline.json").write_text(json.dumps({"version": version, "run_id": context.run_id, "stage": stage,
                                                      "control_set": context.control_set}))
    current = context.baseline_dir(stage)
    if current.exists():
        os.replace(current, context.stage_dir(stage) / "superseded-baseline")
    os.replace(staging, current)
    return {"stage": stage, "version": version, "alias": f"{stage}-baseline", "checkpoint": str(current / "checkpoint")}


def archive(config: PipelineConfig, context: RunContext, stage: str, outcome: str = "passed") -> dict:
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
    store, root = open_store(config), Path(context.live_root)
    live_before = tree_bytes(root)
    actions = plan_retention(classify_stage_dir(context.stage_dir(stage), outcome), config.retention,
                             key_root=f"runs/{context.run_id}/{stage}")
    result: ArchiveResult = execute_plan(actions, store, f"archive/manifests/{context.run_id}/{stage}",
                                         run_id=context.run_id, stage=stage)
    cache = shard_cache(config, context)
    for shard in cache.shards(stage):  # the object store holds the verified original
        store.verify(f"{context.dataset_prefix}/{shard['path']}", size=shard["bytes"], sha256=shard["sha256"])
    cache.evict(stage)
    _remove_empty(context.stage_dir(stage))
    live_after = tree_bytes(root)
    Tracker(config).log_metrics(context.stage_run_ids[stage], {f"{stage}/archived_bytes": result.archived_bytes,
                                                               f"{stage}/live_bytes_before": live_before,
                                                               f"{stage}/live_bytes_after": live_after})
    return {**result.to_dict(), "stage": stage, "live_bytes_before": live_before, "live_bytes_after": live_after}


def sweep(config: PipelineConfig, *, dry_run: bool = False, now: datetime | None = None) -> dict:
    """The retention sweep (drape.sweep) against the registry's current baselines."""
    tracker = Tracker(config)
    current = {}
    for stage in STAGES:
        version = tracker.get_baseline(stage)
        if version is not None:
            current[stage] = version.tags.get("drape.run_id", "")
    result = run_sweep(open_store(config), config.retention, current, now=now, dry_run=dry_run)
    return {"dry_run": dry_run, "retagged": result.retagged, "deleted": result.deleted, "freed_bytes": result.freed_bytes,
            "manifest_key": result.manifest_key}


def _remove_empty(directory: Path) -> None:
    for path in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) if directory.exists() else []:
        if not any(path.iterdir()):
            path.rmdir()
    if directory.exists() and not any(directory.iterdir()):
        directory.rmdir()


def _notify(config: PipelineConfig, context: RunContext, report: GateReport, webhook_url: str | None,
            links: dict[str, str] | None) -> str:
    store = open_store(config)
    location = f"{store.key_url(f'runs/{context.run_id}/{report.stage}/gate/report.json')}"
    links = {**(links or {}), "MLflow run": Tracker(config).run_link(context.stage_run_ids[report.stage])}
    return notify_gate(config.alerts, report, run_name=context.run_name, report_location=location, links=links,
                       webhook_url=webhook_url)


def reject(config: PipelineConfig, context: RunContext, stage: str, report: GateReport, *, webhook_url: str | None = None,
           links: dict[str, str] | None = None) -> str:
    """A failed gate: archive the candidate with the short lifetime, alert Slack, close the runs.

    The run is over, so the shards pre-staged for later stages leave live storage too. A Slack
    outage is noted in the returned message; it never turns the failure into anything else.
    """
    archive(config, context, stage, outcome="failed_candidate")
    cache = shard_cache(config, context)
    for later in STAGES[STAGES.index(stage):]:
        cache.evict(later)
    alert = _notify(config, context, report, webhook_url, links)
    close_run(config, context, "FAILED")
    return f"gate failed at stage {stage}: " + "; ".join(report.failures()) + f" ({alert})"


def close_run(config: PipelineConfig, context: RunContext, status: str) -> dict:
    """End the run: free what stayed live until run end (verified copies only), close the MLflow runs."""
    run_dir = Path(context.live_root) / "runs" / context.run_id
    released = release_run(open_store(config), run_dir, context.run_id)
    if released.kept:
        print(f"drape: run {context.run_id}: {len(released.kept)} live file(s) have no verified archived copy and stay "
              f"live: {released.kept[:3]}{' …' if len(released.kept) > 3 else ''}", file=sys.stderr)
    tracker = Tracker(config)
    for run in context.stage_run_ids.values():
        tracker.end_run(run, status)
    tracker.end_run(context.mlflow_run_id, status)
    _remove_empty(run_dir)
    return released.to_dict()


def abort(config: PipelineConfig, context: RunContext, stage: str, error: BaseException) -> None:
    """A stage failed for a reason other than its gate: archive what it left as 'aborted', close the run.

    Best effort on each step, so the original error is the one the flow reports; what could not be
    archived stays live (never freed without a verified copy).
    """
    steps = [("archive", lambda: archive(config, context, stage, outcome="aborted")),
             ("evict shards", lambda: [shard_cache(config, context).evict(s) for s in STAGES[STAGES.index(stage):]]),
             ("close runs", lambda: close_run(config, context, "FAILED"))]
    for name, step in steps:
        try:
            step()
        except Exception as failure:  # noqa: BLE001 - reported, the stage's own error is what matters
            print(f"drape: aborting run {context.run_id} after {type(error).__name__} at stage {stage}: {name} failed: "
                  f"{failure}", file=sys.stderr)


def summarize(config: PipelineConfig, context: RunContext, stages: list[dict]) -> dict:
    """The run summary the CLI prints: one row per stage plus where to look."""
    released = close_run(config, context, "FINISHED")
    return {"run_id": context.run_id, "run_name": context.run_name, "stages": stages,
            "live_bytes": tree_bytes(context.live_root), "released_at_run_end_bytes": released["freed_bytes"],
            "tracking_uri": config.tracking_uri,
            "object_store": repr(open_store(config)),
            "gate_reports": f"runs/{context.run_id}/<stage>/gate/report.json in the object store; MLflow run {context.mlflow_run_id}"}


def stage_row(train_result: TrainResult, report: GateReport, snap: dict, archived: dict) -> dict:
    return {"stage": train_result.stage, "steps": train_result.steps, "final_loss": train_result.final_loss,
            "train_seconds": train_result.train_seconds, "data_wait_fraction": train_result.data_wait_fraction,
            "checks": {n: {"value": c.lower, "mean": c.mean, "threshold": c.threshold, "passed": c.passed}
                       for n, c in report.checks.items()},
            "verdict": "pass" if report.passed else "fail", "version": snap["version"],
            "archived_bytes": archived["archived_bytes"], "live_bytes": archived["live_bytes_after"]}

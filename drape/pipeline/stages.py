"""The boxes of the stage DAG: prestage, train, gate, snapshot, archive, and reject or abort."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from drape import Outcome, Stage, previous_stage
from drape.config import PipelineConfig
from drape.data.dataset import load_split
from drape.gates.run import evaluate_gate, provenance_problems
from drape.gates.verdict.report import GateReport
from drape.jsonfile import read_json_object
from drape.layout import StagePaths, archive_manifest_prefix, run_key
from drape.ops import metrics
from drape.ops.alerts import notify_gate
from drape.ops.tracking import Tracker
from drape.pipeline.baselines import baseline_source, ensure_live_baseline
from drape.pipeline.resume import load_progress, restore_newest_checkpoint, save_progress
from drape.pipeline.run import RunContext, close_run, evict_from, log_train_summary, resources, timed
from drape.storage.bases import prune_live_bases, publish_bases
from drape.storage.durable import fsync_dir, fsync_tree, write_synced
from drape.storage.handoff import adopt_published
from drape.storage.retention import classify_stage_dir, execute_plan, live_until, plan_retention
from drape.storage.store import remove_empty_dirs, remove_tree, tree_bytes
from drape.training.checkpoints.checkpoint import export_weights, list_checkpoints
from drape.training.jobs.stage_job import StageJob
from drape.training.loop.trainer import TrainResult


def prestage(config: PipelineConfig, context: RunContext, stage: str, progress=None) -> dict:
    """Pre-stage `stage`'s shards into the shard cache, verified, keeping the control set and the
    stage before it (which may still be training); returns what was staged and evicted. When
    stages train apart (`trains_apart`), this node only gates: it stages the control set, and the
    node training the stage before warms its own cache with `stage`'s shards (drape/training/jobs/apart.py)."""
    split = "control" if config.trains_apart else stage
    keep = ["control", *filter(None, [previous_stage(stage)])]
    with timed(config, context, stage, "prestage") as extra:
        result = resources(config, context).cache.prestage(split, keep=keep, progress=progress)
        extra.update(downloaded=result.downloaded, downloaded_bytes=result.downloaded_bytes)
        metrics.PRESTAGED_BYTES.labels(run=context.run_id, stage=stage).set(result.bytes)
        metrics.PRESTAGE_DOWNLOADED.labels(run=context.run_id, stage=stage).set(result.downloaded_bytes)
    return result.to_dict()


def start_checkpoint(context: RunContext, stage: str) -> str | None:
    """Where `stage` starts: a fine-tune from its own baseline, a full run from the previous stage's
    baseline (None: the first stage of a full run, fresh weights). A baseline that should be there
    and is not is an error: the stage never silently starts from fresh weights."""
    source = baseline_source(context, stage)
    if source is None:
        return None
    checkpoint = context.layout.baseline(source).checkpoint
    if not (checkpoint / "manifest.json").is_file():
        raise FileNotFoundError(
            f"stage {stage} starts from the {source} baseline, but {checkpoint} is missing or incomplete: "
            f"restore it (`drape storage restore`), or run {source} first"
        )
    return str(checkpoint)


def stage_job(config: PipelineConfig, context: RunContext, stage: str) -> StageJob:
    """The stage's training job in this run: from `start_checkpoint` (its live baseline rebuilt from
    the registry first if this node lost it), into the run's stage directory."""
    ensure_live_baseline(config, context, stage)
    return StageJob(
        config,
        Stage(stage),
        context.stage_dir(stage),
        context.mode,
        start_checkpoint(context, stage),
        context.run_id,
        context.stage_run_ids[stage],
    )


def resume_checkpoint(config: PipelineConfig, context: RunContext, stage: str) -> None:
    """In a resumed run, a stage with no live checkpoint starts from the newest one archived for
    this run (its node was lost, or an abort archived it before the run was resumed)."""
    checkpoints = context.paths(stage).checkpoints
    if not context.resumed or list_checkpoints(checkpoints):
        return
    store = resources(config, context).store
    restored = restore_newest_checkpoint(store, context.run_id, stage, checkpoints, bases=context.layout.bases)
    if restored is not None:
        print(f"train-{stage}: resuming from {restored.name}, restored from the archive (verified)")


def train(config: PipelineConfig, context: RunContext, stage: str, progress=None) -> TrainResult:
    """Train the stage in this process on its pre-staged shards; logs to the stage's MLflow run."""
    run, started = resources(config, context), time.time()
    resume_checkpoint(config, context, stage)
    result = stage_job(config, context, stage).run(cache=run.cache, tracker=run.tracker, progress=progress)
    log_train_summary(config, context, stage, result, window=(started, time.time()))
    return result.train


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
    recorded = read_json_object(local.record, "record") if local.record.is_file() else {}
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
    with timed(config, context, stage, "gate"):
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


def passed_gate(config: PipelineConfig, context: RunContext, stage: str, trained: TrainResult, report: GateReport) -> dict:
    """The stage's summary row once its gate passed, recorded (phase 'gated'): a resumed run goes on from here."""
    row = {
        "stage": stage,
        "steps": trained.steps,
        "final_loss": trained.final_loss,
        "train_seconds": trained.train_seconds,
        "data_wait_fraction": trained.data_wait_fraction,
        "checks": {
            name: {"value": c.lower, "mean": c.mean, "threshold": c.threshold, "passed": c.passed}
            for name, c in report.checks.items()
        },
        "verdict": report.verdict,
        "candidate": trained.checkpoint,
    }
    return save_progress(resources(config, context).store, context.run_id, stage, "gated", row)


def snapshot(config: PipelineConfig, context: RunContext, stage: str, row: dict) -> dict:
    """Register the passed candidate (`row`, from `passed_gate`) as `drape-tryon` ``<stage>-baseline``
    and make it the live baseline; idempotent: a resumed run does not register it twice."""
    with timed(config, context, stage, "snapshot") as extra:
        result = _snapshot(config, context, stage, row)
        baseline = context.baseline_dir(stage)
        extra.update(bytes=tree_bytes(baseline), files=sum(1 for _ in baseline.rglob("*")))
        metrics.PROMOTIONS.labels(run=context.run_id, stage=stage).inc()
        metrics.BASELINE_VERSION.labels(run=context.run_id, stage=stage).set(float(result["version"]))
    save_progress(resources(config, context).store, context.run_id, stage, "snapshotted", {**row, "version": result["version"]})
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


def _snapshot(config: PipelineConfig, context: RunContext, stage: str, row: dict) -> dict:
    tracker, stage_run = resources(config, context).tracker, context.stage_run_ids[stage]
    paths, baseline = context.paths(stage), context.layout.baseline(stage)
    current = tracker.get_baseline(stage)
    if current is not None and current.tags.get("drape.run_id") == context.run_id:
        version = str(current.version)  # registered before this run was interrupted
    else:
        _stage_baseline(config, paths, row["candidate"], baseline.staging)
        # the registered weights name their frozen base; it is in the object store before they are registered
        publish_bases(resources(config, context).store, [baseline.staging / "checkpoint"])
        tracker.log_artifacts(stage_run, baseline.staging / "checkpoint", "snapshot/checkpoint")
        source = tracker.log_artifacts(stage_run, baseline.staging / "outputs", "snapshot/outputs").removesuffix("/outputs")
        tags = {
            "drape.stage": stage,
            "drape.run_id": context.run_id,
            "drape.control_set": context.control_set,
            **{f"drape.gate.{name}": f"{check['mean']:.6f}" for name, check in row["checks"].items()},
        }
        version = tracker.register_baseline(stage_run, source, stage, tags, alias=False)
    live = read_json_object(baseline.record, "baseline record") if baseline.record.is_file() else {}
    if live.get("version") != version or live.get("run_id") != context.run_id:  # the live baseline is not it yet
        if not baseline.staging.is_dir():
            _stage_baseline(config, paths, row["candidate"], baseline.staging)
        record = {"version": version, "run_id": context.run_id, "stage": stage, "control_set": context.control_set}
        write_synced(baseline.staging / "baseline.json", json.dumps(record))
        fsync_tree(baseline.staging)
        if baseline.root.exists():
            os.replace(baseline.root, paths.superseded_baseline)
        os.replace(baseline.staging, baseline.root)
        fsync_dir(baseline.root.parent)
    # the alias moves last: it is the commit (the registry is the truth; a crash before it leaves the
    # old baseline current, and the live copy is redone on resume)
    tracker.set_baseline_alias(stage, version)
    return {"stage": stage, "version": version, "alias": f"{stage}-baseline", "checkpoint": str(baseline.checkpoint)}


def archive_passed(config: PipelineConfig, context: RunContext, stage: str, row: dict) -> dict:
    """Archive a promoted stage (`archive`) and record it done; returns its summary row."""
    archived = archive(config, context, stage)
    done = {**row, "archived_bytes": archived["archived_bytes"], "live_bytes": archived["live_bytes_after"]}
    return save_progress(resources(config, context).store, context.run_id, stage, "done", done)


def stage_progress(config: PipelineConfig, context: RunContext) -> dict[str, dict]:
    """stage → {phase, row} of what a resumed run already did ({} for a new run). A stage gated
    but not yet promoted whose candidate is gone from live storage (its node was lost) trains again."""
    if not context.resumed:
        return {}
    found = load_progress(resources(config, context).store, context.run_id)
    return {
        stage: record
        for stage, record in found.items()
        if record["phase"] != "gated" or Path(record["row"]["candidate"]).is_dir()
    }


def archive(config: PipelineConfig, context: RunContext, stage: str, outcome: str = Outcome.PASSED) -> dict:
    """Archive the stage's leftovers (verified), free them, and drop its pre-staged shards."""
    with timed(config, context, stage, "archive") as extra:
        result = _archive(config, context, stage, outcome)
        extra.update({k: result[k] for k in ("archived_bytes", "live_bytes_before", "live_bytes_after")})
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
    # the frozen base the stage's checkpoints name goes first (execute_plan: once for every run over it, verified)
    result = execute_plan(actions, run.store, archive_manifest_prefix(context.run_id, stage), run_id=context.run_id, stage=stage)
    # what the stage's trainer published and this node never held: the stage's outcome now
    done = {action.key_prefix for action in actions}
    files, sent = adopt_published(run.store, config.retention, run_id=context.run_id, stage=stage, outcome=outcome, done=done)
    result.archived_files, result.archived_bytes = result.archived_files + files, result.archived_bytes + sent
    for shard in run.cache.shards(stage):  # the object store holds the verified original
        run.store.verify(f"{context.dataset_prefix}/{shard['path']}", size=shard["bytes"], sha256=shard["sha256"])
    run.cache.evict(stage)
    remove_empty_dirs(stage_dir)
    prune_live_bases(run.store, context.layout.bases, root)  # a base no live checkpoint names: its copy is verified
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


def _notify(
    config: PipelineConfig, context: RunContext, report: GateReport, webhook_url: str | None, links: dict[str, str] | None
) -> str:
    run = resources(config, context)
    location = run.store.key_url(run_key(context.run_id, report.stage, "gate/report.json"))
    links = {**(links or {}), "MLflow run": run.tracker.run_link(context.stage_run_ids[report.stage])}
    return notify_gate(
        config.alerts, report, run_name=context.run_name, report_location=location, links=links, webhook_url=webhook_url
    )


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
    evict_from(config, context, stage)
    alert = _notify(config, context, report, webhook_url, links)
    close_run(config, context, "FAILED")
    return f"gate failed at stage {stage}: " + "; ".join(report.failures()) + f" ({alert})"


def abort(config: PipelineConfig, context: RunContext, stage: str, error: BaseException) -> None:
    """A stage failed for a reason other than its gate: archive what it left as 'aborted', close the run.

    Best effort on each step, so the original error is the one the flow reports; what could not be
    archived stays live (never freed without a verified copy).
    """
    steps = [
        ("archive", lambda: archive(config, context, stage, outcome=Outcome.ABORTED)),
        ("evict shards", lambda: evict_from(config, context, stage)),
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

"""Prefect tasks for the stage DAG: thin adapters, one core call each.

Retries, timeouts and names live on the decorators; the work lives in `drape.pipeline`.
Task run names carry the stage so the Prefect UI reads like the DAG.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from drape import pipeline  # its names load their modules when first used (torch, diffusers, MLflow)
from drape.config import PipelineConfig

if TYPE_CHECKING:
    from drape.gates.verdict.report import GateReport
    from drape.training.loop.trainer import TrainResult

_common: dict[str, Any] = {"cache_policy": NONE, "log_prints": True}


def _not_refused(_task, _task_run, state) -> bool:
    """Retry a start that failed on the way, never a refusal: a run another process drives (its
    lease), or one that cannot be resumed; a retry would only say the same thing later."""
    from drape.storage.lease import RunHeld

    error = state.result(raise_on_failure=False)
    return not isinstance(error, pipeline.ResumeError | RunHeld)


@task(name="start-run", retries=2, retry_delay_seconds=5, retry_condition_fn=_not_refused, timeout_seconds=1800, **_common)
def start_run(
    config: PipelineConfig, run_name: str | None, mode: str, resume: str | None = None, flow_run_id: str | None = None
) -> pipeline.RunContext:
    return pipeline.start_run(config, run_name=run_name, mode=mode, resume=resume, flow_run_id=flow_run_id)


@task(name="stage-progress", **_common)
def stage_progress(config: PipelineConfig, context: pipeline.RunContext) -> dict[str, dict]:
    return pipeline.stage_progress(config, context)


@task(name="prestage", task_run_name="prestage-{stage}", retries=3, retry_delay_seconds=10, **_common)
def prestage(config: PipelineConfig, context: pipeline.RunContext, stage: str) -> dict:
    return pipeline.prestage(config, context, stage)


@task(name="prestage-dataset", task_run_name="prestage-dataset-{stage}", retries=3, retry_delay_seconds=10, **_common)
def prestage_dataset(config: PipelineConfig, stage: str, keep: list[str]) -> dict:
    return pipeline.prestage_dataset(config, stage, keep)


@task(name="train", task_run_name="train-{stage}", timeout_seconds=14 * 24 * 3600, **_common)
def train(config: PipelineConfig, context: pipeline.RunContext, stage: str) -> TrainResult:
    """In this process, or (with `queue.enabled`) as a job through the GPU queue, waiting for it."""
    if not config.queue.enabled:
        from drape.training.jobs.stage_job import progress_lines

        return pipeline.train(config, context, stage, progress=progress_lines(stage))
    from drape import job_kind_for
    from scheduler.dispatch.dispatcher import submit_and_wait, wait_for
    from scheduler.jobs.training import train_job_spec
    from scheduler.queue.once import live_job, succeeded_job
    from scheduler.queue.store import JobStore

    store = JobStore(config.queue_url)
    kind = job_kind_for(context.mode)
    left = live_job(store, kind, stage, context.run_id) if context.resumed else None
    if left is not None:  # the job the run's interrupted flow submitted runs on: wait for it, never a second
        print(f"train-{stage}: waiting for {left['id']} ({left['state']}), submitted before the run was resumed")
        wait_for(config, store, left["id"], on_line=_relay(stage))
        return pipeline.finish_train(config, context, stage)
    done = succeeded_job(store, kind, stage, context.run_id) if context.resumed else None
    if done is not None and pipeline.train_result_ready(config, context, stage):
        # it ended while the run was down (the queue retried it): a second job would only resume from its last step
        print(f"train-{stage}: {done['id']} succeeded before the run was resumed; taking its result")
        return pipeline.finish_train(config, context, stage)
    command = pipeline.train_command(config, context, stage)
    spec = train_job_spec(config, stage=stage, mode=context.mode, run_id=context.run_id, command=command)
    if node := pipeline.warm_node(config, context, stage):  # its cache holds this stage's shards
        spec.labels["prefer_node"] = node
    submit_and_wait(config, spec, on_line=_relay(stage))
    return pipeline.finish_train(config, context, stage)


def _relay(stage: str):
    """The train job's progress and errors into the run log."""

    def relay(line: str) -> None:
        if line.startswith(f"train-{stage}") or "Error" in line or "Traceback" in line:
            print(line)

    return relay


def _webhook(config: PipelineConfig) -> str | None:
    """The Slack webhook from the configured Prefect Secret block, if any (else drape reads the env)."""
    if not config.alerts.slack_webhook_secret_block:
        return None
    from prefect.blocks.system import Secret

    return Secret.load(config.alerts.slack_webhook_secret_block).get()  # type: ignore[union-attr]  # sync outside an event loop


def _links() -> dict[str, str]:
    from prefect.runtime import flow_run

    url = flow_run.ui_url
    return {"Prefect flow run": url} if url else {}


@task(name="gate", task_run_name="gate-{stage}", timeout_seconds=3600, **_common)
def gate(config: PipelineConfig, context: pipeline.RunContext, stage: str, checkpoint: str) -> GateReport:
    from drape.gates.verdict import render

    report = pipeline.gate(config, context, stage, checkpoint, webhook_url=_webhook(config), links=_links())
    create_markdown_artifact(render.markdown(report), key=f"gate-report-{stage}", description=f"{stage} gate report")
    return report


@task(name="passed-gate", task_run_name="passed-gate-{stage}", retries=2, retry_delay_seconds=5, **_common)
def passed_gate(
    config: PipelineConfig, context: pipeline.RunContext, stage: str, trained: TrainResult, report: GateReport
) -> dict:
    return pipeline.passed_gate(config, context, stage, trained, report)


@task(name="snapshot", task_run_name="snapshot-{stage}", retries=2, retry_delay_seconds=5, **_common)
def snapshot(config: PipelineConfig, context: pipeline.RunContext, stage: str, row: dict) -> dict:
    return pipeline.snapshot(config, context, stage, row)


@task(name="archive", task_run_name="archive-{stage}", retries=3, retry_delay_seconds=10, timeout_seconds=3600, **_common)
def archive(config: PipelineConfig, context: pipeline.RunContext, stage: str, row: dict) -> dict:
    return pipeline.archive_passed(config, context, stage, row)


@task(name="reject", task_run_name="reject-{stage}", retries=2, retry_delay_seconds=5, **_common)
def reject(config: PipelineConfig, context: pipeline.RunContext, stage: str, report: GateReport) -> str:
    return pipeline.reject(config, context, stage, report, webhook_url=_webhook(config), links=_links())


@task(name="abort", task_run_name="abort-{stage}", **_common)
def abort(config: PipelineConfig, context: pipeline.RunContext, stage: str, error: str) -> None:
    pipeline.abort(config, context, stage, RuntimeError(error))


@task(name="sweep", retries=2, retry_delay_seconds=30, **_common)
def sweep(config: PipelineConfig, dry_run: bool) -> dict:
    return pipeline.sweep(config, dry_run=dry_run)


@task(name="summarize", **_common)
def summarize(config: PipelineConfig, context: pipeline.RunContext, rows: list[dict]) -> dict:
    """The run's summary and cost; its jobs' GPU allocations come from the queue's allocation log."""
    attempts: list | None = []
    if config.queue.enabled:
        from scheduler.dispatch.accounting import run_attempts
        from scheduler.queue.store import JobStore

        try:
            attempts = run_attempts(JobStore(config.queue_url), context.run_id, config)
        except Exception as error:  # noqa: BLE001 - a finished run is not failed by its accounting
            print(f"drape: the queue's allocation log could not be read ({type(error).__name__}: {error})")
            attempts = None
    return pipeline.summarize(config, context, rows, attempts)

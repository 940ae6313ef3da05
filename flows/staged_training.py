"""The `staged-training` flow: identity → texture → geometry → denoise, each train → gate →
snapshot → archive, with the next stage's shards pre-staged while the current stage trains.

A failed gate rejects the candidate, and a failure in pre-staging, training or gating aborts the
stage (`stage_failures`), once the pre-staging in flight has settled, so nothing it writes
outlives the run. Snapshot and archive retry on their own and are never undone by an abort.

A run that died (the flow's process killed, its pod evicted) is resumed with `resume=<run id>`
(`drape run --resume`), or by a Prefect retry of the same flow run: the stages it promoted are
not trained or gated again, the stage in progress resumes from its newest checkpoint
(`drape.pipeline.resume`).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import flow
from prefect.futures import PrefectFuture, wait
from prefect.runtime import flow_run

from drape import STAGES, next_stage
from drape.config import default_config_path, load_config
from tasks import stages as t

if TYPE_CHECKING:  # importing this module loads no torch, diffusers or MLflow (`prefect deploy` imports it)
    from drape.gates.verdict.report import GateReport
    from drape.pipeline import RunContext


def _flow_run_name() -> str:
    parameters = flow_run.parameters
    return parameters.get("run_name") or f"{Path(parameters['config_path']).stem}-{parameters.get('mode', 'full')}"


class _Rejected(Exception):
    def __init__(self, report: GateReport):
        self.report = report


def passed(report: GateReport) -> GateReport:
    """The report of a gate that passed; a failed one leaves the stage (`stage_failures` rejects it)."""
    if not report.passed:
        raise _Rejected(report)
    return report


@contextmanager
def stage_failures(config, context: RunContext, stage: str, prestaging: list[PrefectFuture]):
    """A failed gate rejects the stage's candidate (GateFailed); any other error aborts the stage and
    propagates. Either way the pre-staging in flight settles first."""
    try:
        yield
    except _Rejected as rejected:
        from drape.pipeline import GateFailed

        wait(prestaging)
        raise GateFailed(t.reject(config, context, stage, rejected.report)) from None
    except Exception as error:
        wait(prestaging)
        t.abort(config, context, stage, f"{type(error).__name__}: {error}")
        raise


def _retried_run(config) -> str | None:
    """On a Prefect retry of this flow run (run count > 1), the drape run its first try started."""
    if (flow_run.run_count or 1) <= 1 or not flow_run.id:
        return None
    from drape.pipeline import run_of_flow_run
    from drape.storage.store import open_store

    return run_of_flow_run(open_store(config), flow_run.id)


def _release_lease(flow, flow_run, state) -> None:  # noqa: ARG001 - Prefect's hook signature, by name
    """A failed or crashed flow run gives up its run's lease, so the run can be resumed at once."""
    from drape.pipeline import release_flow_run_leases

    release_flow_run_leases(str(flow_run.id))


@flow(
    name="staged-training",
    flow_run_name=_flow_run_name,
    log_prints=True,
    on_failure=[_release_lease],
    on_crashed=[_release_lease],
)
def staged_training(
    config_path: str = str(default_config_path()), mode: str = "full", run_name: str | None = None, resume: str | None = None
) -> dict:
    """The four stages; `resume`: a run id to go on with where it stopped (also what a Prefect
    retry of this flow run does, with the run its first try started)."""
    config = load_config(config_path)
    context = t.start_run(config, run_name, mode, resume or _retried_run(config), flow_run.id)
    progress = t.stage_progress(config, context)
    todo = [stage for stage in STAGES if progress.get(stage, {}).get("phase") != "done"]
    rows = [progress[stage]["row"] for stage in STAGES if stage not in todo]
    prestaging = [t.prestage.submit(config, context, todo[0])] if todo else []
    for stage in todo:
        phase = progress.get(stage, {}).get("phase")
        with stage_failures(config, context, stage, prestaging):
            prestaging[-1].result()
            if upcoming := next_stage(stage):
                prestaging.append(t.prestage.submit(config, context, upcoming))
            if phase is None:
                trained = t.train(config, context, stage)
                report = passed(t.gate(config, context, stage, trained.checkpoint))
                row = t.passed_gate(config, context, stage, trained, report)
            else:  # gated or promoted before the run was interrupted
                row = progress[stage]["row"]
        if phase in (None, "gated"):
            row = {**row, "version": t.snapshot(config, context, stage, row)["version"]}
        rows.append(t.archive(config, context, stage, row))
    return t.summarize(config, context, rows)

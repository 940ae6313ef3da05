"""The `staged-training` flow: identity → texture → geometry → denoise, each train → gate →
snapshot → archive, with the next stage's shards pre-staged while the current stage trains.

A failed gate rejects the candidate, and a failure in pre-staging, training or gating aborts the
stage (`stage_failures`), once the pre-staging in flight has settled, so nothing it writes
outlives the run. Snapshot and archive retry on their own and are never undone by an abort.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from prefect import flow
from prefect.futures import PrefectFuture, wait
from prefect.runtime import flow_run

from drape import STAGES, next_stage
from drape.config import default_config_path, load_config
from drape.gates.report import GateReport
from drape.pipeline import GateFailed, RunContext, StageRecord
from tasks import stages as t


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
        wait(prestaging)
        raise GateFailed(t.reject(config, context, stage, rejected.report)) from None
    except Exception as error:
        wait(prestaging)
        t.abort(config, context, stage, f"{type(error).__name__}: {error}")
        raise


@flow(name="staged-training", flow_run_name=_flow_run_name, log_prints=True)
def staged_training(config_path: str = str(default_config_path()), mode: str = "full", run_name: str | None = None) -> dict:
    config = load_config(config_path)
    context = t.start_run(config, run_name, mode)
    prestaging = [t.prestage.submit(config, context, STAGES[0])]
    records = []
    for stage in STAGES:
        with stage_failures(config, context, stage, prestaging):
            prestaging[-1].result()
            if upcoming := next_stage(stage):
                prestaging.append(t.prestage.submit(config, context, upcoming))
            trained = t.train(config, context, stage)
            report = passed(t.gate(config, context, stage, trained.checkpoint))
        snap = t.snapshot(config, context, stage, trained.checkpoint, report)
        records.append(StageRecord(trained, report, snap, t.archive(config, context, stage)))
    return t.summarize(config, context, records)

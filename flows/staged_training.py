"""The `staged-training` flow: identity → texture → geometry → denoise, each train → gate →
snapshot → archive, with the next stage's shards pre-staged while the current stage trains."""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from drape import STAGES
from drape.config import default_config_path, load_config
from drape.pipeline import GateFailed, previous_checkpoint, stage_row
from tasks import stages as t


def _flow_run_name() -> str:
    parameters = flow_run.parameters
    return parameters.get("run_name") or f"{Path(parameters['config_path']).stem}-{parameters.get('mode', 'full')}"


@flow(name="staged-training", flow_run_name=_flow_run_name, log_prints=True)
def staged_training(config_path: str = str(default_config_path()), mode: str = "full", run_name: str | None = None) -> dict:
    config = load_config(config_path)
    context = t.start_run(config, run_name, mode)
    staged = t.prestage.submit(config, context, STAGES[0])
    rows = []
    for index, stage in enumerate(STAGES):
        try:
            staged.result()
            if index + 1 < len(STAGES):
                staged = t.prestage.submit(config, context, STAGES[index + 1])
            trained = t.train(config, context, stage, previous_checkpoint(context, stage))
            report = t.gate(config, context, stage, trained.checkpoint)
        except Exception as error:  # not a gate verdict: archive what the stage left as 'aborted', close the runs
            staged.wait()
            t.abort(config, context, stage, f"{type(error).__name__}: {error}")
            raise
        if not report.passed:
            staged.wait()
            raise GateFailed(t.reject(config, context, stage, report))
        snap = t.snapshot(config, context, stage, trained.checkpoint, report)
        rows.append(stage_row(trained, report, snap, t.archive(config, context, stage)))
    return t.summarize(config, context, rows)

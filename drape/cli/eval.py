"""`drape eval`: the field's metrics of a model version on a dataset's official test split."""

from __future__ import annotations

from pathlib import Path

import typer

from drape.cli.common import ConfigOption, console, fail, load, progress_bar
from drape.cli.render import table_of


def evaluate(
    version: str = typer.Option(..., "--version", help="model version number, registry alias, or checkpoint directory"),
    split: str = typer.Option("test", help="test: the official test split; control: the gates' control set (paired)"),
    mode: str = typer.Option("paired", help="paired (SSIM, LPIPS, FID, KID) or unpaired (FID, KID)"),
    config: Path | None = ConfigOption,
) -> None:
    """SSIM, LPIPS, FID and KID (torchmetrics) of a model version, batched and resumable, with the
    protocol printed beside the numbers; logged to MLflow on the model version. Published figures
    (CatVTON, Leffa) are shown beside them only when the protocol matches theirs; otherwise the
    difference is named (`drape.eval.published`)."""
    from drape.eval.features import MissingWeights
    from drape.eval.session import EvalInputError, run_eval

    cfg = load(config)
    try:
        with progress_bar() as progress:
            bar = progress.add_task(f"eval {split} {mode}", total=None)
            result = run_eval(
                cfg,
                version=version,
                split=split,
                mode=mode,
                progress=lambda done, total: progress.update(bar, completed=done, total=total),
            )
    except (EvalInputError, MissingWeights, ValueError) as error:  # a bad weight file or split: input errors
        fail(str(error))
    _print_result(result, mode)
    resumed = f"; {result['resumed_batches']} batches reused from an earlier run" if result["resumed_batches"] else ""
    console.print(f"results: {result['directory']}/results.json; MLflow run {result['mlflow_run']}{resumed}", markup=False)


def _print_result(result: dict, mode: str) -> None:
    """The metrics, with the published figures measured under the same protocol beside them, each
    other published protocol's difference named, and the protocol."""
    from drape.eval.published import comparable, describe, not_comparable, run_protocol
    from drape.eval.runner import describe_protocol

    protocol, metrics = result["protocol"], result["metrics"]
    matching = comparable(protocol, mode)
    columns = [f"{entry.model} (published, same protocol)" for entry in matching]
    table = table_of(f"drape eval: {protocol['model']}", ("metric", "value", *columns), left=("metric",))
    for name, value in metrics.items():
        table.add_row(name, f"{value:.4f}", *(f"{entry.metrics[name]:g}" if name in entry.metrics else "-" for entry in matching))
    console.print(table)
    if matching:
        console.print(f"published figures measured as this run: {describe(run_protocol(protocol))}", markup=False)
    for line in not_comparable(protocol, mode):
        console.print(line, markup=False, highlight=False)
    console.print(f"protocol: {describe_protocol(protocol)}", markup=False, highlight=False)

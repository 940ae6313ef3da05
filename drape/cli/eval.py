"""`drape eval`: the field's metrics of a model version on a dataset's official test split."""

from __future__ import annotations

from pathlib import Path

import typer

from drape.cli.common import ConfigOption, console, fail, load, progress_bar
from drape.cli.render import table_of

# published numbers on VITON-HD at 1024×768 (their own protocols: compare only when yours matches)
PUBLISHED = {
    "paired": {"CatVTON": {"ssim": 0.8704, "lpips": 0.0565, "fid": 5.425}, "Leffa": {"fid": 4.54}},  # KID: scales differ by paper
    "unpaired": {"CatVTON": {"fid": 9.015}, "Leffa": {"fid": 8.52}},
}


def evaluate(
    version: str = typer.Option(..., "--version", help="model version number, registry alias, or checkpoint directory"),
    split: str = typer.Option("test", help="test: the official test split; control: the gates' control set (paired)"),
    mode: str = typer.Option("paired", help="paired (SSIM, LPIPS, FID, KID) or unpaired (FID, KID)"),
    config: Path | None = ConfigOption,
) -> None:
    """SSIM, LPIPS, FID and KID (torchmetrics) of a model version, batched and resumable, with the
    protocol printed beside the numbers; logged to MLflow on the model version."""
    from drape.eval.features import MissingWeights
    from drape.eval.runner import describe_protocol
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
    metrics = result["metrics"]
    published = [f"{name} (published, VITON-HD)" for name in PUBLISHED[mode]]
    table = table_of(f"drape eval: {result['protocol']['model']}", ("metric", "value", *published), left=("metric",))
    for name, value in metrics.items():
        table.add_row(name, f"{value:.4f}", *(f"{row[name]:g}" if name in row else "-" for row in PUBLISHED[mode].values()))
    console.print(table)
    console.print(f"protocol: {describe_protocol(result['protocol'])}", markup=False, highlight=False)
    resumed = f"; {result['resumed_batches']} batches reused from an earlier run" if result["resumed_batches"] else ""
    console.print(f"results: {result['directory']}/results.json; MLflow run {result['mlflow_run']}{resumed}", markup=False)

"""`drape tryon` and `drape bench inference`: render with a promoted model; measure inference honestly."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from drape.cli.common import ConfigOption, Typer, console, fail, load, progress_bar

bench_app = Typer(help="Side-by-side measurements: the inference measuring stick.", no_args_is_help=True)

ModelOption = typer.Option(None, "--model", "-m", help="registry alias or checkpoint directory (default: inference.model)")
InputsOption = typer.Option(
    None,
    "--inputs",
    "-i",
    help="control sample ids (comma-separated) or a folder in the control format (default: the control set)",
)


def tryon(
    out: Path | None = typer.Option(
        None, "--out", "-o", help="folder for <sample>.png, grid.png and tryon.json (required without --shopper)"
    ),
    model: str | None = ModelOption,
    inputs: str | None = InputsOption,
    variant: str = typer.Option("recommended", help="recommended (the benchmark's choice), reference, or a variant's name"),
    seed: int | None = typer.Option(None, help="sampling seed (default: inference.seed)"),
    shopper: str | None = typer.Option(
        None,
        "--shopper",
        "-s",
        help="with this shopper's adapter (`drape shopper personalize`); --model is then the adapter's base",
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Render try-ons with a promoted model (and a shopper's adapter): seed fixed, one PNG per input and a grid."""
    from drape.inference.source import InferenceInputError
    from drape.inference.tryon import render_tryons
    from drape.layout import UnsafePathError
    from drape.shoppers import ShopperError

    cfg = load(config)
    if out is None and shopper is None:
        fail("--out is required (or --shopper, whose try-ons go to their own folder)")
    try:
        with progress_bar() as bar:
            task = bar.add_task("rendering try-ons", total=None)
            advance = lambda done, total: bar.update(task, completed=done, total=total)  # noqa: E731
            if shopper:
                from drape.shoppers.serve import shopper_tryons

                summary, out = shopper_tryons(cfg, shopper, out=out, inputs=inputs, variant=variant, seed=seed, progress=advance)
            else:
                assert out is not None
                summary = render_tryons(cfg, out=out, model=model, inputs=inputs, variant=variant, seed=seed, progress=advance)
    except (InferenceInputError, ShopperError, UnsafePathError) as error:
        fail(str(error))
    console.print(
        f"{len(summary['outputs'])} try-ons by {summary['model']} ({summary['steps']} steps, seed {summary['seed']}, "
        f"variant {summary['chosen']}) in {out}; grid: {out / summary['grid']}"
    )


@bench_app.command("inference")
def bench_inference(
    model: str | None = ModelOption,
    inputs: str | None = InputsOption,
    variant: list[str] = typer.Option([], "--variant", "-v", help="measure only these of inference.variants (repeatable)"),
    runs: int | None = typer.Option(None, min=10, help="timed requests per variant (default: inference.runs)"),
    queue: bool = typer.Option(
        False, "--queue", help="run as an inference-benchmark job through the GPU queue (a whole idle GPU)"
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Measure the reference, the control experiment and each variant, each in an isolated run; print
    the table; write the recommended variant next to the model, an MLflow run and Prometheus series."""
    from drape.inference.bench import new_bench_id, run_bench
    from drape.inference.publish import publish
    from drape.inference.report import footnotes
    from drape.inference.source import InferenceInputError
    from drape.layout import LiveLayout, live_root

    cfg = load(config)
    if runs:
        cfg = cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"runs": runs})})
    bench_id = new_bench_id()
    directory = LiveLayout(live_root(cfg)).inference(bench_id)
    try:
        if queue:
            from scheduler.jobs.inference import run_inference_benchmark

            _, report = run_inference_benchmark(
                cfg,
                bench_id=bench_id,
                model=model,
                inputs=inputs,
                variants=variant,
                on_line=lambda line: console.print(line, markup=False, highlight=False),
            )
        else:
            with progress_bar() as bar:
                task = bar.add_task("variants", total=None)

                def step(done: int, total: int, name: str) -> None:
                    bar.update(task, completed=done, total=total, description=f"measuring {name}")

                report = run_bench(cfg, model=model, inputs=inputs, only=variant or None, bench_id=bench_id, progress=step)
    except (InferenceInputError, ValueError) as error:
        fail(str(error))
    published = publish(cfg, report, directory, Path(report.home))
    console.print(report.rich_table())
    for line in footnotes(report.rows):
        console.print(f"[yellow]- {escape(line)}[/yellow]")
    for line in report.headline():
        console.print(f"- {line}", markup=False, highlight=False)
    console.print(
        f"report: {directory / 'report.json'}; inference config: {published['inference_config']}; "
        f"MLflow run {published['mlflow_run']}" + ("; series pushed" if published["pushed"] else "")
    )

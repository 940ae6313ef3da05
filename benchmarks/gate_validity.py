"""Does each gate check catch what it should, and only that? Detection and false-alarm rates.

Generates N control samples in memory per resolution, takes their targets as the clean outputs
(what a perfect model renders), and per check sets the per-sample threshold that gives the chosen
false-alarm rate on what must pass, then measures the detection rate of what must fail against it.

By default what must pass is the mild clean variants the gates were first tuned on (mild noise,
JPEG q90) and what must fail is the corruption suite (`drape.gates.suites.corruptions`). `--nuisance`
calibrates instead on the wider suite a reviewer accepts (`drape.gates.suites.nuisance`: shifts from
0.5 to 2 px, brightness, contrast, white balance, JPEG q60/q75, resizing, blur) and adds the
regression suite (`drape.gates.suites.regressions`: the control sample redrawn with one attribute moved
a little, from a quarter step of skin tone to a hem 12% shorter).

Each run measures the checks as the config has them, side by side per resolution on the same
samples, and prints one summary table (rates per resolution) and, with `--tables`, each
calibration's full distribution table. (It measured the opt-in aligned checks beside them until
they were removed: docs/gates.md, "Telling a regression from noise", has their last figures.) Then
the gate itself (`drape.gates.run.judge` with every threshold and change tolerance 'nuisance',
measured at the gate from the nuisance suite): its verdict on a control set of the config's size
made of each variant, in a first run and against a perfect baseline.

    .venv/bin/python benchmarks/gate_validity.py [--config configs/demo.yaml] [--samples 120] \\
        [--resolution 64 128 256] [--nuisance] [--tables] [--seed 1] [--no-verdicts | --verdicts-only] [--real]

`--real`: the real recognizers (dlib, PP-OCR) beside the pixel embedder and the glyph check, on real
photographs under the wide harmless suite and real regressions (benchmarks/gate_real.py).

`--seed` draws the control set with another generator seed than the config's: samples the checks
were not tuned on (held apart); `--no-verdicts` stops after the per-sample table; `--verdicts-only`
skips it (the gate measures its own floors, so the verdicts do not depend on it).

At the demo's 64 px a face is 11×14 pixels and a logo letter about 6×4: the production config
runs at 1024 px. The correlation texture check is measured with its default melted and mirrored
terms on (configs/demo.yaml turns them off for its one-minute model); `--as-configured` measures
the config's own settings.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from drape.config import PipelineConfig, TextureGateConfig, default_config_path, load_config
from drape.data.dataset import synthesize_split
from drape.gates.suites.calibration import Row, calibrate, render_table


def _variants(config: PipelineConfig, as_configured: bool) -> dict[str, PipelineConfig]:
    gates = config.gates
    if not as_configured:
        defaults = TextureGateConfig()
        texture = gates.texture.model_copy(
            update={"mirror_penalty": defaults.mirror_penalty, "sharpness_floor": defaults.sharpness_floor}
        )
        gates = gates.model_copy(update={"texture": texture})
    return {"configured": config.model_copy(update={"gates": gates})}


def _summary(results: dict[tuple[int, str], tuple[dict, list[Row]]], false_alarm: float, title: str) -> Table:
    table = Table(title=title)
    table.add_column("check")
    table.add_column("outputs")
    columns = list(results)
    for resolution, method in columns:
        table.add_column(f"{resolution} px {method}", justify="right")
    first = results[columns[0]][1]
    for index, row in enumerate(first):
        label = f"regression: {row.outputs}" if row.suite == "regression" else row.outputs
        cells = []
        for column in columns:
            other = results[column][1][index]
            met = other.rate >= 0.95 if other.aimed else other.rate <= false_alarm
            text = f"{other.rate:.0%}" if other.aimed else f"fa {other.rate:.1%}"
            cells.append(text if met else f"[red]{text}[/red]")
        table.add_row(row.check, label, *cells)
    table.add_row("", "threshold", *(" / ".join(f"{v:.3f}" for v in results[c][0].values()) for c in columns))
    return table


def _unscored_rows(clean_suite: dict, regressions: bool) -> list[Row]:
    """The per-sample table's rows in its order, without scores: what `--verdicts-only` judges."""
    from drape.gates.suites import corruptions
    from drape.gates.suites import regressions as redrawn

    rows = []
    for check in corruptions.CORRUPTIONS:
        rows += [Row(check, name, False, np.zeros(0), float("nan")) for name in clean_suite]
        rows += [Row(check, name, True, np.zeros(0), float("nan")) for name in corruptions.CORRUPTIONS[check]]
        if regressions:
            rows += [Row(check, name, True, np.zeros(0), float("nan"), suite="regression") for name in redrawn.REGRESSIONS[check]]
    return rows


def _subset(control: dict, size: int) -> dict:
    """The first `size` samples of a control split."""
    return {field: values[:size] for field, values in control.items()}


def _variant_outputs(row: Row, control: dict, seed: int) -> tuple[np.ndarray, int]:
    """(outputs, how many samples show it): the control targets with `row`'s variant where it shows,
    the targets themselves elsewhere (a model that regresses renders the rest as before)."""
    from drape.gates.suites import corruptions, regressions
    from drape.gates.suites.nuisance import NUISANCE

    targets, meta = control["target"], control["meta"]
    if row.suite == "regression":
        regression = regressions.REGRESSIONS[row.check][row.outputs]
        varied = regressions.render(regression, meta, seed)
        shows = regressions.applicable(regression, meta, varied, targets)
    else:
        variant = (
            NUISANCE.get(row.outputs) or corruptions.CLEAN.get(row.outputs) or corruptions.CORRUPTIONS[row.check][row.outputs]
        )
        varied = corruptions.apply(variant, targets, meta, control["garment_mask"], seed)
        shows = corruptions.applicable(variant, meta) if row.aimed else np.ones(len(meta), dtype=bool)
    return np.where(shows[:, None, None, None], varied, targets), int(shows.sum())


def gate_config(config: PipelineConfig) -> PipelineConfig:
    """`config` with every threshold and change tolerance measured at the gate ('nuisance')."""
    gates = config.gates
    update = {
        "identity": gates.identity.model_copy(update={"min_similarity": "nuisance", "max_drop": "nuisance"}),
        "texture": gates.texture.model_copy(update={"min_fidelity": "nuisance", "max_drop": "nuisance"}),
        "coherence": gates.coherence.model_copy(
            update={"min_score": "nuisance", "min_score_vs_baseline": "nuisance", "max_drop": "nuisance"}
        ),
        "nuisance_floor": True,
    }
    return config.model_copy(update={"gates": gates.model_copy(update=update)})


def _gate_verdicts(config: PipelineConfig, control: dict, rows: list[Row], size: int) -> dict[tuple[str, str], str]:
    """Per (check, outputs): the gate's own verdict (`drape.gates.run.judge`, thresholds and change
    tolerances 'nuisance') on the first `size` control samples, each rendered with that variant
    where it shows; first run (vs the ground truth) / against a baseline (the ground truth as a
    perfect baseline's outputs). A failing verdict names the checks that failed."""
    from drape.gates.run import check_scores, judge
    from drape.gates.verdict.floor import nuisance_levels
    from drape.gates.verdict.report import recorded

    config, control = gate_config(config), _subset(control, size)
    targets = control["target"]
    own = {name: recorded(values) for name, values in check_scores(config, control, targets, targets).items()}
    first = nuisance_levels(config, control)
    against = nuisance_levels(config, control, baseline_outputs=targets, baseline_scores=own)
    verdicts = {}
    for row in rows:
        outputs, shown = _variant_outputs(row, control, config.seed)
        if shown == 0:
            verdicts[(row.check, row.outputs)] = "n/a"
            continue
        common = dict(stage="denoise", run_id="benchmark", checkpoint="-", control=control, control_set="-", outputs=outputs)
        reports = (
            judge(config, baseline_outputs=None, baseline=None, levels=first, **common),
            judge(config, baseline_outputs=targets, baseline={"version": "perfect"}, levels=against, **common),
        )
        cells = [
            r.verdict + ("" if r.passed else f" ({','.join(n[0] for n, c in r.checks.items() if not c.passed)})") for r in reports
        ]
        verdicts[(row.check, row.outputs)] = " / ".join(cells) + (f" [{shown}]" if shown < size else "")
    return verdicts


def _verdict_table(verdicts: dict[tuple[int, str], dict], rows: list[Row], size: int) -> Table:
    table = Table(
        title=f"gate verdicts (drape.gates.run.judge, thresholds and tolerances 'nuisance') on a control set of {size} "
        "samples made of each variant: first run / vs a perfect baseline; (i, t, c): the checks that failed; "
        "[n]: the samples that show it, when fewer"
    )
    table.add_column("check")
    table.add_column("outputs")
    for resolution, method in verdicts:
        table.add_column(f"{resolution} px {method}", justify="right")
    for row in rows:
        expected = "fail" if row.aimed else "pass"
        cells = []
        for column in verdicts:
            verdict = verdicts[column][(row.check, row.outputs)]
            modes = verdict.split(" [")[0].split(" / ")
            good = verdict == "n/a" or all(mode.split(" ")[0] == expected for mode in modes)
            cells.append(verdict if good else f"[red]{verdict}[/red]")
        label = f"regression: {row.outputs}" if row.suite == "regression" else row.outputs
        table.add_row(row.check, label, *cells)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(default_config_path()))
    parser.add_argument("--samples", type=int, default=120)
    parser.add_argument("--false-alarm", type=float, default=0.01)
    parser.add_argument(
        "--resolution", type=int, nargs="+", default=None, help="render the control set at these sizes (default: the config's)"
    )
    parser.add_argument("--as-configured", action="store_true", help="the config's texture terms, not the defaults")
    parser.add_argument(
        "--nuisance",
        action="store_true",
        help="calibrate on the nuisance suite (drape.gates.suites.nuisance) and measure the regression suite too",
    )
    parser.add_argument("--tables", action="store_true", help="print each calibration's full table as well")
    parser.add_argument(
        "--seed", type=int, default=None, help="the generator's seed (default: the config's); another draws held-apart samples"
    )
    parser.add_argument("--no-verdicts", action="store_true", help="per-sample detection only, no gate verdicts")
    parser.add_argument("--verdicts-only", action="store_true", help="the gate verdicts only, no per-sample table")
    parser.add_argument(
        "--real", action="store_true", help="the real recognizers on real images instead (benchmarks/gate_real.py)"
    )
    args = parser.parse_args()
    if args.real:
        from gate_real import run  # benchmarks/ is on the path when this file runs as a script

        return run(args.samples, args.resolution or [128, 256], args.false_alarm)
    config = load_config(args.config)
    if args.seed is not None:
        config = config.model_copy(update={"seed": args.seed})
    from drape.gates.suites.corruptions import CLEAN

    suite = None
    if args.nuisance:
        from drape.gates.suites.nuisance import NUISANCE

        suite = {**CLEAN, **NUISANCE}
    label = "the nuisance suite" if args.nuisance else "mild clean variants (noise, JPEG q90)"
    console = Console(width=200)
    results: dict[tuple[int, str], tuple[dict, list[Row]]] = {}
    configs: dict[tuple[int, str], PipelineConfig] = {}
    controls: dict[int, dict] = {}
    for resolution in args.resolution or [config.data.resolution]:
        sized = config.model_copy(update={"data": config.data.model_copy(update={"resolution": resolution})})
        control = controls[resolution] = synthesize_split(sized, "control", args.samples)
        for method, variant in _variants(sized, args.as_configured).items():
            configs[(resolution, method)] = variant
            if args.verdicts_only:
                results[(resolution, method)] = {}, _unscored_rows(suite or CLEAN, args.nuisance)
                continue
            started = time.perf_counter()
            thresholds, rows = calibrate(
                variant, control, false_alarm=args.false_alarm, clean_suite=suite, regressions=args.nuisance
            )
            results[(resolution, method)] = thresholds, rows
            seconds = time.perf_counter() - started
            console.print(f"{resolution} px, {method}: {seconds:.0f} s for {args.samples} samples", highlight=False)
            if args.tables:
                title = (
                    f"{method} checks, {args.samples} samples at {resolution} px, thresholds at {args.false_alarm:.0%} on {label}"
                )
                console.print(render_table(thresholds, rows, false_alarm=args.false_alarm, title=title))
    title = (
        f"gate validity: per-sample detection (red below 95%) and false alarms (fa, red above {args.false_alarm:.0%}) at "
        f"thresholds set at {args.false_alarm:.0%} false alarms on {label}; {args.samples} control samples per resolution"
    )
    if not args.verdicts_only:
        console.print(_summary(results, args.false_alarm, title))
    if args.no_verdicts:
        return
    size = config.data.control_samples
    verdicts = {}
    for (resolution, method), (_, rows) in results.items():
        started = time.perf_counter()
        variant = configs[(resolution, method)]
        verdicts[(resolution, method)] = _gate_verdicts(variant, controls[resolution], rows, size)
        seconds = time.perf_counter() - started
        console.print(f"{resolution} px, {method}: gate verdicts in {seconds:.0f} s", highlight=False)
    console.print(_verdict_table(verdicts, next(iter(results.values()))[1], size))
    if args.verdicts_only:
        return
    detected = {
        column: float(np.median([row.rate for row in rows if row.aimed and len(row.scores)]))
        for column, (_, rows) in results.items()
    }
    console.print("median detection: " + ", ".join(f"{r} px {m} {v:.0%}" for (r, m), v in detected.items()), highlight=False)


if __name__ == "__main__":
    main()

"""`drape gate check | calibrate`: judge outputs from anywhere; measure the checks themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from drape.cli.common import ConfigOption, Typer, console, fail, load, stage_option

app = Typer(help="Validation gates, on outputs from anywhere.", no_args_is_help=True)


@app.command("check")
def gate_check(
    control: Path = typer.Option(..., help="dataset root (with manifest.json) or a folder of control shards"),
    outputs: Path = typer.Option(..., help="folder of output PNGs named <control sample id>.png"),
    baseline_outputs: Path | None = typer.Option(None, help="the last validated checkpoint's outputs, same names"),
    config: Path | None = ConfigOption,
    stage: str = stage_option("denoise", "whose thresholds apply: identity|texture|geometry|denoise"),
    report: Path | None = typer.Option(None, help="write the GateReport JSON here"),
) -> None:
    """Judge a folder of outputs on the control set. Exit 0 pass, 1 fail, 2 usage or input error."""
    import json

    from drape.data.dataset import load_control_dir
    from drape.data.shards import ShardError
    from drape.gates.recognizers import ControlSetError
    from drape.gates.run import judge, read_outputs
    from drape.gates.verdict.render import rich_table

    cfg = load(config)
    try:
        arrays, control_set = load_control_dir(control, judged=True)
        shape = arrays["target"].shape[1:3]
        produced = read_outputs(outputs, arrays["keys"], shape)
        reference = read_outputs(baseline_outputs, arrays["keys"], shape, reference=True) if baseline_outputs else None
    except (FileNotFoundError, ShardError, ValueError) as error:
        fail(f"input error: {error}")
    baseline = {"version": str(baseline_outputs)} if baseline_outputs else None
    try:
        result = judge(
            cfg,
            stage=stage,
            run_id="gate-check",
            checkpoint=str(outputs),
            control=arrays,
            control_set=control_set,
            outputs=produced,
            baseline_outputs=reference,
            baseline=baseline,
            outputs_dir=outputs,
        )
    except ControlSetError as error:  # the control set cannot be judged: bad input, not a failed gate
        fail(f"input error: {error}")
    console.print(rich_table(result, f"gate ({stage} thresholds) on {control_set}: {result.verdict.upper()}"))
    for line in result.failures():
        console.print(f"[red]- {line}[/red]")
    for line in result.notes():
        console.print(f"[yellow]- note: {line}[/yellow]")
    if report:
        report.write_text(json.dumps(result.to_dict(), indent=2))
    raise typer.Exit(0 if result.passed else 1)


@app.command("calibrate")
def gate_calibrate(
    config: Path | None = ConfigOption,
    samples: int = typer.Option(200, help="control samples to synthesize (when --control is not given)"),
    control: Path | None = typer.Option(None, help="dataset root or folder of control shards"),
    outputs: Path | None = typer.Option(
        None, help="clean outputs named by sample id, e.g. a trained stage's gate outputs (default: the targets)"
    ),
    baseline_outputs: Path | None = typer.Option(
        None, help="judge coherence against these outputs (default: the ground truth, as a first run)"
    ),
    stage: str = stage_option("denoise", "whose configured thresholds to show beside the calibrated ones"),
    false_alarm: float = typer.Option(0.01, help="false-alarm rate the thresholds are set for"),
    redraws: int = typer.Option(300, help="control sets redrawn to calibrate the gate's lower bound"),
    nuisance: bool = typer.Option(
        False,
        "--nuisance",
        help="calibrate on the nuisance suite (shifts, light, re-encoding, resizing, blur: what a reviewer accepts) "
        "instead of mild noise and JPEG q90; on a synthesized control set, measure the regression suite too",
    ),
    suite: str | None = typer.Option(
        None,
        help="with --nuisance: 'standard' or 'wide' (also tone curves, sharpening, denoising, resampling, compound "
        "registrations: drape.gates.suites.harmless); default: the config's gates.nuisance_suite",
    ),
    drift_margin: float = typer.Option(0.02, help="dlib: max_drift is the largest harmless drift of a sample plus this"),
    warp_margin: float = typer.Option(0.001, help="max_warp (local geometry) is the largest harmless warp of a sample plus this"),
    text_margin: float = typer.Option(0.05, help="OCR: min_text_lower is the lowest harmless lower bound less this"),
    write: Path | None = typer.Option(None, help="write the calibrated values as a new config that extends --config"),
) -> None:
    """Per-check score distributions on clean outputs and a corruption suite, the per-sample
    threshold that gives FALSE_ALARM and each corruption's detection rate; the same at the gate's
    level (the bootstrap lower bound, over redrawn control sets): the value thresholds a config
    takes; and what a recognizer's per-sample rules need at this resolution (--write: as a config)."""
    from drape.gates.recognizers import ControlSetError
    from drape.gates.suites.calibrated import rule_settings
    from drape.gates.suites.calibration import calibrate, gate_thresholds, render_gate_table, render_table

    cfg = load(config)
    _check_rates(false_alarm, redraws, (drift_margin, warp_margin, text_margin), write, config)
    arrays, clean, reference = _calibration_inputs(cfg, control, samples, outputs, baseline_outputs)
    clean_suite = _nuisance_suite(suite or cfg.gates.nuisance_suite) if nuisance else None
    regressions = nuisance and control is None and outputs is None  # redrawn targets: synthesized sets only
    options: dict[str, Any] = {"false_alarm": false_alarm, "clean_suite": clean_suite, "regressions": regressions}
    try:
        thresholds, rows = calibrate(cfg, arrays, clean_outputs=clean, reference_outputs=reference, **options)
    except ControlSetError as error:  # the control set cannot be judged: bad input
        fail(f"input error: {error}")
    source, versus = outputs and f"outputs in {outputs}" or "control targets", baseline_outputs or "the ground truth"
    title = f"per sample: {len(arrays['keys'])} samples, clean = {source}, coherence vs {versus}"
    console.print(render_table(thresholds, rows, false_alarm=false_alarm, title=title))
    gate, gate_rows = gate_thresholds(rows, false_alarm=false_alarm, redraws=redraws)
    configured = cfg.gates.thresholds(stage, vs_baseline=baseline_outputs is not None)
    title = (
        f"gate level: bootstrap lower bound over {redraws} redrawn control sets; "
        f"configured = {stage} thresholds in {config or 'the default config'}"
    )
    console.print(render_gate_table(gate, gate_rows, false_alarm=false_alarm, configured=configured, title=title))
    _print_config_lines(gate, stage, false_alarm, vs_baseline=baseline_outputs is not None)
    rules = rule_settings(cfg, rows, drift_margin=drift_margin, text_margin=text_margin, warp_margin=warp_margin)
    _rules(rules, arrays["target"].shape[1:3], write, config, cfg, gate, vs_baseline=baseline_outputs is not None, note=title)


def _rules(rules: list, shape, write: Path | None, config_path: Path | None, cfg, gate: dict, *, vs_baseline: bool, note: str):
    """Print the per-sample rules' settings at this resolution; with `write`, the calibrated config
    there (`write_calibrated`), or an input error (exit 2) naming why not."""
    from drape.gates.suites.calibrated import write_calibrated

    for setting in rules:
        console.print(f"{setting.line()} ({'x'.join(map(str, shape))} px)")
    if write is None or config_path is None:
        return
    try:
        write_calibrated(write, config_path, cfg, gate, rules, vs_baseline=vs_baseline, note=note)
    except ValueError as error:
        fail(f"input error: {error}")
    console.print(f"wrote {write}")


def _check_rates(false_alarm: float, redraws: int, margins: tuple[float, float, float], write, config) -> None:
    if not 0 < false_alarm < 0.5:
        fail(f"--false-alarm must be in (0, 0.5), got {false_alarm}")
    if redraws < 20:
        fail(f"--redraws must be at least 20, got {redraws}")
    for name, value in zip(("--drift-margin", "--warp-margin", "--text-margin"), margins):
        if not 0 < value <= 0.5:  # NaN fails both comparisons; 0 would put a rule exactly on a harmless kind
            fail(f"{name} must be a number in (0, 0.5] (a rule at zero margin passes a harmless kind by a hair), got {value}")
    if write is not None and config is None:
        fail("--write needs --config: the calibrated config extends it")


def _calibration_inputs(cfg, control: Path | None, samples: int, outputs: Path | None, baseline_outputs: Path | None):
    """(control arrays, clean outputs or None, coherence reference or None), or a clear input error."""
    from drape.data.dataset import load_control_dir, synthesize_split
    from drape.data.shards import ShardError
    from drape.gates.run import read_outputs

    try:
        arrays = load_control_dir(control, judged=True)[0] if control else synthesize_split(cfg, "control", samples)
        shape = arrays["target"].shape[1:3]
        clean = read_outputs(outputs, arrays["keys"], shape, reference=True) if outputs else None
        reference = read_outputs(baseline_outputs, arrays["keys"], shape, reference=True) if baseline_outputs else None
    except (FileNotFoundError, ShardError, ValueError) as error:
        fail(f"input error: {error}")
    return arrays, clean, reference


def _nuisance_suite(name: str) -> dict:
    """The clean variants and the harmless suite `name` ('standard' or 'wide', drape.gates.suites.harmless)."""
    from drape.gates.suites.corruptions import CLEAN
    from drape.gates.suites.harmless import suite

    try:
        return {**CLEAN, **suite(name)}
    except ValueError as error:
        fail(f"--suite: {error}")


def _print_config_lines(gate: dict[str, float], stage: str, false_alarm: float, *, vs_baseline: bool) -> None:
    """The calibrated gate thresholds as the config keys that take them, rounded down to 2 decimals."""
    import math

    coherence = "gates.coherence.min_score_vs_baseline" if vs_baseline else "gates.coherence.min_score"
    keys = {"identity": "gates.identity.min_similarity", "texture": "gates.texture.min_fidelity", "coherence": coherence}
    for check, value in gate.items():
        console.print(
            f"{keys[check]}: {math.floor(value * 100) / 100:.2f}   "
            f"# {stage}: {false_alarm:.1%} false alarms at the gate (drape gate calibrate)"
        )

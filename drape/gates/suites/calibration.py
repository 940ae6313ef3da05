"""Calibrate and validate the gate checks with a corruption suite.

From clean outputs (by default the control targets themselves: what a perfect model renders; or a
trained checkpoint's outputs) the clean variants (mild noise, JPEG) give each check's per-sample
distribution on good outputs; the per-sample threshold is its `false_alarm` quantile. Each
corruption aimed at a check is then scored against it: its detection rate is the share of
corrupted samples below the threshold. The false-alarm rate of each clean variant is measured the
same way. Coherence is judged against `reference_outputs` (a baseline's outputs) or, as in a
stage's first run, the ground truth.

The gate itself thresholds the bootstrap lower bound of each check's mean, not single samples:
`gate_thresholds` redraws control sets of the same size from the samples and gives, per check, the
lower-bound threshold that a model as good as the clean outputs falls below in `false_alarm` of
the redraws, and how often each corruption falls below it. Config thresholds come from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drape.config import PipelineConfig
from drape.gates.checks.checks import build_embedder
from drape.gates.run import check_scores
from drape.gates.suites.corruptions import CLEAN, CORRUPTIONS, Corruption, applicable, apply
from drape.gates.verdict.report import CHECKS, bootstrap_lower_bound, recorded


@dataclass
class Row:
    check: str
    outputs: str  # clean variant or corruption name
    aimed: bool  # a corruption aimed at this check (False: a clean variant)
    scores: np.ndarray
    rate: float  # detection rate for corruptions, false-alarm rate for clean variants
    suite: str = ""  # "regression" for drape.gates.suites.regressions rows
    # the check's per-sample rule values on these outputs (`RULES`: dlib's drift for identity, OCR's
    # text similarity for texture; None: the check has no such rule here)
    rule: np.ndarray | None = None

    def percentiles(self) -> tuple[float, float, float]:
        low, middle, high = np.percentile(self.scores, [1, 50, 99])
        return float(low), float(middle), float(high)


RULES = {"identity": "drift", "texture": "text"}  # a check's per-sample rule values, as check_scores names them


def _scores(
    config: PipelineConfig, control: dict, outputs: np.ndarray, reference: np.ndarray, checks=CHECKS, embedder=None
) -> dict[str, np.ndarray]:
    """Per-sample values of `checks` (and their rules' values), as a gate report records them (6
    decimals); coherence is judged against `reference`. `embedder`: built once by the caller (a
    recognizer describes each source face once, not once per variant)."""
    found = check_scores(config, control, outputs, reference, checks=checks, embedder=embedder)
    return {name: recorded(values) for name, values in found.items()}


def _suite_scores(config, control, clean, reference, suite: dict[str, Corruption], seed: int, embedder) -> dict:
    """{variant: {check: scores}} of the clean outputs under `suite`; the variants of the gate's own
    nuisance suite come from `drape.gates.verdict.floor.nuisance_scores`, which remembers them by content:
    a gate in this process that measures its floor on the same references reads them, not scores them again."""
    from drape.gates.suites.harmless import suite as harmless_suite
    from drape.gates.verdict.floor import nuisance_scores

    scored: dict[str, dict[str, np.ndarray]] = {}
    for name in ("standard", "wide"):
        variants = harmless_suite(name)
        if all(suite.get(variant) is corruption for variant, corruption in variants.items()):
            named = config.model_copy(update={"gates": config.gates.model_copy(update={"nuisance_suite": name})})
            scored = nuisance_scores(named, control, clean, reference, seed=seed, embedder=embedder)
    for name, variant in suite.items():
        if name not in scored:
            scored[name] = _scores(
                config,
                control,
                apply(variant, clean, control["meta"], control["garment_mask"], seed),
                reference,
                embedder=embedder,
            )
    return {name: scored[name] for name in suite}


def calibrate(
    config: PipelineConfig,
    control: dict,
    *,
    clean_outputs: np.ndarray | None = None,
    reference_outputs: np.ndarray | None = None,
    false_alarm: float = 0.01,
    seed: int = 0,
    clean_suite: dict[str, Corruption] | None = None,
    regressions: bool = False,
) -> tuple[dict[str, float], list[Row]]:
    """(per-sample threshold per check, table rows) for the given control set.

    Coherence is judged against `reference_outputs` when given (a baseline's outputs), else the
    control targets (the ground truth, as in a stage's first run). `clean_suite` is what must pass
    (default `CLEAN`; `drape.gates.suites.nuisance.NUISANCE` is the wider suite a reviewer accepts).
    `regressions` adds the rows of `drape.gates.suites.regressions` (a synthetic control set redrawn with
    one attribute moved: only meaningful when the clean outputs are the targets).
    """
    clean = control["target"] if clean_outputs is None else clean_outputs
    reference = control["target"] if reference_outputs is None else reference_outputs
    masks = control["garment_mask"]
    embedder = build_embedder(config.gates)
    clean_scores = _suite_scores(config, control, clean, reference, CLEAN if clean_suite is None else clean_suite, seed, embedder)
    # the strictest clean variant sets the threshold, so every variant stays within `false_alarm`
    thresholds = {
        check: min(float(np.quantile(s[check], false_alarm, method="inverted_cdf")) for s in clean_scores.values())
        for check in CORRUPTIONS
    }
    rows = []
    for check, threshold in thresholds.items():
        rule = RULES.get(check, "")
        for name, scores in clean_scores.items():
            rows.append(Row(check, name, False, scores[check], float(np.mean(scores[check] < threshold)), rule=scores.get(rule)))
        for name, corruption in CORRUPTIONS[check].items():
            counted = applicable(corruption, control["meta"])
            if not counted.any():  # e.g. no imported sample says it has a sleeve to lose: nothing to measure
                continue
            corrupted = apply(corruption, clean, control["meta"], masks, seed)
            scored = _scores(config, control, corrupted, reference, (check,), embedder)  # only the check it is aimed at
            picked = scored[rule][counted] if rule in scored else None
            rows.append(
                Row(check, name, True, scored[check][counted], float(np.mean(scored[check][counted] < threshold)), rule=picked)
            )
        if regressions:
            rows.extend(_regression_rows(config, control, check, threshold, reference))
    return thresholds, rows


def _regression_rows(config: PipelineConfig, control: dict, check: str, threshold: float, reference: np.ndarray) -> list[Row]:
    from drape.gates.suites import regressions

    rows = []
    for name, regression in regressions.REGRESSIONS[check].items():
        redrawn = regressions.render(regression, control["meta"], config.seed)
        keep = regressions.applicable(regression, control["meta"], redrawn, control["target"])
        score = _scores(config, control, redrawn, reference)[check][keep] if keep.any() else np.zeros(0)
        rate = float(np.mean(score < threshold)) if len(score) else float("nan")
        rows.append(Row(check, name, True, score, rate, suite="regression"))
    return rows


@dataclass
class GateRow:
    check: str
    outputs: str
    aimed: bool
    lower: float  # the gate's value (bootstrap lower bound of the mean) on these samples
    redrawn: np.ndarray  # the same over control sets redrawn from them
    rate: float  # share of redrawn sets below the gate threshold: detection for corruptions, false alarm for clean


def redrawn_lower_bounds(scores: np.ndarray, *, redraws: int = 300, seed: int = 0, size: int | None = None) -> np.ndarray:
    """The gate's statistic (`bootstrap_lower_bound`) on `redraws` control sets of `size` samples
    (default: as many as `scores`), drawn with replacement from these per-sample scores: how it
    varies with the samples drawn."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(scores), size=(redraws, size or len(scores)))
    return np.array([bootstrap_lower_bound(scores[pick], seed=seed + 1 + i) for i, pick in enumerate(picks)])


def gate_thresholds(
    rows: list[Row], *, false_alarm: float = 0.01, redraws: int = 300, seed: int = 0
) -> tuple[dict[str, float], list[GateRow]]:
    """(gate threshold per check, rows): the threshold on the bootstrap lower bound that the
    strictest clean variant falls below in `false_alarm` of redrawn control sets, and per clean
    variant and corruption its lower bound and how often it falls below that threshold."""
    gate_rows = [
        GateRow(
            row.check,
            row.outputs,
            row.aimed,
            bootstrap_lower_bound(row.scores),
            redrawn_lower_bounds(row.scores, redraws=redraws, seed=seed),
            0.0,
        )
        for row in rows
        if len(row.scores)
    ]
    thresholds = {}
    for check in dict.fromkeys(row.check for row in gate_rows):
        clean = [row.redrawn for row in gate_rows if row.check == check and not row.aimed]
        thresholds[check] = min(float(np.quantile(redrawn, false_alarm, method="inverted_cdf")) for redrawn in clean)
    for row in gate_rows:
        row.rate = float(np.mean(row.redrawn < thresholds[row.check]))
    return thresholds, gate_rows


def render_gate_table(
    thresholds: dict[str, float],
    rows: list[GateRow],
    *,
    false_alarm: float,
    title: str,
    configured: dict[str, float | str | None] | None = None,
):
    """A rich Table of the gate-level calibration: per check and outputs, the lower bound, its
    5th-95th percentile over redrawn control sets, and the rate below the gate threshold."""
    from rich.table import Table

    table = Table(title=title)
    columns = (
        ["check", "gate threshold"]
        + (["configured"] if configured is not None else [])
        + ["outputs", "lower bound", "redrawn p5", "redrawn p95", "rate"]
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("check", "outputs") else "right")
    for row in rows:
        p5, p95 = np.percentile(row.redrawn, [5, 95])
        kind, met = ("detection", row.rate >= 0.99) if row.aimed else ("false alarm", row.rate <= false_alarm)
        cells = [row.check, f"{thresholds[row.check]:.3f}"]
        if configured is not None:
            value = configured.get(row.check)
            cells.append("unset" if value is None else value if isinstance(value, str) else f"{value:.3f}")
        rate = f"{kind} {row.rate:.1%}" if met else f"[red]{kind} {row.rate:.1%}[/red]"
        table.add_row(*cells, row.outputs, f"{row.lower:.3f}", f"{p5:.3f}", f"{p95:.3f}", rate)
    return table


def render_table(thresholds: dict[str, float], rows: list[Row], *, false_alarm: float, title: str):
    """A rich Table: per check and outputs, the score distribution, the rate and whether it meets its goal
    (detection >= 99% for corruptions, false alarms <= `false_alarm` for clean variants)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("check", "threshold", "outputs", "p1", "median", "p99", "rate", "goal"):
        table.add_column(column, justify="left" if column in ("check", "outputs") else "right")
    for row in rows:
        if not len(row.scores):  # a regression none of these samples shows (no patterned garment to densify)
            table.add_row(row.check, f"{thresholds[row.check]:.3f}", f"regression: {row.outputs}", *["-"] * 3, "no sample", "-")
            continue
        p1, p50, p99 = row.percentiles()
        kind, met = ("detection", row.rate >= 0.99) if row.aimed else ("false alarm", row.rate <= false_alarm)
        table.add_row(
            row.check,
            f"{thresholds[row.check]:.3f}",
            f"regression: {row.outputs}" if row.suite == "regression" else row.outputs,
            f"{p1:.3f}",
            f"{p50:.3f}",
            f"{p99:.3f}",
            f"{kind} {row.rate:.1%}",
            "met" if met else "[red]missed[/red]",
        )
    return table

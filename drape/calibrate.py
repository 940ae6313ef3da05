"""Calibrate and validate the gate checks with a corruption suite.

From clean outputs (by default the control targets themselves: what a perfect model renders) the
clean variants give each check's per-sample distribution on good outputs; the per-sample threshold
is its `false_alarm` quantile. Each corruption aimed at a check is then scored against it: its
detection rate is the share of corrupted samples below the threshold. The false-alarm rate of each
clean variant is measured the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drape.config import PipelineConfig
from drape.corruptions import CLEAN, CORRUPTIONS, applicable, apply
from drape.validate import judge


@dataclass
class Row:
    check: str
    outputs: str  # clean variant or corruption name
    aimed: bool  # a corruption aimed at this check (False: a clean variant)
    scores: np.ndarray
    rate: float  # detection rate for corruptions, false-alarm rate for clean variants

    def percentiles(self) -> tuple[float, float, float]:
        return tuple(float(v) for v in np.percentile(self.scores, [1, 50, 99]))


def _scores(config: PipelineConfig, control: dict, outputs: np.ndarray, clean: np.ndarray) -> dict[str, np.ndarray]:
    """Per-sample values of every check; coherence is judged against the clean outputs."""
    report = judge(config, stage="denoise", run_id="calibrate", checkpoint="-", control=control, control_set="-",
                   outputs=outputs, baseline_outputs=clean, baseline={"version": "clean"})
    return {name: np.array(list(check.values.values())) for name, check in report.checks.items()}


def calibrate(config: PipelineConfig, control: dict, *, clean_outputs: np.ndarray | None = None, false_alarm: float = 0.01,
              seed: int = 0) -> tuple[dict[str, float], list[Row]]:
    """(per-sample threshold per check, table rows) for the given control set."""
    clean = control["target"] if clean_outputs is None else clean_outputs
    masks = control["garment_mask"]
    clean_scores = {name: _scores(config, control, apply(variant, clean, control["meta"], masks, seed), clean)
                    for name, variant in CLEAN.items()}
    # the strictest clean variant sets the threshold, so every variant stays within `false_alarm`
    thresholds = {check: min(float(np.quantile(s[check], false_alarm, method="inverted_cdf")) for s in clean_scores.values())
                  for check in CORRUPTIONS}
    rows = []
    for check, threshold in thresholds.items():
        for name, scores in clean_scores.items():
            rows.append(Row(check, name, False, scores[check], float(np.mean(scores[check] < threshold))))
        for name, corruption in CORRUPTIONS[check].items():
            corrupted = apply(corruption, clean, control["meta"], masks, seed)
            score = _scores(config, control, corrupted, clean)[check][applicable(corruption, control["meta"])]
            rows.append(Row(check, name, True, score, float(np.mean(score < threshold))))
    return thresholds, rows


def render_table(thresholds: dict[str, float], rows: list[Row], *, false_alarm: float, title: str):
    """A rich Table: per check and outputs, the score distribution, the rate and whether it meets its goal
    (detection >= 99% for corruptions, false alarms <= `false_alarm` for clean variants)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("check", "threshold", "outputs", "p1", "median", "p99", "rate", "goal"):
        table.add_column(column, justify="left" if column in ("check", "outputs") else "right")
    for row in rows:
        p1, p50, p99 = row.percentiles()
        kind, met = ("detection", row.rate >= 0.99) if row.aimed else ("false alarm", row.rate <= false_alarm)
        table.add_row(row.check, f"{thresholds[row.check]:.3f}", row.outputs, f"{p1:.3f}", f"{p50:.3f}", f"{p99:.3f}",
                      f"{kind} {row.rate:.1%}", "met" if met else "[red]missed[/red]")
    return table

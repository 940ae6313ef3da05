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
from pathlib import Path

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
    embedder = build_embedder(config.gates) if config.gates.identity.method == "embedding" else None
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


@dataclass(frozen=True)
class RuleSetting:
    """What one per-sample rule needs on this control set, at its resolution: `value` for config key
    `key`, from the harmless `level` (set by `variant`) and the stated `margin`; `weakest` is the
    nearest aimed corruption (its value and name: the margin left to what the rule must catch)."""

    key: str
    value: float
    level: float
    variant: str
    margin: float
    weakest: tuple[float, str] | None

    def line(self) -> str:
        """The config line, with where the value came from."""
        caught = f"; nearest corruption {self.weakest[1]} {self.weakest[0]:.3f}" if self.weakest else ""
        return f"{self.key}: {self.value:.2f}   # harmless {self.level:.3f} ({self.variant}), margin {self.margin:g}{caught}"


def _ceil(value: float) -> float:
    return float(np.ceil(round(value * 100, 6)) / 100)


def _floor(value: float) -> float:
    return float(np.floor(round(value * 100, 6)) / 100)


def _ruled(rows: list[Row], check: str, aimed: bool) -> list[tuple[Row, np.ndarray]]:
    """(row, its rule values) of `check`'s rows (aimed corruptions or harmless ones) that measured
    the rule on some sample."""
    return [
        (r, r.rule) for r in rows if r.check == check and r.aimed == aimed and r.rule is not None and np.isfinite(r.rule).any()
    ]


def drift_setting(rows: list[Row], *, same_similarity: float, margin: float) -> RuleSetting | None:
    """`gates.identity.max_drift`: the largest per-sample drift of the same face under the harmless
    variants, plus `margin` (rounded up to 2 decimals); None when no row measured drift. `weakest`:
    the smallest drift of an identity corruption's sample that the same-person rule still calls
    the same person (a drift only the drift rule can catch)."""
    harmless = [(float(np.nanmax(drift)), r.outputs) for r, drift in _ruled(rows, "identity", False)]
    if not harmless:
        return None
    level, variant = max(harmless)
    aimed = []
    for r, drift in _ruled(rows, "identity", True):
        keep = np.isfinite(drift) & (r.scores >= same_similarity)
        if keep.any():
            aimed.append((float(np.min(drift[keep])), r.outputs))
    return RuleSetting("gates.identity.max_drift", _ceil(level + margin), level, variant, margin, min(aimed) if aimed else None)


def text_settings(rows: list[Row], *, min_similarity: float, margin: float) -> list[RuleSetting]:
    """`gates.texture.min_text_lower` (the lowest bootstrap lower bound of the mean text similarity
    under the harmless variants, less `margin`, rounded down) and `gates.texture.max_misread_share`
    (the largest share of samples misread, read otherwise than the target, under a harmless
    variant, rounded up); `weakest`: the aimed corruption read most like the target. Empty when
    no row read text (OCR off, or no mark read in any target)."""
    harmless, aimed = _ruled(rows, "texture", False), _ruled(rows, "texture", True)
    if not harmless:
        return []
    level, variant = min((bootstrap_lower_bound(text), r.outputs) for r, text in harmless)
    nearest = max(((bootstrap_lower_bound(text), r.outputs) for r, text in aimed), default=None)
    lower = RuleSetting("gates.texture.min_text_lower", max(_floor(level - margin), 0.01), level, variant, margin, nearest)
    share, share_variant = max((_misread(text, min_similarity), r.outputs) for r, text in harmless)
    caught = min(((_misread(text, min_similarity), r.outputs) for r, text in aimed), default=None)
    return [lower, RuleSetting("gates.texture.max_misread_share", _ceil(share), share, share_variant, 0.0, caught)]


def _misread(values: np.ndarray, min_similarity: float) -> float:
    """The share of judged samples (a target whose mark reads as text) read otherwise than the target."""
    judged = values[np.isfinite(values)]
    return float(np.mean(judged < min_similarity - 1e-9)) if len(judged) else 0.0


def rule_settings(config: PipelineConfig, rows: list[Row], *, drift_margin: float, text_margin: float) -> list[RuleSetting]:
    """The per-sample rules' settings (`drift_setting`, `text_settings`) these rows call for under
    `config`'s recognizer rules (dlib's same-person distance, OCR's per-sample similarity)."""
    identity, texture = config.gates.identity, config.gates.texture
    settings = []
    if identity.embedder == "dlib" and identity.max_drift is not None:
        same = 1.0 - (identity.same_person or 0.6)
        found = drift_setting(rows, same_similarity=same, margin=drift_margin)
        settings += [found] if found else []
    if texture.ocr != "off":
        settings += text_settings(rows, min_similarity=texture.min_text_similarity, margin=text_margin)
    return settings


VALUE_KEYS = {
    "identity": ("identity", "min_similarity"),
    "texture": ("texture", "min_fidelity"),
    "coherence": ("coherence", "min_score"),
}


def calibrated_overlay(
    config_path: Path, config: PipelineConfig, gate: dict[str, float], rules: list[RuleSetting], *, vs_baseline: bool
) -> dict:
    """The config that extends `config_path` with the calibrated values: each value threshold
    (rounded down to 2 decimals) unless the config's is 'nuisance' or 'off' (measured at each gate,
    or not judged), and the per-sample rules' settings."""
    gates: dict[str, dict] = {}
    for check, value in gate.items():
        section, key = VALUE_KEYS[check]
        key = "min_score_vs_baseline" if vs_baseline and check == "coherence" else key
        if getattr(getattr(config.gates, section), key) not in ("nuisance", "off"):
            gates.setdefault(section, {})[key] = _floor(value)
    for setting in rules:
        _, section, key = setting.key.split(".")
        gates.setdefault(section, {})[key] = setting.value
    return {"extends": str(Path(config_path).resolve()), "gates": gates}


def write_calibrated(
    path: Path,
    config_path: Path,
    config: PipelineConfig,
    gate: dict[str, float],
    rules: list[RuleSetting],
    *,
    vs_baseline: bool,
    note: str,
) -> None:
    """Write `calibrated_overlay` to `path` (a new file): to a temporary name, loaded back as a
    config (every value validated), then renamed; ValueError if `path` exists or does not load."""
    import os
    import tempfile

    import yaml

    from drape.config import load_config

    path = Path(path)
    if path.exists():
        raise ValueError(f"--write {path}: the file exists; name a new one")
    overlay = calibrated_overlay(config_path, config, gate, rules, vs_baseline=vs_baseline)
    header = "".join(f"# {line}\n" for line in [f"drape gate calibrate: {note}", *(s.line() for s in rules)])
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(header + yaml.safe_dump(overlay, sort_keys=False))
        load_config(temporary)  # the calibrated config must load: bounds, extends and every field
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

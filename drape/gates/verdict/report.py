"""Gate verdicts: aggregate per-sample check values and apply thresholds the way TFX's Evaluator does.

Each check has a value threshold, applied to a lower confidence bound of its mean (the bootstrap
5th percentile), so a few bad samples cannot hide behind a good average; and optionally a change
threshold against the stage baseline: the candidate's mean may not fall more than `max_drop`
below the baseline's mean on the same control set. No value threshold means no promotion, never a
silent pass. Without a baseline (a first run) the change check is skipped and the report says why.
Each check also carries its nuisance floor (`drape.gates.verdict.floor`: what accepted variations of its
reference score) and the candidate's margin over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CHECKS = ("identity", "texture", "coherence")
SCHEMA = "drape.gate_report/v4"  # v3: provenance; v4: method, nuisance floor and margin, change-check source


def bootstrap_lower_bound(
    values: list[float] | np.ndarray, *, quantile: float = 0.05, resamples: int = 2000, seed: int = 0
) -> float:
    """The `quantile` of the bootstrap distribution of the mean (fixed seed: reports are reproducible);
    NaN values (a recognizer found no face: counted apart, `SampleRule`) are left out."""
    given = np.asarray(values, dtype=np.float64)
    values = given[np.isfinite(given)]
    if len(values) < 2:
        return float(values.mean()) if len(values) else float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    return float(np.quantile(means, quantile))


def recorded(values) -> np.ndarray:
    """Per-sample values as a report records them (6 decimals): floors and calibrations use these
    too, so a value equal to a floor compares equal."""
    return np.array([round(float(value), 6) for value in values])


@dataclass(frozen=True)
class SampleRule:
    """A per-sample rule beside a check's mean, in a recognizer's own terms: a face recognizer's
    same-person rule, or OCR's text read the same. A sample fails it when its value is NaN (`missing`:
    no face found) or below `minimum` (`below`: another person, text misread); more failing samples
    than `max_share` of those judged fails the check. `values`: the samples judged (a garment with no
    text in its source has no text to misread)."""

    values: dict[str, float]
    minimum: float
    max_share: float
    terms: str  # the rule as the recognizer states it, e.g. "dlib distance 0.600 (one person at ≤ 0.60)"
    missing: str = "no face found"
    below: str = "another person"
    min_lower: float | None = None  # and the bootstrap lower bound of the judged values' mean at least this
    # a second per-sample limit, on a distance (higher: further): a face recognizer's drift of the same person
    drift: dict[str, float] | None = None
    max_drift: float | None = None
    drift_terms: str = ""
    drifted: str = "drifted"

    @property
    def lower(self) -> float:
        return bootstrap_lower_bound(list(self.values.values()))

    @property
    def lower_passed(self) -> bool:
        return self.min_lower is None or not self.values or bool(self.lower >= self.min_lower)

    def outcomes(self) -> dict[str, list[str]]:
        found = {
            self.missing: [key for key, value in self.values.items() if not np.isfinite(value)],
            self.below: [key for key, value in self.values.items() if np.isfinite(value) and value < self.minimum - 1e-9],
        }
        if self.drift is not None and self.max_drift is not None:
            limit, drift = self.max_drift, self.drift
            found[self.drifted] = [
                key
                for key, value in self.values.items()
                if np.isfinite(value) and value >= self.minimum - 1e-9 and drift.get(key, np.nan) > limit + 1e-9
            ]
        return found

    @property
    def share_passed(self) -> bool:
        failing = sum(len(keys) for keys in self.outcomes().values())
        return failing <= self.max_share * len(self.values) + 1e-9

    @property
    def passed(self) -> bool:
        return self.share_passed and self.lower_passed

    def failures(self, check: str) -> list[str]:
        lines = []
        if not self.lower_passed:
            lines.append(f"{check}: {self.terms}: lower bound {self.lower:.4f} of the mean < {self.min_lower:.4f}")
        if self.share_passed:
            return lines
        for outcome, keys in self.outcomes().items():
            if keys:
                shown = ", ".join(keys[:5]) + (" …" if len(keys) > 5 else "")
                terms = (
                    f" ({self.terms})" if outcome == self.below else f" ({self.drift_terms})" if outcome == self.drifted else ""
                )
                lines.append(f"{check}: {outcome} in {len(keys)} of {len(self.values)} outputs{terms}: {shown}")
        failing = sum(len(keys) for keys in self.outcomes().values())
        fired = self.fired()
        lines.append(
            f"{check}: {failing} of {len(self.values)} samples fail, more than {self.max_share:.1%}; "
            f"{'the rule that fired' if len(fired) == 1 else 'the rules that fired'}: {'; '.join(fired)}"
        )
        return lines

    def fired(self) -> list[str]:
        """The rules that failed a sample, each in its own terms: no face found, another person (the
        distance rule), drifted (the drift rule); what the gate's summary names, so an alert says which."""
        outcomes, terms = self.outcomes(), {self.below: self.terms, self.drifted: self.drift_terms}
        return [f"{outcome} ({terms[outcome]})" if terms.get(outcome) else outcome for outcome, keys in outcomes.items() if keys]

    def to_dict(self) -> dict:
        return {
            **self.outcomes(),
            "rule": self.terms,
            "fired": [] if self.share_passed else self.fired(),
            "max_share": self.max_share,
            "judged": len(self.values),
            "passed": self.passed,
        }


@dataclass
class CheckResult:
    name: str
    values: dict[str, float]
    threshold: float | None
    reference: str = ""
    baseline_mean: float | None = None
    max_drop: float | None = None
    change_note: str = ""  # why the change check was skipped, when it was
    method: str = ""  # how the check scored (gates.<check>.method)
    # or "nuisance floor (<variant>)": the threshold is the floor measured at the gate; "off": not judged
    threshold_source: str = "config"
    floor: float | None = None  # the lowest lower bound any nuisance variant of the reference reaches
    floor_variant: str = ""  # the variant that set it
    change_mean: float | None = None  # the mean the change check compares (on the ground-truth scale); None: `mean`
    drop_source: str = ""  # where max_drop came from: "config" or "nuisance (<variant>)"
    rule: SampleRule | None = None  # a recognizer's per-sample rule (dlib, ArcFace, OCR), when one judges
    mean: float = field(init=False)
    lower: float = field(init=False)
    minimum: float = field(init=False)

    def __post_init__(self) -> None:
        scores = np.array(list(self.values.values()), dtype=np.float64)
        found = scores[np.isfinite(scores)]  # NaN: no face found, never a low score
        self.mean = float(found.mean()) if len(found) else float("nan")
        self.minimum = float(found.min()) if len(found) else float("nan")
        self.lower = bootstrap_lower_bound(found)

    @property
    def margin(self) -> float | None:
        """The lower bound over the nuisance floor (negative: below what harmless variation scores)."""
        return None if self.floor is None else self.lower - self.floor

    @property
    def value_passed(self) -> bool:
        if self.threshold_source == "off":  # measured and reported, judged by no threshold (gates.<check> "off")
            return True
        return self.threshold is not None and bool(np.isfinite(self.lower)) and self.lower >= self.threshold

    @property
    def change_checked(self) -> bool:
        return self.baseline_mean is not None and self.max_drop is not None

    @property
    def change_passed(self) -> bool:
        if self.baseline_mean is None or self.max_drop is None:  # not checked
            return True
        # the fall compared with the tolerance, with room for rounding: a tolerance is the fall of a
        # nuisance variant's mean (`drape.gates.verdict.floor.tolerances`), and that variant itself must pass
        # (1 - 0.48355083 re-derived as a mean read 1 ulp past a tolerance of 0.51644917)
        return self.baseline_mean - self.compared_mean <= self.max_drop + 1e-9

    @property
    def compared_mean(self) -> float:
        return self.mean if self.change_mean is None else self.change_mean

    @property
    def passed(self) -> bool:
        return self.value_passed and self.change_passed and (self.rule is None or self.rule.passed)

    def note(self) -> str:
        """A warning when the threshold asks more than the ground truth under harmless variation
        scores (a perfect output under that variant would fail); empty otherwise."""
        if self.floor is None or self.threshold is None or self.threshold <= self.floor:
            return ""
        return (
            f"{self.name}: threshold {self.threshold:.4f} is above the nuisance floor {self.floor:.4f}: a perfect output "
            f"under '{self.floor_variant}' would fail it"
        )

    def at_threshold(self) -> str:
        """A warning when a lower bound that passed sits exactly at its threshold (zero margin: a
        threshold 'nuisance' without `gates.floor_margin` is the floor, which the harmless variant that
        set it reaches exactly; a hair worse fails); empty otherwise. The per-sample rule's lower bound
        (OCR's `min_text_lower`) likewise."""
        found = []
        if self.value_passed and self.threshold is not None and abs(self.lower - self.threshold) <= 1e-9:
            found.append(f"lower bound {self.lower:.4f} is exactly the threshold ({self.threshold_source})")
        rule = self.rule
        if rule is not None and rule.min_lower is not None and rule.values and rule.lower_passed:
            if abs(rule.lower - rule.min_lower) <= 1e-9:
                found.append(f"{rule.terms}: lower bound {rule.lower:.4f} is exactly its minimum")
        return f"{self.name}: passed at zero margin: {'; '.join(found)}" if found else ""

    def aggregates(self) -> dict[str, float]:
        """The aggregates metrics carry: ``lower`` (bootstrap 5th percentile), ``mean``, ``min``."""
        return {"lower": self.lower, "mean": self.mean, "min": self.minimum}

    def failures(self) -> list[str]:
        """One line per failed condition, naming the check, the value and the threshold."""
        lines = []
        if self.threshold_source == "off":
            pass
        elif self.threshold is None:
            lines.append(f"{self.name}: no threshold configured, so nothing can be promoted")
        elif not np.isfinite(self.lower):
            lines.append(f"{self.name}: no sample could be scored (no face found in any output)")
        elif not self.value_passed:
            floor = f", nuisance floor {self.floor:.4f} ({self.floor_variant})" if self.floor is not None else ""
            lines.append(
                f"{self.name}: lower bound {self.lower:.4f} (mean {self.mean:.4f}) < threshold {self.threshold:.4f}{floor}"
            )
        lines += self.rule.failures(self.name) if self.rule else []
        if not self.change_passed:
            scale = " vs the ground truth" if self.change_mean is not None and self.change_mean != self.mean else ""
            source = f" ({self.drop_source})" if self.drop_source else ""
            lines.append(
                f"{self.name}: mean{scale} {self.compared_mean:.4f} fell more than {self.max_drop:.4f}{source} below the "
                f"baseline's {self.baseline_mean:.4f}"
            )
        return lines

    def to_dict(self) -> dict:
        change = {
            "baseline_mean": self.baseline_mean,
            "max_drop": self.max_drop,
            "checked": self.change_checked,
            "passed": self.change_passed,
            "note": self.change_note,
            "mean": self.compared_mean if self.change_checked else None,
            "max_drop_from": self.drop_source,
        }
        finite = lambda value: float(value) if value is not None and np.isfinite(value) else None  # noqa: E731  JSON has no NaN
        return {
            "values": {key: finite(value) for key, value in self.values.items()},
            "rule": self.rule.to_dict() if self.rule else None,
            "mean": finite(self.mean),
            "lower": finite(self.lower),
            "min": finite(self.minimum),
            "threshold": self.threshold,
            "threshold_from": self.threshold_source,
            "method": self.method,
            "nuisance_floor": self.floor,
            "nuisance_floor_variant": self.floor_variant,
            "margin": finite(self.margin),
            "value_passed": self.value_passed,
            "change": change,
            "passed": self.passed,
            "reference": self.reference,
            "failures": self.failures(),
        }


@dataclass
class GateReport:
    stage: str
    run_id: str
    checkpoint: str
    control_set: str
    checks: dict[str, CheckResult] = field(default_factory=dict)
    baseline: dict | None = None
    # problems with where the candidate came from (drape.gates.run.provenance_problems) and constant
    # outputs (drape.gates.checks.degenerate): any of them fails the gate whatever the scores
    provenance: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.provenance and set(self.checks) == set(CHECKS) and all(check.passed for check in self.checks.values())

    @property
    def verdict(self) -> str:
        return "pass" if self.passed else "fail"

    def failures(self) -> list[str]:
        return [*self.provenance, *(line for check in self.checks.values() for line in check.failures())]

    def notes(self) -> list[str]:
        """Warnings that do not fail the gate: thresholds above their nuisance floor, then lower bounds
        that passed exactly at their threshold (zero margin)."""
        above = [note for check in self.checks.values() if (note := check.note())]
        return above + [note for check in self.checks.values() if (note := check.at_threshold())]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "stage": self.stage,
            "run_id": self.run_id,
            "checkpoint": self.checkpoint,
            "control_set": self.control_set,
            "verdict": self.verdict,
            "baseline": self.baseline,
            "provenance": self.provenance,
            "checks": {name: check.to_dict() for name, check in self.checks.items()},
            "failures": self.failures(),
            "notes": self.notes(),
        }

    def worst_samples(self, per_check: int) -> list[tuple[str, str, float]]:
        """(check, sample id, value) for the `per_check` lowest values of each check, worst first."""
        rows = []
        for name, check in self.checks.items():
            ranked = sorted(check.values.items(), key=lambda item: item[1])[:per_check]
            rows += [(name, key, value) for key, value in ranked]
        return rows

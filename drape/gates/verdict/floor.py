"""The nuisance floor: what each check scores on accepted variations of its reference, at gate time.

A threshold means something only next to what harmless variation scores. So the gate applies the
nuisance suite (`drape.gates.suites.nuisance`: shifts up to 2 px, a few percent of light, JPEG q60-q75,
resizing, slight blur; with `gates.nuisance_suite: wide` also tone curves, sharpening, denoising,
other resampling and compound registrations, `drape.gates.suites.harmless`) to the references it judges
against and scores every variant the way it scores the candidate, on the same control set:

- **floor** (the value check): the lowest bootstrap lower bound any nuisance variant of the
  reference reaches. Identity and texture compare with the control targets, so their floor comes
  from the targets under nuisance; coherence compares with the ground truth in a first run and
  with the baseline's outputs after one, so its floor comes from whichever it compares with. A
  perfect output under any accepted variation reaches the floor: a threshold `nuisance` is the
  floor, a configured one above it is noted in the report, and the report gives each check's
  margin over it.
- **tolerance** (the change check against a baseline): the largest fall of a check's mean, on the
  ground-truth scale, when the baseline's own outputs go through the nuisance suite. A candidate
  whose mean falls further below the baseline's than a re-encoded, relit or misregistered copy of
  the baseline does has changed; JPEG alone cannot trip it, whatever the check's scale.

Neither depends on how good the model is: the floor is a property of the ground truth and the
check, the tolerance of the baseline and the check.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from drape.config import PipelineConfig
from drape.gates.checks.checks import FaceEmbedder
from drape.gates.recognizers import RecognizerCheck
from drape.gates.suites.harmless import suite
from drape.gates.verdict.report import CHECKS, bootstrap_lower_bound, recorded


@dataclass(frozen=True)
class Level:
    """One check's level under nuisance: the value and the variant that set it."""

    value: float
    variant: str


def nuisance_scores(
    config: PipelineConfig,
    control: dict,
    images: np.ndarray,
    coherence_reference: np.ndarray,
    *,
    checks: Collection[str] = CHECKS,
    seed: int = 0,
    embedder: FaceEmbedder | RecognizerCheck | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """{variant: {check: per-sample scores}} of `images` under each nuisance variant; identity and
    texture against the control targets, coherence against `coherence_reference`.

    Remembered in this process by content (`_MEASURED`): a run's first gates all measure the floor
    on the same control targets, and with a recognizer (dlib's two descriptors, OCR's three crops)
    on the wide suite that is minutes per gate on the flow's CPU; the second stage on is a lookup."""
    key = _content_key(config, control, images, coherence_reference, checks, seed)
    if key not in _MEASURED:
        if len(_MEASURED) >= 8:
            _MEASURED.pop(next(iter(_MEASURED)))
        _MEASURED[key] = _measure(config, control, images, coherence_reference, checks, seed, embedder)
    return _MEASURED[key]


_MEASURED: dict[str, dict[str, dict[str, np.ndarray]]] = {}


def _content_key(config: PipelineConfig, control: dict, images: np.ndarray, reference: np.ndarray, checks, seed: int) -> str:
    """What the scores are a function of: the images, the reference, the control set's targets and
    metadata, the gates' settings, the checks and the seed."""
    digest = hashlib.sha256()
    for array in (images, reference, control["target"]):
        digest.update(repr(array.shape).encode() + np.ascontiguousarray(array).tobytes())
    fields = [control["keys"], control["meta"], scoring_settings(config), sorted(checks), seed]
    digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return digest.hexdigest()


# gates settings that decide verdicts, never a score: a config that differs from another only in these
# (a calibrated overlay, `drape gate calibrate --write`) reads the scores the other measured
JUDGING_ONLY = {
    "identity": ("min_similarity", "min_similarity_vs_baseline", "max_drop", "max_mismatch_share", "same_person"),
    "texture": ("min_fidelity", "max_drop", "min_text_similarity", "max_misread_share", "min_text_lower"),
    "coherence": ("min_score", "min_score_vs_baseline", "max_drop"),
    "": ("floor_margin", "grid_samples", "batch_size", "sample_seed", "nuisance_floor"),
}


def scoring_settings(config: PipelineConfig) -> dict:
    """The gates settings a check's scores depend on: all but `JUDGING_ONLY`; of the drift rules
    (`max_drift`, `max_warp`), only whether each is set (the drift is then measured; the limit itself
    judges: a calibrated overlay that moves it reads the scores the config it extends measured)."""
    settings = config.gates.model_dump(mode="json")
    for section, names in JUDGING_ONLY.items():
        for name in names:
            (settings[section] if section else settings).pop(name, None)
    for rule in ("max_drift", "max_warp"):
        settings["identity"][rule] = settings["identity"].get(rule) is not None
    return settings


def _measure(config, control, images, coherence_reference, checks, seed, embedder) -> dict[str, dict[str, np.ndarray]]:
    from drape.gates.run import check_scores  # run imports this module

    scored = {}
    for name, variant in suite(config.gates.nuisance_suite).items():
        varied = variant(images, control["meta"], np.random.default_rng(seed))
        scores = check_scores(config, control, varied, coherence_reference, checks=checks, embedder=embedder)
        scored[name] = {check: recorded(values) for check, values in scores.items()}
    return scored


def floors(scored: dict[str, dict[str, np.ndarray]]) -> dict[str, Level]:
    """Per check, the lowest bootstrap lower bound of the mean over the nuisance variants."""
    levels: dict[str, Level] = {}
    for name, scores in scored.items():
        for check, values in scores.items():
            lower = bootstrap_lower_bound(values)
            if not np.isfinite(lower):  # no face found in any sample: a recognizer's outcome, not a similarity
                continue
            if check not in levels or lower < levels[check].value:
                levels[check] = Level(lower, name)
    return levels


def tolerances(scored: dict[str, dict[str, np.ndarray]], own: dict[str, np.ndarray]) -> dict[str, Level]:
    """Per check, the largest fall of the mean from `own` (the unvaried images' scores) under any
    nuisance variant; never below 0."""
    levels: dict[str, Level] = {}
    for name, scores in scored.items():
        for check, values in scores.items():
            # NaN: no face found (a recognizer's own outcome, counted apart from the similarities)
            fall = float(np.nanmean(own[check]) - np.nanmean(values)) if np.isfinite(values).any() else 0.0
            drop = max(fall, 0.0) if np.isfinite(fall) else 0.0
            if check not in levels or drop > levels[check].value:
                levels[check] = Level(drop, name)
    return levels


@dataclass(frozen=True)
class NuisanceLevels:
    """What the gate compares a candidate with, besides its thresholds: per check, the value floor
    and (against a baseline) the change tolerance, each with the variant that set it."""

    floor: dict[str, Level]
    tolerance: dict[str, Level]


def nuisance_levels(
    config: PipelineConfig,
    control: dict,
    *,
    baseline_outputs: np.ndarray | None = None,
    baseline_scores: dict[str, np.ndarray] | None = None,
    embedder: FaceEmbedder | RecognizerCheck | None = None,
) -> NuisanceLevels:
    """The floors for a gate on `control` and, with `baseline_outputs` (and their own scores on the
    ground-truth scale, `baseline_scores`), the change tolerances.

    Cost: the checks run on 13 variants of the targets, and with a baseline on 13 variants of its
    outputs twice for coherence (against the baseline and against the ground truth).
    """
    targets = control["target"]
    if baseline_outputs is None:
        return NuisanceLevels(floors(nuisance_scores(config, control, targets, targets, embedder=embedder)), {})
    on_targets = nuisance_scores(config, control, targets, targets, checks=("identity", "texture"), embedder=embedder)
    on_baseline = nuisance_scores(config, control, baseline_outputs, targets, embedder=embedder)
    vs_baseline = nuisance_scores(config, control, baseline_outputs, baseline_outputs, checks=("coherence",), embedder=embedder)
    floor = {**floors(on_targets), **floors(vs_baseline)}
    return NuisanceLevels(floor, tolerances(on_baseline, baseline_scores or {}))

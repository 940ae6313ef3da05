"""Quality of a variant against the reference, where numerics mean something, and when it is approved.

Two kinds of figure, both against the reference variant's own run:
- **attention**: the cosine similarity of each attention block's output on the same noisy input
  (`stick.attention_outputs`); the figure is the worst block on the worst input;
- **the gate's three checks** on the variant's renders, scored with the reference's renders in
  the place of the ground truth (identity and texture) and of the baseline (coherence); the
  figure is each check's mean over the captured inputs.

The noise floor is the control experiment: the reference run again with a change that must not
matter (compile on/off by default). A variant is approved only when every figure is within the
floor less its tolerance (`inference.quality`), so a change no bigger than what compilation alone
does passes, and pixel noise is never mistaken for a regression (nor a regression for noise).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from drape.config import PipelineConfig, QualityConfig


@dataclass
class Quality:
    attention_min: float | None = None  # worst block, worst input
    attention_blocks: dict[str, float] = field(default_factory=dict)  # block → worst input
    checks: dict[str, float] = field(default_factory=dict)  # check → mean over inputs

    def to_dict(self) -> dict:
        return asdict(self)


def attention_cosines(reference: dict[str, torch.Tensor], variant: dict[str, torch.Tensor]) -> dict[str, float]:
    """Block → the lowest cosine similarity over the inputs (keys '<block>/<input>' in both)."""
    missing = sorted(set(reference) - set(variant))
    if missing:
        raise ValueError(f"the variant has no attention output for {missing[:3]} (a block the reference has)")
    worst: dict[str, float] = {}
    for key, expected in reference.items():
        block = key.rsplit("/", 1)[0]
        a, b = expected.double().flatten(), variant[key].double().flatten()
        cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        worst[block] = min(worst.get(block, 1.0), cosine)
    return worst


def check_means(config: PipelineConfig, control: dict, reference_outputs: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
    """Each gate check's mean on `outputs` with the reference's renders as the truth."""
    from drape.gates.run import check_scores

    judged = {**control, "target": reference_outputs}
    scores = check_scores(config, judged, outputs, reference_outputs)
    return {name: float(np.mean(values)) for name, values in scores.items()}


def measure_quality(config: PipelineConfig, control: dict, reference_dir: Path, variant_dir: Path) -> Quality:
    """The quality figures of the run in `variant_dir` against the reference run in `reference_dir`."""
    reference_outputs = np.load(reference_dir / "outputs.npy", allow_pickle=False)
    outputs = np.load(variant_dir / "outputs.npy", allow_pickle=False)
    quality = Quality(checks=check_means(config, control, reference_outputs, outputs))
    attention = variant_dir / "attention.safetensors"
    if attention.is_file() and (reference_dir / "attention.safetensors").is_file():
        blocks = attention_cosines(load_file(str(reference_dir / "attention.safetensors")), load_file(str(attention)))
        quality.attention_blocks = blocks
        quality.attention_min = min(blocks.values()) if blocks else None
    return quality


@dataclass(frozen=True)
class Thresholds:
    attention_min: float | None
    checks: dict[str, float]

    def to_dict(self) -> dict:
        return asdict(self)


def thresholds(floor: Quality, settings: QualityConfig) -> Thresholds:
    """What a variant must reach: the floor's figures less the configured tolerances."""
    attention = None if floor.attention_min is None else floor.attention_min - settings.attention_cosine_tolerance
    return Thresholds(attention, {name: value - settings.check_tolerance for name, value in floor.checks.items()})


def verdict(quality: Quality, limits: Thresholds) -> list[str]:
    """Why `quality` is not within the floor (empty: approved)."""
    reasons = []
    if limits.attention_min is not None and (quality.attention_min is None or quality.attention_min < limits.attention_min):
        shown = "none" if quality.attention_min is None else f"{quality.attention_min:.6f}"
        reasons.append(f"attention cosine {shown} < {limits.attention_min:.6f}")
    for name, limit in limits.checks.items():
        value = quality.checks.get(name)
        if value is None or value < limit:
            reasons.append(f"{name} {'none' if value is None else f'{value:.4f}'} < {limit:.4f}")
    return reasons

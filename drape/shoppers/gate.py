"""The personalization gate: an adapter is kept only when it holds the shopper better and forgets nothing.

- identity: on the shopper's held-out photos (never trained on), the adapter's mean identity
  similarity must beat the base model's by `shoppers.gate.min_identity_gain`. The score is the
  likeness measure (`drape.shoppers.likeness`: face residual after registration and skin tone in
  CIELAB), which tells one person from another where the pixel embedding mostly sees that a face
  was rendered at all: on configs/demo.yaml an adapter trained on another person raised the
  embedding's similarity to the shopper by 0.03-0.07 and lowered the likeness by 0.15-0.35. It is
  a measure of improvement, base against adapter on the same photos and seeds, not a threshold:
  as a gate check (`gates.identity.method: aligned`, removed) harmless tone curves, sharpening and
  a shift + re-encoding failed it; a change of delivery would reach base and adapter alike.
- garments: on the first `garment_samples` of the control set (other people, other garments),
  texture and coherence (vs the targets) may each drop at most `max_garment_drop` below the base.

Renders use the gates' sampler and seed (`gates.sample_seed`), the same for base and adapter.
"""

from __future__ import annotations

import numpy as np

from drape.config import PipelineConfig
from drape.gates.run import check_scores, sample_control, to_uint8
from drape.inference.source import subset
from drape.shoppers.likeness.face import likeness_scores
from drape.training.recipes.model import TryOnModel

GARMENT_CHECKS = ("texture", "coherence")


def render(config: PipelineConfig, model: TryOnModel, arrays: dict, seed: int | None = None) -> np.ndarray:
    """`model`'s uint8 outputs for `arrays`, rendered as the gate renders (`gates.batch_size` at a time)."""
    return np.concatenate([to_uint8(images) for _, images in sample_control(config, model, arrays, seed=seed)])


def identity_means(config: PipelineConfig, models: dict[str, TryOnModel], holdout: dict) -> dict[str, float]:
    """Each model's mean likeness (`likeness_scores`) over the held-out photos, each rendered with `gate.seeds` seeds."""
    faces = [m["face_box"] for m in holdout["meta"]]
    seeds = [config.gates.sample_seed + k for k in range(config.shoppers.gate.seeds)]
    return {
        name: float(np.mean([likeness_scores(render(config, model, holdout, seed), holdout["target"], faces) for seed in seeds]))
        for name, model in models.items()
    }


def garment_means(config: PipelineConfig, models: dict[str, TryOnModel], control: dict) -> dict[str, dict[str, float]]:
    picked = subset(control, control["keys"][: config.shoppers.gate.garment_samples])
    means = {}
    for name, model in models.items():
        values = check_scores(config, picked, render(config, model, picked), picked["target"], checks=GARMENT_CHECKS)
        means[name] = {check: float(values[check].mean()) for check in GARMENT_CHECKS}
    return means


def judge(config: PipelineConfig, base: TryOnModel, adapted: TryOnModel, holdout: dict, control: dict) -> dict:
    """The gate's values, verdict and reasons (a failed check's reason names its numbers)."""
    gate = config.shoppers.gate
    models = {"base": base, "adapter": adapted}
    identity, garments = identity_means(config, models, holdout), garment_means(config, models, control)
    gain = identity["adapter"] - identity["base"]
    reasons = []
    if gain < gate.min_identity_gain:
        reasons.append(
            f"identity on {len(holdout['keys'])} held-out photos: adapter {identity['adapter']:.4f} vs base "
            f"{identity['base']:.4f}, gain {gain:+.4f} < the {gate.min_identity_gain} required"
        )
    drops = {check: garments["base"][check] - garments["adapter"][check] for check in GARMENT_CHECKS}
    for check, drop in drops.items():
        if drop > gate.max_garment_drop:
            reasons.append(
                f"{check} on the control set's garments: adapter {garments['adapter'][check]:.4f} vs base "
                f"{garments['base'][check]:.4f}, a drop of {drop:.4f} > the {gate.max_garment_drop} allowed"
            )
    return {
        "passed": not reasons,
        "reasons": reasons,
        "identity": {**identity, "gain": gain, "min_gain": gate.min_identity_gain, "holdout_photos": len(holdout["keys"])},
        "garments": {
            check: {"base": garments["base"][check], "adapter": garments["adapter"][check], "drop": drops[check]}
            for check in GARMENT_CHECKS
        },
        "max_garment_drop": gate.max_garment_drop,
        "garment_samples": min(gate.garment_samples, len(control["keys"])),
    }

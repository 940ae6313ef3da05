"""Config of the validation gates: the checks' settings and thresholds, per stage or for all."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from drape.config.base import StageName, StrictModel

# a check's score lies in [0, 1] where 1 is perfect: a threshold outside (0, 1] passes anything
# (or nothing) and is refused; one value for every stage, or one per stage
Bounded = Annotated[float, Field(gt=0, le=1)]
Threshold = Bounded | dict[StageName, Bounded] | None


def _threshold_for(threshold: Threshold, stage: str) -> float | None:
    return threshold.get(stage) if isinstance(threshold, dict) else threshold


ALIGNED = "drape.gates.aligned: the difference left once light and registration are undone"


class IdentityGateConfig(StrictModel):
    method: Literal["embedding", "aligned"] = Field(
        default="embedding", description=f"embedding: cosine of face embeddings (`embedder`); aligned: {ALIGNED}"
    )
    embedder: Literal["pixel", "onnx"] = "pixel"
    onnx_model_path: str | None = None
    min_similarity: Threshold = None
    max_shift_pixels: float = Field(default=2.5, ge=0, description="aligned: the registration searched, in pixels")
    max_drop: float | None = Field(default=0.05, ge=0, le=0.5, description="change threshold vs the stage baseline's mean")

    @model_validator(mode="after")
    def _onnx_needs_path(self) -> IdentityGateConfig:
        if self.embedder == "onnx" and not self.onnx_model_path:
            raise ValueError("embedder 'onnx' needs onnx_model_path")
        return self


class TextureGateConfig(StrictModel):
    method: Literal["correlation", "aligned"] = Field(
        default="correlation",
        description=f"correlation: normalised cross-correlation with the mirror and sharpness terms; aligned: {ALIGNED}",
    )
    min_fidelity: Threshold = None
    max_shift_pixels: int = Field(default=2, ge=0)
    mirror_penalty: float = Field(
        default=2.0, ge=0, description=("taken off per unit of negative handedness: the mark read mirrored (0: off)")
    )
    sharpness_floor: float = Field(
        default=0.2, ge=0, le=1, description=("share of the mark's gradient energy below which the score scales down (0: off)")
    )
    max_drop: float | None = Field(default=0.05, ge=0, le=0.5, description="change threshold vs the stage baseline's mean")


class CoherenceGateConfig(StrictModel):
    method: Literal["structure", "aligned"] = Field(
        default="structure", description=f"structure: edge maps, pooled layout, worst block; aligned: {ALIGNED}"
    )
    max_shift_pixels: float = Field(default=2.5, ge=0, description="aligned: the registration searched, in pixels")
    min_score: Threshold = Field(default=None, description="vs the ground truth (a stage's first run, no baseline)")
    min_score_vs_baseline: Threshold = Field(
        default=None,
        description=(
            "vs the baseline's outputs: a successor of a good model scores higher against them than any model against "
            "the ground truth, so this threshold can be stricter; default min_score"
        ),
    )


class GatesConfig(StrictModel):
    identity: IdentityGateConfig = IdentityGateConfig()
    texture: TextureGateConfig = TextureGateConfig()
    coherence: CoherenceGateConfig = CoherenceGateConfig()
    sample_seed: int = 1234
    grid_samples: int = Field(default=8, gt=0)

    def thresholds(self, stage: str, *, vs_baseline: bool = False) -> dict[str, float | None]:
        """Each check's threshold at `stage` (None: not configured, which blocks promotion); coherence
        measured against a baseline's outputs (`vs_baseline`) uses `min_score_vs_baseline` when set."""
        coherence = _threshold_for(self.coherence.min_score, stage)
        if vs_baseline and self.coherence.min_score_vs_baseline is not None:
            coherence = _threshold_for(self.coherence.min_score_vs_baseline, stage)
        return {
            "identity": _threshold_for(self.identity.min_similarity, stage),
            "texture": _threshold_for(self.texture.min_fidelity, stage),
            "coherence": coherence,
        }

"""Config of the validation gates: the checks' settings and thresholds, per stage or for all."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from drape.config.base import StageName, StrictModel, mounted

# a check's score lies in [0, 1] where 1 is perfect: a threshold outside (0, 1] passes anything
# (or nothing) and is refused; one value for every stage, or one per stage
# (or "nuisance": the check's nuisance floor, measured at each gate: what accepted variations of the
# ground truth score, drape.gates.verdict.floor; or "off": measured and reported, never judged, for a check
# that cannot separate anything where it runs, such as a 6×4 px logo at 32 px; unset still blocks)
Bounded = Annotated[float, Field(gt=0, le=1)] | Literal["nuisance", "off"]
Threshold = Bounded | dict[StageName, Bounded] | None


# a change threshold: a fixed fall of the mean, or "nuisance": the largest fall the baseline's own outputs
# show under the nuisance suite (drape.gates.verdict.floor), measured at each gate
MaxDrop = Annotated[float, Field(ge=0, le=0.5)] | Literal["nuisance"] | None
MAX_DROP = "change threshold vs the stage baseline's mean: a number, or 'nuisance' (measured at the gate); unset: none"


def _threshold_for(threshold: Threshold, stage: str) -> float | str | None:
    return threshold.get(stage) if isinstance(threshold, dict) else threshold


# Each check has one method. The opt-in 'aligned' methods (the difference left once light and
# registration are undone) were removed: they failed harmless tone curves, sharpening and a shift +
# re-encoding at every resolution measured (docs/gates.md, "Telling a regression from noise"). A
# config that still names one is refused at load, naming the field and the one method allowed.
REMOVED = "; 'aligned' was removed (docs/gates.md: the real recognizers with max_warp replace it)"


class IdentityGateConfig(StrictModel):
    method: Literal["embedding"] = Field(
        default="embedding", description=f"embedding: the face's similarity through `embedder`, the one method{REMOVED}"
    )
    embedder: Literal["pixel", "onnx", "dlib", "arcface"] = Field(
        default="pixel",
        description=(
            "pixel: the synthetic demo's weight-free pixel embedder; onnx: an ONNX embedder on the fixed face box; "
            "dlib: dlib's detector, landmarks and ResNet descriptor (drape.gates.recognizers); arcface: an ArcFace-family "
            "ONNX model (onnx_model_path) on crops aligned to its 112×112 template"
        ),
    )
    onnx_model_path: str | None = Field(
        default=None, description="onnx and arcface: the embedder's .onnx file (a local path)", json_schema_extra=mounted("file")
    )
    model_dir: str | None = Field(
        default=None,
        description=(
            "dlib (and arcface with detector dlib): the folder of its .dat weights (default: face-recognition-models'); "
            "arcface with detector mtcnn: the folder of pnet.pt, rnet.pt, onet.pt (default: facenet-pytorch's data)"
        ),
        json_schema_extra=mounted("model"),
    )
    detector: Literal["dlib", "mtcnn"] = Field(
        default="dlib",
        description="arcface: the five landmarks from dlib's HOG detection and 68 landmarks, or from MTCNN (drape's own)",
    )
    same_person: float | None = Field(
        default=None,
        description=(
            "dlib and arcface: the per-sample same-person rule in the recognizer's own terms: dlib's largest descriptor "
            "distance (default 0.6), ArcFace's smallest cosine (default 0.28, about 0.1% false accepts)"
        ),
    )
    max_drift: float | None = Field(
        default=None,
        gt=0,
        lt=2,
        description=(
            "dlib: per sample, the largest distance of the descriptors of the source's and the output's faces "
            "blurred by 2 px, for the same person (a face drifted: eyes set closer, a squashed jaw); None: not judged. "
            "It does not separate per sample (a median filter moves it as far as a 10% squash of the lower face): "
            "prefer max_warp"
        ),
    )
    max_warp: float | None = Field(
        default=None,
        gt=0,
        le=0.5,
        description=(
            "dlib and arcface: per sample, the largest local change of the face's geometry for the same person: how far "
            "a part of the face moved against the rest once one shift, scale and turn is undone, as a share of the face "
            "box's width (drape.gates.recognizers.warp: a squashed jaw, eyes moved); None: not judged. Its value depends "
            "on the face's size in pixels: docs/recognizers.md has the measured margins at 128 and 256 px"
        ),
    )
    max_mismatch_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="dlib and arcface: the share of samples whose output may read as another person, drifted or show no face",
    )
    min_similarity: Threshold = Field(
        default=None,
        description="the threshold on the mean identity similarity: one value, one per stage, or 'nuisance' (the floor "
        "measured at the gate); unset: not configured, which blocks promotion",
    )
    max_drop: MaxDrop = Field(default=0.05, description=MAX_DROP)

    @model_validator(mode="after")
    def _onnx_needs_path(self) -> IdentityGateConfig:
        if self.embedder in ("onnx", "arcface") and not self.onnx_model_path:
            raise ValueError(f"embedder '{self.embedder}' needs onnx_model_path")
        if self.same_person is not None and self.embedder not in ("dlib", "arcface"):
            raise ValueError(f"same_person is a recognizer's rule (embedder dlib or arcface), not {self.embedder!r}'s")
        if self.max_drift is not None and self.embedder != "dlib":
            raise ValueError(f"max_drift is dlib's drift rule (embedder dlib), not {self.embedder!r}'s")
        if self.max_warp is not None and self.embedder not in ("dlib", "arcface"):
            raise ValueError(f"max_warp is a recognizer's drift rule (embedder dlib or arcface), not {self.embedder!r}'s")
        if self.max_warp is not None and self.max_drift is not None:
            raise ValueError(
                "max_warp and max_drift are two drift rules: set one (max_warp separates per sample; max_drift does not)"
            )
        if self.same_person is not None and not (
            0 < self.same_person < 2 if self.embedder == "dlib" else -1 < self.same_person < 1
        ):
            raise ValueError(
                f"same_person {self.same_person}: expected a dlib distance in (0, 2) or an ArcFace cosine in (-1, 1)"
            )
        return self

    @property
    def is_recognizer(self) -> bool:
        """A face recognizer (detection, landmarks, alignment): dlib or arcface."""
        return self.embedder in ("dlib", "arcface")


class TextureGateConfig(StrictModel):
    method: Literal["correlation"] = Field(
        default="correlation",
        description=f"correlation: normalised cross-correlation with the mirror and sharpness terms, the one method{REMOVED}",
    )
    min_fidelity: Threshold = Field(
        default=None,
        description="the threshold on the mean logo and print fidelity: one value, one per stage, or 'nuisance'; "
        "unset: not configured, which blocks promotion",
    )
    max_shift_pixels: int = Field(default=2, ge=0, description="the mark's registration searched, in pixels")
    mirror_penalty: float = Field(
        default=2.0, ge=0, description=("taken off per unit of negative handedness: the mark read mirrored (0: off)")
    )
    sharpness_floor: float = Field(
        default=0.2, ge=0, le=1, description=("share of the mark's gradient energy below which the score scales down (0: off)")
    )
    max_drop: MaxDrop = Field(default=0.05, description=MAX_DROP)
    ocr: Literal["off", "rapidocr", "tesseract"] = Field(
        default="off",
        description=(
            "rapidocr: read the logo box of the source and of the output (PP-OCR, drape.gates.checks.ocr) beside the glyph "
            "check; each sample's text must read as the source's (min_text_similarity); tesseract: the same through "
            "Debian's tesseract-ocr command line"
        ),
    )
    min_text_similarity: float = Field(
        default=1.0, gt=0, le=1, description="ocr: per sample, 1 less the normalized edit distance of the two readings"
    )
    max_misread_share: float = Field(default=0.0, ge=0, le=1, description="ocr: the share of text samples that may misread")
    min_text_lower: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="ocr: the bootstrap lower bound of the mean text similarity must be at least this (unset: not checked)",
    )


class CoherenceGateConfig(StrictModel):
    method: Literal["structure"] = Field(
        default="structure", description=f"structure: edge maps, pooled layout, worst block, the one method{REMOVED}"
    )
    min_score: Threshold = Field(default=None, description="vs the ground truth (a stage's first run, no baseline)")
    min_score_vs_baseline: Threshold = Field(
        default=None,
        description=(
            "vs the baseline's outputs: a successor of a good model scores higher against them than any model against "
            "the ground truth, so this threshold can be stricter; default min_score"
        ),
    )
    max_drop: MaxDrop = Field(default=None, description=MAX_DROP + " (compared vs the ground truth)")


class GatesConfig(StrictModel):
    identity: IdentityGateConfig = Field(default=IdentityGateConfig(), description="the identity check: the face must not drift")
    texture: TextureGateConfig = Field(
        default=TextureGateConfig(), description="the texture check: logos and print must not melt"
    )
    coherence: CoherenceGateConfig = Field(
        default=CoherenceGateConfig(), description="the coherence check: cloth geometry and layout"
    )
    sample_seed: int = Field(default=1234, description="the seed of the gate's sampling noise: outputs repeat exactly")
    batch_size: int = Field(
        default=16,
        ge=1,
        le=1024,
        description=(
            "control samples rendered per sampling pass: the gate's device memory is this many samples' whatever "
            "the control set's size; the outputs do not depend on it (each sample draws its own noise)"
        ),
    )
    grid_samples: int = Field(default=8, gt=0, description="control samples shown in the gate report's grid image")
    nuisance_floor: bool = Field(
        default=True,
        description=(
            "score the nuisance suite on the references at each gate: each check's floor (the report gives the margin "
            "over it; a threshold 'nuisance' is the floor) and, with max_drop 'nuisance', the change tolerances"
        ),
    )

    nuisance_suite: Literal["standard", "wide"] = Field(
        default="standard",
        description=(
            "the harmless suite the floors and tolerances are measured on: standard (drape.gates.suites.nuisance) or wide "
            "(and tone curves, sharpening, denoising, resampling, compound registrations: drape.gates.suites.harmless)"
        ),
    )
    floor_margin: dict[Literal["identity", "texture", "coherence"], Annotated[float, Field(ge=0, le=0.5)]] = Field(
        default_factory=dict,
        description=(
            "per check, how far below its measured nuisance floor a threshold 'nuisance' sits: room for a harmless "
            "kind the suite never produced, less than the gap to the weakest regression (benchmarks/gate_validity.py --real)"
        ),
    )

    @model_validator(mode="after")
    def _measured_values_need_the_floor(self) -> GatesConfig:
        if self.nuisance_floor:
            return self
        for check, threshold in (
            ("identity.min_similarity", self.identity.min_similarity),
            ("texture.min_fidelity", self.texture.min_fidelity),
            ("coherence.min_score", self.coherence.min_score),
            ("coherence.min_score_vs_baseline", self.coherence.min_score_vs_baseline),
            ("identity.max_drop", self.identity.max_drop),
            ("texture.max_drop", self.texture.max_drop),
            ("coherence.max_drop", self.coherence.max_drop),
        ):
            values = threshold.values() if isinstance(threshold, dict) else [threshold]
            if "nuisance" in values:
                raise ValueError(f"{check} 'nuisance' is measured with the nuisance suite: set nuisance_floor: true")
        return self

    def thresholds(self, stage: str, *, vs_baseline: bool = False) -> dict[str, float | str | None]:
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

"""drape: the staged, gated, storage-aware training system around a virtual try-on model.

This module is the vocabulary every other part speaks: the stages in training order, run modes,
retention outcomes, artifact kinds and queue job kinds, each a `StrEnum` (members compare equal
to their strings, so configs, manifests and JSON keep plain strings), plus the stage-order
helpers and the one way drape spells a byte count.
"""

from __future__ import annotations

from enum import StrEnum

__version__ = "0.1.0"

REGISTERED_MODEL = "drape-tryon"


class _Name(StrEnum):
    def __repr__(self) -> str:  # messages quote the value, as they did when these were plain strings
        return repr(self.value)


class Stage(_Name):
    """Training stages, in dependency order: each starts from the previous stage's baseline."""

    IDENTITY = "identity"
    TEXTURE = "texture"
    GEOMETRY = "geometry"
    DENOISE = "denoise"


class Mode(_Name):
    """FULL trains each stage's `steps` from the previous stage's baseline; FINETUNE runs each stage's
    `finetune_steps` from its own baseline."""

    FULL = "full"
    FINETUNE = "finetune"


class Outcome(_Name):
    """What became of an archived artifact; retention lifetimes and S3 lifecycle rules key on it."""

    BASELINE = "baseline"
    SUPERSEDED_BASELINE = "superseded_baseline"
    PASSED = "passed"
    FAILED_CANDIDATE = "failed_candidate"
    ABORTED = "aborted"


class ArtifactKind(_Name):
    CHECKPOINT = "checkpoint"
    LATENT_SNAPSHOT = "latent_snapshot"
    VALIDATION_OUTPUT = "validation_output"
    SYNTHETIC_IMAGERY = "synthetic_imagery"
    GATE_REPORT = "gate_report"
    ADAPTER = "adapter"  # a LoRA fine-tune's adapter, archived apart from the merged checkpoint


class JobKind(_Name):
    """Kinds of GPU queue job; memory profiles and priorities are kept per kind."""

    STAGE_TRAINING = "stage-training"
    FINETUNE = "finetune"
    GATE_EVAL = "gate-eval"
    INFERENCE_BENCHMARK = "inference-benchmark"
    PERSONALIZATION = "personalization"


STAGES: tuple[Stage, ...] = tuple(Stage)
MODES: tuple[Mode, ...] = tuple(Mode)
OUTCOMES: tuple[Outcome, ...] = tuple(Outcome)
ARTIFACT_KINDS: tuple[ArtifactKind, ...] = tuple(ArtifactKind)
JOB_KINDS: tuple[JobKind, ...] = tuple(JobKind)


def parse_stage(value: str, *, what: str = "stage") -> Stage:
    """`value` as a Stage; a ValueError naming `what` and the stages otherwise."""
    try:
        return Stage(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {'|'.join(STAGES)}, got {value!r}") from None


def parse_mode(value: str, *, what: str = "mode") -> Mode:
    """`value` as a Mode; a ValueError naming `what` and the modes otherwise."""
    try:
        return Mode(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {'|'.join(MODES)}, got {value!r}") from None


def previous_stage(stage: str) -> Stage | None:
    """The stage before `stage` (None for the first)."""
    index = STAGES.index(parse_stage(stage))
    return STAGES[index - 1] if index else None


def next_stage(stage: str) -> Stage | None:
    """The stage after `stage` (None for the last)."""
    index = STAGES.index(parse_stage(stage))
    return STAGES[index + 1] if index + 1 < len(STAGES) else None


def stages_from(stage: str) -> tuple[Stage, ...]:
    """`stage` and every stage after it: what a run that stops at `stage` never finishes."""
    return STAGES[STAGES.index(parse_stage(stage)) :]


def stage_index(stage: str) -> int:
    return STAGES.index(parse_stage(stage))


def job_kind_for(mode: str) -> JobKind:
    """The queue job kind that trains a stage in `mode`."""
    return JobKind.STAGE_TRAINING if parse_mode(mode) is Mode.FULL else JobKind.FINETUNE


def format_bytes(count: float) -> str:
    """A byte count for people, in binary units: ``512 B``, ``1.5 KiB``, ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


from drape.secrets import install_log_redaction  # noqa: E402 - every drape process redacts its log records

install_log_redaction()

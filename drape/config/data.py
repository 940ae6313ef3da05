"""Config of the dataset and the node-local shard cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from drape import STAGES
from drape.config.base import StageName, StrictModel, mounted


def height_width(resolution: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """(height, width) of a resolution: one side (square), or (height, width) (a list once through JSON)."""
    if isinstance(resolution, int):
        return resolution, resolution
    height, width = (int(side) for side in resolution)
    return height, width


def json_resolution(resolution: int | tuple[int, int] | list[int]) -> int | list[int]:
    """A resolution as manifests and sample metadata hold it: one side, or [height, width]."""
    return resolution if isinstance(resolution, int) else list(resolution)


class CacheConfig(StrictModel):
    """The node-local shard cache that pre-staging fills (an NVMe path in production)."""

    dir: str | None = Field(default=None, description="default <root>/live/shards", json_schema_extra=mounted("live"))
    budget_bytes: int = Field(default=64 * 2**30, ge=2**20, description="most bytes the cache may hold")
    concurrency: int = Field(default=4, gt=0, description="shard downloads in flight while pre-staging")
    read_ahead: int = Field(default=2, ge=0, description="shards fetched ahead of the one being read")


class LoaderConfig(StrictModel):
    """How a rank decodes its batches: worker processes read samples from the local shards ahead
    of the step. At most `prefetch_batches` batches are decoding or decoded beyond the one the
    step trains on, so memory is O(batch × prefetch), whatever the stage's size."""

    workers: int = Field(default=2, ge=0, le=64, description="decoding worker processes per rank; 0: a thread in the trainer")
    prefetch_batches: int = Field(default=4, ge=1, le=256, description="batches decoded ahead of the step, over all workers")
    timeout_seconds: float = Field(
        default=300.0, gt=0, description="longest wait for one batch before the trainer fails (a hung read, a lost worker)"
    )
    handoff_dir: str | None = Field(
        default=None,
        description="where workers hand decoded batches over (shared memory); default /dev/shm",
        json_schema_extra=mounted("live"),
    )
    start_method: Literal["fork", "forkserver", "spawn"] = Field(
        default="fork", description="how workers start (multiprocessing); fork is fastest and safe: workers never touch CUDA"
    )


class SyntheticConfig(StrictModel):
    """What only the synthetic generator (drape.data.synth, `data.source: synthetic`, `drape data synth`)
    reads: how many people and garments it draws from and how many samples it writes per stage. A
    dataset in the store (`drape data shard` of VITON-HD or DressCode) has its own counts, in its manifest."""

    num_identities: int = Field(default=24, gt=0, description="distinct synthetic people the samples are drawn from")
    num_garments: int = Field(default=48, gt=0, description="distinct synthetic garments the samples are drawn from")
    samples_per_stage: dict[StageName, int] = Field(
        default_factory=lambda: {stage.value: 96 for stage in STAGES},
        description="samples generated for each stage's split (every stage needs a positive count)",
    )
    faces: Literal["drawn", "portraits"] = Field(
        default="drawn",
        description=(
            "drawn: cartoon faces (no face detector reads most of them; the pixel embedder's gate); portraits: real "
            "faces from portraits installed packages ship (drape.data.portraits) composed into every head, so dlib or "
            "an ArcFace-family model finds a face in each control target (a gate with a recognizer needs them)"
        ),
    )

    marks: Literal["letters", "prices"] = Field(
        default="letters",
        description=(
            "letters: one or two capitals on each garment's logo plate; prices: a price tag ('$49', drape.data.synth."
            "PRICE_TEXTS) on a wider plate, which PP-OCR reads at 128 px (gates.texture.ocr: a changed price is a misread)"
        ),
    )

    @model_validator(mode="after")
    def _every_stage_has_samples(self) -> SyntheticConfig:
        missing = [stage for stage in STAGES if self.samples_per_stage.get(stage, 0) <= 0]
        if missing:
            raise ValueError(f"samples_per_stage needs a positive count for {missing}")
        return self


# the fields that moved under data.synthetic (issue 63): a config naming them flat is told where they went
MOVED_TO_SYNTHETIC = ("num_identities", "num_garments", "samples_per_stage")


class DataConfig(StrictModel):
    """The dataset a run trains on (a name and version in the object store), its resolution, how it
    is cut into shards, and the node-local cache and loader that read it."""

    name: str = Field(default="synth-tryon", description="the dataset's name: its object-store prefix datasets/<name>/<version>")
    version: str = Field(default="v1", description="the dataset's version under its name (a latent version: see latents_of)")
    source: Literal["store", "synthetic"] = Field(
        default="store",
        description=(
            "store: the dataset must already be in the object store (`drape data shard` of a VITON-HD or DressCode "
            "tree), a missing one is an error, never generated in its place (a latent version, latents_of, is still "
            "encoded from its stored pixel version); synthetic: drape.data.synth generates and publishes it (seeded) "
            "the first time it is missing"
        ),
    )
    resolution: int | tuple[int, int] = Field(
        default=64,
        description="pixels per side (square), or [height, width]: [1024, 768] for VITON-HD and DressCode",
    )
    latents_of: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description=(
            "this version holds the VAE latents of version <latents_of> (pixels), encoded once by model.vae "
            "(`drape data encode`); training reads them as they are, the gates read its control split in pixels"
        ),
    )
    control_samples: int = Field(
        default=16,
        gt=0,
        description="samples of the fixed control set every gate judges (held apart from training; `drape data shard`'s default)",
    )
    shard_max_samples: int = Field(default=64, gt=0, description="a shard closes at this many samples (or shard_max_bytes)")
    shard_max_bytes: int = Field(default=512 * 2**20, ge=2**20, description="a shard closes at this size or max samples")
    synthetic: SyntheticConfig = Field(
        default_factory=lambda: SyntheticConfig(), description="what only the synthetic generator reads (source: synthetic)"
    )
    cache: CacheConfig = Field(default_factory=lambda: CacheConfig(), description="the node-local shard cache pre-staging fills")
    loader: LoaderConfig = Field(default_factory=lambda: LoaderConfig(), description="how each rank decodes its batches")

    @model_validator(mode="before")
    @classmethod
    def _synthetic_fields_moved(cls, data: object) -> object:
        moved = [name for name in MOVED_TO_SYNTHETIC if isinstance(data, dict) and name in data]
        if moved:
            where = ", ".join(f"data.{name} moved to data.synthetic.{name}" for name in moved)
            raise ValueError(f"{where} (only the synthetic generator reads it; a stored dataset's counts are in its manifest)")
        return data

    @field_validator("resolution")
    @classmethod
    def _sides_in_range(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        sides = (value,) if isinstance(value, int) else value
        for side in sides:
            if not 32 <= side <= 2048:
                raise ValueError(f"each side must be 32-2048 pixels, got {side}")
        if not isinstance(value, int) and value[0] == value[1]:
            return value[0]  # square: one number, as in every config and model config before
        return value

    @property
    def height(self) -> int:
        return height_width(self.resolution)[0]

    @property
    def width(self) -> int:
        return height_width(self.resolution)[1]

    @property
    def resolution_label(self) -> str:
        """``64 px`` or ``1024×768 px``, for people."""
        return f"{self.height} px" if self.height == self.width else f"{self.height}×{self.width} px"

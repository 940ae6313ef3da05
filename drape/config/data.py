"""Config of the dataset and the node-local shard cache."""

from __future__ import annotations

from pydantic import Field, model_validator

from drape import STAGES
from drape.config.base import StageName, StrictModel


class CacheConfig(StrictModel):
    """The node-local shard cache that pre-staging fills (an NVMe path in production)."""

    dir: str | None = Field(default=None, description="default <root>/live/shards")
    budget_bytes: int = Field(default=64 * 2**30, ge=2**20, description="most bytes the cache may hold")
    concurrency: int = Field(default=4, gt=0, description="shard downloads in flight while pre-staging")
    read_ahead: int = Field(default=2, ge=0, description="shards fetched ahead of the one being read")


class DataConfig(StrictModel):
    name: str = "synth-tryon"
    version: str = "v1"
    resolution: int = Field(default=64, ge=32, le=2048)
    num_identities: int = Field(default=24, gt=0)
    num_garments: int = Field(default=48, gt=0)
    samples_per_stage: dict[StageName, int] = Field(default_factory=lambda: {stage.value: 96 for stage in STAGES})
    control_samples: int = Field(default=16, gt=0)
    shard_max_samples: int = Field(default=64, gt=0)
    shard_max_bytes: int = Field(default=512 * 2**20, ge=2**20, description="a shard closes at this size or max samples")
    cache: CacheConfig = Field(default_factory=lambda: CacheConfig())

    @model_validator(mode="after")
    def _every_stage_has_samples(self) -> DataConfig:
        missing = [stage for stage in STAGES if self.samples_per_stage.get(stage, 0) <= 0]
        if missing:
            raise ValueError(f"samples_per_stage needs a positive count for {missing}")
        return self

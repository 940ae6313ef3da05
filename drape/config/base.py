"""What every config model shares: unknown keys are errors, and a loaded config is frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, field and reason."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

"""What every config model shares: unknown keys are errors, and a loaded config is frozen."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from drape import Outcome, parse_stage


def _outcome(value: str) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        raise ValueError(f"outcome must be one of {'|'.join(Outcome)}, got {value!r}") from None


# keys that must name a stage or an outcome: stored as the enum member, typed (and indexed) as str
StageName = Annotated[str, AfterValidator(parse_stage)]
OutcomeName = Annotated[str, AfterValidator(_outcome)]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, field and reason."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

"""What every config model shares: unknown keys are errors, a loaded config is frozen, and every
value is within reason.

Within reason, for every model at once (so a field added later is covered too): no infinity or
NaN anywhere (``allow_inf_nan``); no number orders of magnitude beyond any machine (sizes,
counts, durations and prices, by the field's name: `CEILINGS`); no control character in any
string (names become paths, object keys and metric labels, and ``"run1\\n"`` is not ``"run1"``).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic.json_schema import JsonDict

from drape import Outcome, parse_stage


def _outcome(value: str) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        raise ValueError(f"outcome must be one of {'|'.join(Outcome)}, got {value!r}") from None


# keys that must name a stage or an outcome: stored as the enum member, typed (and indexed) as str
StageName = Annotated[str, AfterValidator(parse_stage)]
OutcomeName = Annotated[str, AfterValidator(_outcome)]

# the largest value a field may hold, by how its name ends (first match), then for any number:
# each far beyond any machine, fleet or plan, yet far below where arithmetic on it overflows
CEILINGS: tuple[tuple[str, float, str], ...] = (
    ("_bytes", 2**50, "1 PiB"),
    ("_gib", 2**20, "1 PiB"),
    ("_gib_per_gpu", 2**20, "1 PiB"),
    ("_seconds", 366 * 86400, "a year"),
    ("_days", 36525, "a century"),
    ("_months", 1200, "a century"),
    ("_per_1000", 1e4, "$10,000"),
    ("_per_gb", 1e4, "$10,000"),
    ("on_demand", 1e4, "$10,000 an hour"),
    ("reserved", 1e4, "$10,000 an hour"),
    ("burst", 1e4, "$10,000 an hour"),
    # a model's shape: beyond the largest published diffusion models by orders of magnitude, and
    # refused before a layer is built (a config, or a checkpoint's config.json: `check_model_shape`)
    ("num_layers", 4096, "4096 layers"),
    ("layers_per_block", 256, "256 layers per block"),
    ("heads", 4096, "4096 heads"),
    ("head_dim", 65536, "65536"),
    ("channels", 2**17, "131072 channels"),
    ("patch_size", 4096, "4096"),
    ("groups", 2**17, "131072"),
    ("_dim", 2**17, "131072"),
    ("_size", 2**17, "131072"),
    ("", 1e12, "10^12"),
)


def check_model_shape(config: object, where: str) -> None:
    """ValueError naming `where` and the key when a model config (a checkpoint's config.json) holds
    a non-finite number, a control character or a size beyond `CEILINGS`."""
    if not isinstance(config, dict):
        raise ValueError(f"{where}: expected a JSON object")
    try:
        for key, value in config.items():
            _check_value(str(key), value)
            sizes = value if isinstance(value, list) else [value]
            if any(isinstance(size, int) and not isinstance(size, bool) and size < 0 for size in sizes):
                raise ValueError(f"{key}: a model's sizes and counts are never negative, got {value}")
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def ceiling(field: str) -> tuple[float, str]:
    """The largest magnitude `field` may hold, and how to say it."""
    return next((limit, said) for suffix, limit, said in CEILINGS if field.endswith(suffix))


def _check_value(field: str, value: object) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        limit, said = ceiling(field)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{field}: expected a finite number, got {value}")
        if abs(value) > limit:
            raise ValueError(f"{field}: {value:g} is beyond any machine or plan (at most {said})")
    elif isinstance(value, str) and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError(f"{field}: control characters (newline, tab, escape) are refused in config values")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_value(f"{field}.{key}", key)
            _check_value(field if isinstance(item, (int, float)) else f"{field}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_value(field, item)


# How a job uses a config field that names something on local disk, declared on the field
# (`json_schema_extra=mounted(kind)`): drape/mounts.py derives every pod's mounts from these, and
# tests/unit/test_mounts.py fails for a field that could name a path and declares nothing.
MOUNT_KINDS = {
    "live": "a folder the job writes: mounted read-write at the same path",
    "model": "a folder of weights the job reads: mounted read-only at the same path",
    "file": "a file of weights the job reads: its folder mounted read-only",
    "store": "a URL whose local form (file://, sqlite:///, a bare path) the job writes: that folder, read-write",
    "checkpoint": "a checkpoint folder or a registry alias: a folder's parent, read-write (results are written beside it)",
    "none": "a local path no job's pod reads (the reason is given)",
}


def mounted(kind: str, why: str = "") -> JsonDict:
    """The `json_schema_extra` of a field naming a local path: how a job uses it (`MOUNT_KINDS`)."""
    if kind not in MOUNT_KINDS or (kind == "none") != bool(why):
        raise ValueError(f"mounted({kind!r}): expected one of {', '.join(MOUNT_KINDS)}, and a reason for 'none' only")
    return {"mount": kind, **({"mount_why": why} if why else {})}


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, field and reason."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _within_reason(self) -> StrictModel:
        for name in type(self).model_fields:
            _check_value(name, getattr(self, name))
        return self

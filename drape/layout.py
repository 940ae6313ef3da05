"""Every live path and every object key drape makes, in one place (nothing else joins them).

Live storage, ``<paths.root>/live``::

    runs/<run>/<stage>/checkpoints/step-NNNNNNN        the stage's safetensors checkpoints
    runs/<run>/<stage>/checkpoints/step-NNNNNNN.dcp    sharded intermediates (torchrun)
    runs/<run>/<stage>/adapters/step-NNNNNNN           a LoRA pass's adapter checkpoints (drape/training/checkpoints/lora.py)
    runs/<run>/<stage>/gate/                           outputs/, latents.safetensors, report.json, grid.png
    runs/<run>/<stage>/superseded-baseline/, baseline-download/   the replaced baseline; one fetched for the gate
    runs/<run>/<stage>/job-config.json                 a queue job's config; train-result.json its result
    runs/manual/<stage>/                               `python -m drape.train` without --out
    baselines/<stage>/                                 checkpoint/, outputs/, baseline.json (+ latents, report)
    bases/<sha256>/                                    a frozen base stage checkpoints name (drape/training/checkpoints/base.py)
    shards/<dataset>/<version>/<split>/                the shard cache (`data.cache.dir` moves it)
    restored/<run>/<stage>/, models/v<version>/        `drape storage restore`; a registry version for inference
    inference/<bench>/                                 `drape bench inference`: inputs, variants, report
    shoppers/<shopper>/, privacy/pending|audit/<name>.json   a shopper (`ShopperPaths`); `drape shopper forget`'s records

The object store::

    datasets/<name>/<version>/manifest.json            written last: its presence commits the dataset
    datasets/<name>/<version>/<split>/shard-NNNNN.tar
    runs/<run>/<stage>/<path under the live stage directory>      archived artifacts
    bases/<sha256>/base.safetensors, manifest.json     frozen bases, once each (drape/storage/bases.py)
    archive/manifests/<run>/<stage>-<time>-<id>.jsonl  append-only archive records, one object per call
    archive/manifests/sweep/<time>-<id>.jsonl          the retention sweep's records
    shoppers/<shopper>/<path under the live shopper directory>; privacy/audit/<request>.json

An artifact's kind follows from where it lives (`artifact_kind`): one rule for archiving, the storage report and baselines.

Names, keys and relative paths read from an object store, a manifest, the queue or a config are
untrusted: `safe_name`, `safe_key` and `contained` are the one check they pass before anything
is joined to a root (no absolute path, no ``..``, nothing that resolves outside the root, no symlink loop).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from drape import ArtifactKind

CHECKPOINT_PREFIX = "step-"
DCP_SUFFIX = ".dcp"
_CHECKPOINT_NAME = re.compile(r"^step-(\d+)(\.dcp)?$")
DATASET_MANIFEST = "manifest.json"
RUNS_PREFIX = "runs/"
ARCHIVE_MANIFESTS = "archive/manifests"
SWEEP_MANIFESTS = f"{ARCHIVE_MANIFESTS}/sweep"
BASE_MANIFESTS = f"{ARCHIVE_MANIFESTS}/bases"  # one object per frozen base: its archive records, written once
MANUAL_RUN = "manual"
ADAPTERS, BASES, SHOPPERS = "adapters", "bases", "shoppers"
AUDIT_PREFIX = "privacy/audit"

# what a stage directory holds besides its checkpoints, relative to it, in archive order
GATE_FILES = ("gate/outputs", "gate/latents.safetensors", "gate/report.json", "gate/grid.png")
SUPERSEDED_BASELINE = "superseded-baseline"


class UnsafePathError(ValueError):
    """A name, key or relative path that would leave its root; the message names it and where it came from."""


_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+=-]{0,199}$")


def safe_name(value: object, what: str) -> str:
    """`value` as one path segment (a run id, a stage, a dataset name or version): letters,
    digits and ``._@+=-``, not starting with a dot; UnsafePathError otherwise."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value):
        raise UnsafePathError(
            f"{what} {value!r} is not a safe name: expected 1-200 letters, digits or ._@+=- not starting with a dot"
        )
    return value


def safe_key(key: object, what: str, *, allow_empty: bool = False) -> str:
    """`key` as a relative '/'-separated key: no leading '/', no '.', '..' or empty segment, no
    backslash or control character; UnsafePathError naming it otherwise."""
    if not isinstance(key, str):
        raise UnsafePathError(f"{what} {key!r}: expected a string key")
    if key == "" and allow_empty:
        return key
    reason = None
    if key.startswith("/"):
        reason = "it is absolute"
    elif any(ch == "\\" or ord(ch) < 32 or ord(ch) == 127 for ch in key):
        reason = "it holds a backslash or a control character"
    elif any(part in ("", ".", "..") for part in key.rstrip("/").split("/")):
        reason = "it holds an empty, '.' or '..' segment"
    if reason:
        raise UnsafePathError(f"{what} {key!r} is refused: {reason}; expected a relative key inside its root")
    return key


def contained(root: str | Path, relative: object, what: str) -> Path:
    """``root/relative`` after `safe_key`, resolved (symlinks too) and checked to stay inside `root`."""
    key = safe_key(relative, what)
    try:  # a symlink loop raises RuntimeError before Python 3.13, OSError (ELOOP) after
        base, path = Path(root).resolve(), (Path(root).resolve() / key).resolve()
    except (RuntimeError, OSError) as error:
        raise UnsafePathError(f"{what} {key!r} under {root} cannot be resolved: a symlink loop ({error})") from None
    if not path.is_relative_to(base):
        raise UnsafePathError(f"{what} {key!r} resolves to {path}, outside {base}")
    return base / key


_SHOPPER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{2,63}$")


def safe_shopper_id(value: object) -> str:
    """An opaque pseudonym (never an email or a name: it names folders and object keys)."""
    if not isinstance(value, str) or not _SHOPPER_ID.fullmatch(value):
        why = "(not an email or a name: it becomes part of paths and object keys)"
        raise UnsafePathError(f"shopper id {value!r}: expected an opaque id of 3-64 letters, digits, '_' or '-' {why}")
    return value


# --- checkpoints -----------------------------------------------------------------------------
def checkpoint_name(step: int, *, sharded: bool = False) -> str:
    """``step-0000040`` (safetensors) or ``step-0000040.dcp`` (a sharded DCP checkpoint)."""
    return f"{CHECKPOINT_PREFIX}{step:07d}{DCP_SUFFIX if sharded else ''}"


def checkpoint_step(path: str | Path) -> int:
    """The step of a checkpoint directory named by `checkpoint_name`; ValueError for any other name."""
    match = _CHECKPOINT_NAME.fullmatch(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: not a checkpoint directory name (expected step-NNNNNNN or step-NNNNNNN.dcp)")
    return int(match.group(1))


def is_checkpoint_dir(path: str | Path) -> bool:
    return _CHECKPOINT_NAME.fullmatch(Path(path).name) is not None


def is_sharded_checkpoint(path: str | Path) -> bool:
    return is_checkpoint_dir(path) and Path(path).name.endswith(DCP_SUFFIX)


def checkpoint_order(path: str | Path) -> tuple[int, bool]:
    """Sort key, oldest first: by step, and at one step the whole (safetensors) checkpoint after the
    sharded one, since a stage's final checkpoint is always whole."""
    return checkpoint_step(path), not is_sharded_checkpoint(path)


def checkpoint_dirs(directory: str | Path) -> list[Path]:
    """Checkpoint directories under `directory` (committed or not), oldest first."""
    directory = Path(directory)
    found = [p for p in directory.iterdir() if p.is_dir() and is_checkpoint_dir(p)] if directory.is_dir() else []
    return sorted(found, key=checkpoint_order)


# --- what a path holds ---------------------------------------------------------------------------
def artifact_kind(relative: str | Path) -> ArtifactKind:
    """The artifact kind of a file or directory, from its path under live storage, a stage
    directory or a baseline directory."""
    parts = PurePosixPath(Path(relative).as_posix()).parts
    if parts and parts[0] == "shards":
        return ArtifactKind.SYNTHETIC_IMAGERY
    if ADAPTERS in parts:
        return ArtifactKind.ADAPTER
    if "checkpoint" in parts or "checkpoints" in parts or (parts and is_checkpoint_dir(parts[-1])):
        return ArtifactKind.CHECKPOINT
    if parts and parts[-1] == "report.json":
        return ArtifactKind.GATE_REPORT
    if parts and parts[-1] == "latents.safetensors":
        return ArtifactKind.LATENT_SNAPSHOT
    return ArtifactKind.VALIDATION_OUTPUT  # outputs/, grid.png, baseline.json


# --- live storage ------------------------------------------------------------------------------------
def live_root(config) -> Path:
    """``<paths.root>/live`` (absolute) of a PipelineConfig."""
    return Path(config.paths.root).resolve() / "live"


def shard_cache_root(config) -> Path:
    return Path(config.data.cache.dir) if config.data.cache.dir else live_root(config) / "shards"


def default_object_store_url(root: str | Path) -> str:
    return f"file://{Path(root).resolve()}/objects"


def default_queue_url(root: str | Path) -> str:
    return f"sqlite:///{Path(root).resolve()}/queue.db"


def default_tracking_uri(root: str | Path) -> str:
    return f"sqlite:///{Path(root).resolve()}/mlflow.db"


def bases_dir(config, near: str | Path) -> Path:
    """Where a trainer writing under `near` keeps frozen bases: live storage's ``bases/`` when `near`
    is inside it, else ``<near>/bases`` (loading looks in the ``bases/`` nearest above a checkpoint)."""
    live = live_root(config)
    return live / BASES if Path(near).resolve().is_relative_to(live) else Path(near) / BASES


def base_key(digest: str, name: str = "") -> str:
    """``bases/<sha256>[/<name>]``: a frozen base in the object store (one copy for every run)."""
    return f"{BASES}/{safe_name(digest, 'base sha256')}" + (f"/{safe_name(name, 'base file')}" if name else "")


def base_record_key(digest: str) -> str:
    """``archive/manifests/bases/<sha256>.jsonl``: the archive records of a frozen base (written once)."""
    return f"{BASE_MANIFESTS}/{safe_name(digest, 'base sha256')}.jsonl"


def default_artifact_root(root: str | Path) -> str:
    return str(Path(root).resolve() / "mlartifacts")


def shard_cache_dataset_dir(cache_root: str | Path, name: str, version: str) -> Path:
    return Path(cache_root) / safe_name(name, "dataset name") / safe_name(version, "dataset version")


@dataclass(frozen=True)
class StagePaths:
    """The live directory of one stage of one run, and what lives in it (`_STAGE_FILES`)."""

    root: Path

    def __getattr__(self, name: str) -> Path:
        if name not in _STAGE_FILES:
            raise AttributeError(name)
        return self.root / _STAGE_FILES[name]


_STAGE_FILES = {
    "checkpoints": "checkpoints",
    "adapters": ADAPTERS,
    "gate": "gate",
    "gate_outputs": "gate/outputs",
    "gate_report": "gate/report.json",
    "gate_grid": "gate/grid.png",
    "gate_latents": "gate/latents.safetensors",
    "superseded_baseline": SUPERSEDED_BASELINE,
    "baseline_download": "baseline-download",
    "job_config": "job-config.json",
    "trainer_lock": ".trainer.lock",
    "train_result": "train-result.json",
}


@dataclass(frozen=True)
class BaselinePaths:
    """``baselines/<stage>/``: the current baseline's weights, control outputs and registry link."""

    root: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def record(self) -> Path:
        return self.root / "baseline.json"

    @property
    def staging(self) -> Path:
        """Where the next baseline is assembled before it replaces this one by a rename."""
        return self.root.with_name(f".{self.root.name}.tmp")


@dataclass(frozen=True)
class ShopperPaths:
    """``shoppers/<shopper>/``: everything drape holds of one opted-in shopper, and nothing else.
    ``shopper.json`` (the ledger) holds the consent, its expiry, the photos' hashes, the adapter
    and the try-on folders written elsewhere."""

    root: Path

    def __getattr__(self, name: str) -> Path:
        if name not in _SHOPPER_FILES:
            raise AttributeError(name)
        return self.root / _SHOPPER_FILES[name]

    def tryons(self, name: str) -> Path:
        return self.root / "tryons" / safe_name(name, "try-on folder")


_SHOPPER_FILES = {
    "ledger": "shopper.json",
    "photos": "photos",
    "holdout": "holdout",
    "adapter": "adapter",
    "report": "report.json",
    "job": "job.json",
}


@dataclass(frozen=True)
class LiveLayout:
    root: Path

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / safe_name(run_id, "run id")

    def stage(self, run_id: str, stage: str) -> StagePaths:
        return StagePaths(self.run_dir(run_id) / stage)

    def baseline(self, stage: str) -> BaselinePaths:
        return BaselinePaths(self.root / "baselines" / stage)

    @property
    def bases(self) -> Path:
        return self.root / BASES

    def model_version(self, version: str) -> Path:
        """``models/v<version>/``: a registry version's weights fetched for inference (`drape tryon`)."""
        return self.root / "models" / f"v{safe_name(version, 'model version')}"

    def evaluations(self) -> Path:
        """``eval/``: `drape eval` runs, one folder per protocol (``eval-<hash>/``: batches, results.json)."""
        return self.root / "eval"

    def inference(self, bench_id: str) -> Path:
        """``inference/<bench>/``: one `drape bench inference` run's captured inputs, per-variant results, report."""
        return self.root / "inference" / safe_name(bench_id, "benchmark id")

    def shopper(self, shopper_id: str) -> ShopperPaths:
        return ShopperPaths(self.root / SHOPPERS / safe_shopper_id(shopper_id))

    def forget_journal(self, subject: str) -> Path:
        return self.root / "privacy" / "pending" / f"{safe_name(subject, 'forget subject')}.json"

    def audit(self, request_id: str) -> Path:
        return self.root / "privacy" / "audit" / f"{safe_name(request_id, 'audit request')}.json"

    def restored(self, run_id: str, stage: str) -> Path:
        return self.root / "restored" / safe_name(run_id, "run id") / safe_name(stage, "stage")


# --- object keys ---------------------------------------------------------------------------------------
def dataset_prefix(name: str, version: str) -> str:
    return f"datasets/{safe_name(name, 'dataset name')}/{safe_name(version, 'dataset version')}"


def run_key(run_id: str, stage: str | None = None, relative: str = "") -> str:
    """``runs/<run>[/<stage>][/<relative>]``: where a live stage file is archived."""
    parts = [RUNS_PREFIX + safe_name(run_id, "run id"), stage and safe_name(stage, "stage"), relative.strip("/") or None]
    return "/".join(part for part in parts if part)


def run_key_of(run_dir: str | Path, run_id: str, file: str | Path) -> str:
    """The archive key of `file` under the live run directory `run_dir`."""
    return run_key(run_id, relative=Path(file).relative_to(run_dir).as_posix())


def shopper_prefix(shopper_id: str) -> str:
    """``shoppers/<shopper>/``: one prefix per shopper, so erasing them is one listing."""
    return f"{SHOPPERS}/{safe_shopper_id(shopper_id)}/"


def audit_key(request_id: str) -> str:
    return f"{AUDIT_PREFIX}/{safe_name(request_id, 'audit request')}.json"


def archive_manifest_prefix(run_id: str, stage: str | None = None) -> str:
    return f"{ARCHIVE_MANIFESTS}/{run_id}/{stage}" if stage else f"{ARCHIVE_MANIFESTS}/{run_id}"


def new_manifest_key(prefix: str, now: datetime, *, separator: str = "-") -> str:
    """A manifest object never written before: ``<prefix><separator><time>-<id>.jsonl``."""
    return f"{prefix}{separator}{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}.jsonl"

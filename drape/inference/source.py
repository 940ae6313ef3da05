"""What inference runs on: a promoted model (a registry alias, or a checkpoint directory) and the
captured inputs (the control set, some of its samples, or a folder in the control format)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drape import STAGES
from drape.config import PipelineConfig
from drape.jsonfile import read_json_object
from drape.layout import LiveLayout, live_root
from drape.training.checkpoints.checkpoint import CheckpointError, verify_checkpoint


class InferenceInputError(ValueError):
    """A model or input that cannot be used; the message names it and what was expected."""


@dataclass(frozen=True)
class ResolvedModel:
    checkpoint: Path  # a verified checkpoint directory
    label: str  # "denoise-baseline (v4)" or the path as given
    home: Path  # where the recommended inference config is written: next to the model
    alias: str | None = None
    version: str | None = None


def resolve_model(config: PipelineConfig, model: str | None = None) -> ResolvedModel:
    """`model` (default `inference.model`): a checkpoint directory, or an alias of the registered
    model. An alias is served from the live baseline when that is the version it points at, else
    fetched from the registry once into ``live/models/v<version>``."""
    wanted = model or config.inference.model
    path = Path(wanted)
    if path.is_dir():
        _verified(path, wanted)
        return ResolvedModel(path.resolve(), wanted, path.resolve().parent)
    if "/" in wanted or wanted.startswith("."):
        raise InferenceInputError(f"model {wanted!r}: no such checkpoint directory (expected a checkpoint or a registry alias)")
    from drape.ops.tracking import Tracker

    tracker = Tracker(config)
    version = tracker.version_by_alias(wanted)
    if version is None:
        known = ", ".join(sorted(tracker.aliases())) or "none: run `make demo` or `drape run` first"
        raise InferenceInputError(f"model {wanted!r}: no such alias of {tracker.model_name} (aliases: {known})")
    number, layout = str(version.version), LiveLayout(live_root(config))
    stage = wanted.removesuffix("-baseline")
    label = f"{wanted} (v{number})"
    if stage in STAGES and wanted == f"{stage}-baseline":
        live = layout.baseline(stage)
        record = read_json_object(live.record, "baseline record") if live.record.is_file() else {}
        if record.get("version") == number and live.checkpoint.is_dir():
            _verified(live.checkpoint, label)
            return ResolvedModel(live.checkpoint, label, live.root, wanted, number)
    target = layout.model_version(number)
    if not (target / "checkpoint").is_dir():
        temporary = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(temporary, ignore_errors=True)
        tracker.download(f"{version.source}/checkpoint", temporary)
        _verified(temporary / "checkpoint", label)
        _fetch_base(config, temporary / "checkpoint", layout.bases, label)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary.rename(target)
    _verified(target / "checkpoint", label)
    return ResolvedModel(target / "checkpoint", label, target, wanted, number)


def _fetch_base(config: PipelineConfig, checkpoint: Path, bases: Path, label: str) -> None:
    """The frozen base a registered stage checkpoint names, from the object store into live storage."""
    from drape.storage.bases import fetch_bases
    from drape.storage.store import StorageError, open_store

    try:
        fetch_bases(open_store(config), [checkpoint], bases)
    except (StorageError, ValueError) as error:
        raise InferenceInputError(f"model {label}: the frozen base of {checkpoint} cannot be fetched ({error})") from None


def _verified(path: Path, label: str) -> None:
    try:
        verify_checkpoint(path)
    except (CheckpointError, FileNotFoundError, ValueError) as error:
        raise InferenceInputError(f"model {label}: {path} is not a usable checkpoint ({error})") from None


def config_control(config: PipelineConfig) -> tuple[dict, str]:
    """The config's own control set, pre-staged into the shard cache when it is not there yet."""
    from drape.data.cache import ShardCache
    from drape.data.dataset import dataset_prefix, load_split, read_manifest
    from drape.storage.store import open_store

    store = open_store(config)
    manifest = read_manifest(store, dataset_prefix(config))
    if manifest is None:
        raise InferenceInputError(
            f"no dataset at {store.key_url(dataset_prefix(config))} for the control set; run `make demo` or `drape data shard`, "
            "or pass --inputs FOLDER"
        )
    cache = ShardCache.from_config(config, store, dataset_prefix(config), manifest)
    cache.prestage("control")
    return load_split(cache.dataset_dir, manifest, "control"), manifest["control_set"]


def subset(arrays: dict, keys: list[str]) -> dict:
    """The samples `keys` of a control set, in that order; an unknown key is an error listing some known ones."""
    index = {key: i for i, key in enumerate(arrays["keys"])}
    missing = [key for key in keys if key not in index]
    if missing:
        known = ", ".join(arrays["keys"][:4])
        raise InferenceInputError(f"control samples {missing} are not in the control set (it has {known}, ...)")
    rows = [index[key] for key in keys]
    picked = {name: value[rows] for name, value in arrays.items() if isinstance(value, np.ndarray)}
    return {**picked, "keys": keys, "meta": [arrays["meta"][i] for i in rows]}


def check_input_sizes(arrays: dict, where: str, height: int, width: int) -> None:
    """InferenceInputError naming the first sample and image whose size is not the model's
    (`height`×`width`, data.resolution): the model is never resized behind the caller's back."""
    for field, images in arrays.items():
        if not isinstance(images, np.ndarray) or images.ndim < 3 or images.shape[1:3] == (height, width):
            continue
        key = arrays["keys"][0] if arrays.get("keys") else "?"
        raise InferenceInputError(
            f"{where}: sample {key}: its {field} image is {images.shape[2]}×{images.shape[1]} (width×height), "
            f"the model takes {width}×{height} (data.resolution {height}×{width}); shard the inputs at that "
            "resolution (`drape data shard` with the model's config)"
        )


def captured_inputs(config: PipelineConfig, inputs: str | None = None) -> tuple[dict, str]:
    """(control arrays, control set id) of `inputs`: None, the config's control set; a folder, a
    dataset root or folder of control shards; else sample ids of the config's control set, comma-separated."""
    if inputs is None:
        return config_control(config)
    path = Path(inputs)
    if path.is_dir():
        from drape.data.dataset import ManifestError, load_control_dir
        from drape.data.shards import ShardError

        try:
            arrays, control_set = load_control_dir(path)
        except (FileNotFoundError, ShardError, ManifestError) as error:
            raise InferenceInputError(f"--inputs {inputs}: {error}") from None
        except ValueError as error:  # np.stack over samples of different sizes
            raise InferenceInputError(
                f"--inputs {inputs}: its samples are not all one size ({error}); every input must be "
                f"{config.data.width}×{config.data.height} (width×height), the model's data.resolution"
            ) from None
        check_input_sizes(arrays, f"--inputs {inputs}", config.data.height, config.data.width)
        return arrays, control_set
    if "/" in inputs:
        raise InferenceInputError(f"--inputs {inputs}: no such folder (expected a folder in the control format or sample ids)")
    arrays, control_set = config_control(config)
    return subset(arrays, [key.strip() for key in inputs.split(",") if key.strip()]), control_set

"""Checkpoints: safetensors weights plus a JSON manifest, never pickles.

A checkpoint directory holds ``model/`` (diffusers `save_pretrained`: config.json +
safetensors), ``optimizer.safetensors`` (AdamW moments and step per parameter name),
``ema.safetensors`` when EMA is on, and ``manifest.json`` with the pipeline config, stage, step,
data manifest hash, code version and the sha256 of every file. It is written to a temporary
directory and renamed into place, so a crash never leaves a half checkpoint that looks whole.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import drape
from drape.config.base import check_model_shape
from drape.jsonfile import read_json_object
from drape.layout import checkpoint_dirs
from drape.storage.checksum import sha256_file
from drape.storage.durable import fsync_dir, fsync_tree
from drape.training.model import PIXEL_DIT, TryOnModel, class_path, resolve_class

MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or does not match its manifest."""


def code_version() -> str:
    """drape's version plus the git commit when run from a checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{drape.__version__}+{commit}" if commit else drape.__version__


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    tensors = {}
    for index, name in enumerate(names):
        for field, value in optimizer.state_dict()["state"].get(index, {}).items():
            tensors[f"{name}/{field}"] = torch.as_tensor(value).clone().contiguous()
    return tensors


def _restore_optimizer(optimizer: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor]) -> None:
    state = optimizer.state_dict()
    state["state"] = {}
    for index, name in enumerate(names):
        fields = {key.split("/", 1)[1]: value for key, value in tensors.items() if key.split("/", 1)[0] == name}
        if fields:
            state["state"][index] = fields
    optimizer.load_state_dict(state)


def save_checkpoint(
    path: str | Path,
    *,
    model: TryOnModel,
    optimizer: torch.optim.Optimizer | None,
    trainable_names: list[str],
    ema: dict[str, torch.Tensor] | None,
    manifest: dict,
) -> Path:
    """Write a complete checkpoint at `path` atomically; returns `path`."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    model.save_pretrained(temporary / "model", safe_serialization=True)
    if optimizer is not None:
        save_file(optimizer_tensors(optimizer, trainable_names), str(temporary / "optimizer.safetensors"))
    if ema is not None:
        save_file({k: v.contiguous() for k, v in ema.items()}, str(temporary / "ema.safetensors"))
    full = {**manifest, "model_class": class_path(model), "trainable": trainable_names, "code_version": code_version()}
    return publish(temporary, path, full)


def publish(temporary: Path, path: Path, manifest: dict) -> Path:
    """Seal the directory `temporary` (the sha256 of every file into `manifest`, written last), make
    it durable and rename it to `path`: a crash never leaves a half directory that looks whole."""
    files = {str(p.relative_to(temporary)): sha256_file(p) for p in sorted(temporary.rglob("*")) if p.is_file()}
    (temporary / MANIFEST).write_text(json.dumps({**manifest, "files": files}, indent=2, sort_keys=True))
    fsync_tree(temporary)  # durable before the rename publishes it (and older checkpoints may go)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(temporary, path)
    fsync_dir(path.parent)
    return path


def export_weights(source: str | Path, destination: str | Path) -> Path:
    """Copy a checkpoint's weights (model, EMA) and manifest without optimizer state, atomically.

    Baselines keep only what serving, gating and the next stage's start need; the full checkpoint
    with optimizer moments goes to the object store with the rest of the run.
    """
    source, destination = Path(source), Path(destination)
    manifest = verify_checkpoint(source)
    temporary = destination.with_name(f".{destination.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.copytree(source / "model", temporary / "model")
    if (source / "ema.safetensors").is_file():
        shutil.copy2(source / "ema.safetensors", temporary / "ema.safetensors")
    return publish(temporary, destination, {**manifest, "exported_from": source.name, "optimizer_state": False})


def read_manifest(path: str | Path) -> dict:
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (incomplete or not a checkpoint)")
    return read_json_object(manifest_path, "checkpoint manifest")


def verify_checkpoint(path: str | Path) -> dict:
    """Check every file against the manifest's sha256; returns the manifest."""
    manifest = read_manifest(path)
    for name, digest in manifest["files"].items():
        file = Path(path) / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} listed in the manifest is missing")
        if sha256_file(file) != digest:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its sha256 in the manifest")
    return manifest


def load_model(path: str | Path, *, prefer_ema: bool = False, allowed: tuple[str, ...] = ()) -> TryOnModel:
    """The model of a verified checkpoint (safetensors only), of the class its manifest names
    (`model_class`; a built-in, or one of `allowed`: the caller's configured `model.class`); with
    `prefer_ema`, its EMA weights replace the trained parameters when the checkpoint has them
    (what gates and inference use)."""
    manifest = verify_checkpoint(path)
    name = manifest.get("model_class", PIXEL_DIT)
    try:
        cls = resolve_class(name, allowed)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    config_file = Path(path) / "model" / "config.json"
    try:  # the shape is input too: checked before a layer is built or a byte allocated
        check_model_shape(read_json_object(config_file, "model config"), str(config_file))
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    model = cls.from_pretrained(Path(path) / "model", use_safetensors=True, low_cpu_mem_usage=False)
    ema_file = Path(path) / "ema.safetensors"
    if prefer_ema and ema_file.is_file():
        model.load_state_dict(load_file(str(ema_file)), strict=False)
    return model


def _weight_files(path: str | Path) -> list[Path]:
    files = sorted((Path(path) / "model").glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {path}: no model/*.safetensors weights")
    return files


def model_tensor_names(path: str | Path) -> list[str]:
    """Names of a checkpoint's model tensors, from the safetensors headers alone."""
    from safetensors import safe_open

    names = []
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            names.extend(handle.keys())
    return names


def read_model_tensors(path: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named model tensors of a checkpoint, read from its safetensors files without
    building the model (a stage's trainable slice of a multi-GB model is a small read). Unverified:
    callers that use the weights load them with `load_model`, which checks every sha256."""
    from safetensors import safe_open

    wanted, tensors = set(names), {}
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for key in wanted.intersection(handle.keys()):
                tensors[key] = handle.get_tensor(key)
    missing = wanted - set(tensors)
    if missing:
        raise CheckpointError(
            f"checkpoint {path}: no tensor {sorted(missing)[0]!r} in model/*.safetensors "
            f"({len(missing)} of {len(wanted)} asked for are missing)"
        )
    return tensors


def load_training_state(path: str | Path, optimizer: torch.optim.Optimizer, trainable_names: list[str]) -> dict | None:
    """Restore optimizer moments in place; returns EMA tensors if the checkpoint has them."""
    path = Path(path)
    if (path / "optimizer.safetensors").is_file():
        _restore_optimizer(optimizer, trainable_names, load_file(str(path / "optimizer.safetensors")))
    return load_file(str(path / "ema.safetensors")) if (path / "ema.safetensors").is_file() else None


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints (committed by their manifest) under `directory`, oldest first (`drape.layout`)."""
    return [path for path in checkpoint_dirs(directory) if (path / MANIFEST).is_file()]

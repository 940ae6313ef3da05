"""Checkpoints: safetensors weights plus a JSON manifest, never pickles.

A checkpoint directory holds the model's weights, ``optimizer.safetensors`` (AdamW moments and
step per parameter name), ``ema.safetensors`` when EMA is on, and ``manifest.json`` with the
pipeline config, stage, step, data manifest hash, code version and the sha256 of every file. It
is written to a temporary directory and renamed into place, so a crash never leaves a half
checkpoint that looks whole. The weights come in one of two forms (docs/storage.md):

- a *stage checkpoint*, when a stage trains part of the model and the trainer names a folder of
  bases: ``model/config.json``, ``stage.safetensors`` with the tensors the stage trains, and in
  the manifest ``base`` (``sha256``: the content hash of every other tensor, `drape.training.checkpoints.base`;
  ``tensors``, ``bytes``). The frozen tensors live once in ``bases/<sha256>/``; loading finds the
  nearest one above the checkpoint, reassembles the model bit for bit and refuses a base whose
  content hash is not the one named;
- a *whole checkpoint* (every tensor trains, or the caller named no bases; also every checkpoint
  written before stage checkpoints existed, which loads as it always did): ``model/``, diffusers
  `save_pretrained` (config.json + safetensors).

With `compress` (`train.checkpoint_compression: planes`), ``stage.safetensors``, ``optimizer.safetensors``
and ``ema.safetensors`` are kept packed in byte planes (`drape.training.checkpoints.stored`: lossless,
each verified before the checkpoint is published, unpacked and checked against the manifest on read).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import cast

import torch
from safetensors.torch import save_file

import drape
from drape.config.base import check_model_shape
from drape.jsonfile import read_json_object
from drape.layout import checkpoint_dirs
from drape.storage.checksum import sha256_file
from drape.storage.durable import fsync_dir, fsync_tree, whole_or_nothing
from drape.training.checkpoints.base import (
    BASE_FILE,
    MANIFEST,
    cached_hash,
    check_digest,
    find_base,
    load_base_into,
    remember_hash,
    skipped_init,
    write_base,
)
from drape.training.checkpoints.planes import SUFFIX
from drape.training.checkpoints.stored import PACKED, has_file, optimizer_tensors, pack_files, read_file, stored_names
from drape.training.checkpoints.stored import load_training_state as load_training_state  # callers import it from here
from drape.training.published.weights import load_folder, some
from drape.training.recipes.model import PIXEL_DIT, TryOnModel, class_path, resolve_class

STAGE_FILE = "stage.safetensors"  # a stage checkpoint's trained tensors


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


def save_checkpoint(
    path: str | Path,
    *,
    model: TryOnModel,
    optimizer: torch.optim.Optimizer | None,
    trainable_names: list[str],
    ema: dict[str, torch.Tensor] | None,
    manifest: dict,
    bases: str | Path | None = None,
    stage_names: list[str] | None = None,
    moments: torch.dtype | None = None,
    compress: bool = False,
) -> Path:
    """Write a complete checkpoint at `path` atomically; returns `path`. With `bases` (a folder of
    frozen bases), a stage checkpoint: the `stage_names` tensors (default `trainable_names`) in
    ``stage.safetensors`` and every other tensor in ``<bases>/<content hash>/``, written there
    once; without, or when the stage trains every tensor, the whole model. `moments`: the dtype
    AdamW's moments are stored in (`train.checkpoint_moments`; default as they are, lossless). `compress`:
    the stage, optimizer and EMA files packed in byte planes (`train.checkpoint_compression`; lossless)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    needed = _tensor_bytes(model.state_dict(), ema, optimizer.state if optimizer is not None else None)
    with whole_or_nothing(temporary, path, "a checkpoint", needed):  # a full disk: no partial copy, a clear error
        manifest = {key: value for key, value in manifest.items() if key != PACKED}  # a carried-over record no longer holds
        _save(temporary, model, optimizer, trainable_names, ema, manifest, bases, stage_names, moments)
        return publish(temporary, path, _full_manifest(temporary, model, trainable_names, manifest, compress))


def _tensor_bytes(*containers: object) -> int:
    """Bytes of every tensor in `containers` (dicts of tensors, an optimizer's state): what a save writes."""
    total, stack = 0, list(containers)
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            stack.extend(item.values())
    return total


def _save(
    temporary: Path,
    model: TryOnModel,
    optimizer: torch.optim.Optimizer | None,
    trainable_names: list[str],
    ema: dict[str, torch.Tensor] | None,
    manifest: dict,
    bases: str | Path | None,
    stage_names: list[str] | None,
    moments: torch.dtype | None,
) -> None:
    """Write the checkpoint's files into `temporary`; `manifest` gains what they are (in place)."""
    base = None
    if bases is not None:
        base = _save_stage_weights(temporary, model, stage_names or trainable_names, Path(bases))
    if base is None:  # whole: a `base` record carried over from the manifest of a stage checkpoint no longer holds
        model.save_pretrained(temporary / "model", safe_serialization=True)
        manifest.pop("base", None)
    else:
        manifest["base"] = base
    if optimizer is not None:
        save_file(optimizer_tensors(optimizer, trainable_names, moments), str(temporary / "optimizer.safetensors"))
        if moments is not None:  # lossy: the manifest says so
            manifest["optimizer_moments"] = str(moments).removeprefix("torch.")
    if ema is not None:
        save_file({k: v.contiguous() for k, v in ema.items()}, str(temporary / "ema.safetensors"))


def _full_manifest(temporary: Path, model: TryOnModel, trainable_names: list[str], manifest: dict, compress: bool) -> dict:
    """The manifest `publish` seals: the caller's, what the files are, and (`compress`) the packed files' records."""
    packed = {PACKED: pack_files(temporary)} if compress else {}  # each read back and verified before its raw file goes
    return {**manifest, **packed, "model_class": class_path(model), "trainable": trainable_names, "code_version": code_version()}


def _save_stage_weights(temporary: Path, model: TryOnModel, stage_names: list[str], bases: Path) -> dict | None:
    """The stage's tensors into `temporary`/stage.safetensors and the rest into its base (written
    when not already there); the manifest's ``base`` record. None: nothing is frozen, save it whole."""
    state = model.state_dict()
    chosen = set(stage_names)
    unknown = sorted(chosen - set(state))
    if unknown:
        raise CheckpointError(f"stage tensors {unknown[:3]} are not tensors of {type(model).__name__}")
    frozen = {name: tensor for name, tensor in state.items() if name not in chosen}
    if not set(frozen) & {name for name, _ in model.named_parameters()}:  # every parameter trains
        return None
    digest = cached_hash(model, frozen)
    base_dir = bases / digest
    if not (base_dir / MANIFEST).is_file():
        write_base(base_dir, frozen, digest, class_path(model))
    model.save_config(temporary / "model")
    save_file({name: state[name].contiguous() for name in stage_names}, str(temporary / STAGE_FILE))
    size = sum(t.numel() * t.element_size() for t in frozen.values())
    return {"sha256": digest, "tensors": len(frozen), "bytes": size}


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
    kept = (STAGE_FILE, "ema.safetensors")  # a stage checkpoint's base stays where it is, named by its hash
    for stored in (file for name in kept for file in stored_names(source, name, manifest)):
        shutil.copy2(source / stored, temporary / stored)  # as stored: a packed file stays packed
    packed = {name: record for name, record in manifest.get(PACKED, {}).items() if name in kept}
    manifest = {key: value for key, value in manifest.items() if key != PACKED} | ({PACKED: packed} if packed else {})
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
    (what gates and inference use). A stage checkpoint is reassembled from its base (`base_of`),
    whose content hash is checked as it is read."""
    manifest = verify_checkpoint(path)
    name = manifest.get("model_class", PIXEL_DIT)
    try:
        cls = resolve_class(name, allowed)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    config_file = Path(path) / "model" / "config.json"
    try:  # the shape is input too: checked before a layer is built or a byte allocated
        config = read_json_object(config_file, "model config")
        check_model_shape(config, str(config_file))
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    try:
        model = _assemble(Path(path), manifest, cls) if "base" in manifest else _read_whole(Path(path), cls)
        if prefer_ema and has_file(Path(path), "ema.safetensors", manifest):
            model.load_state_dict(_read_ema(Path(path), model, manifest), strict=False)
    except CheckpointError:
        raise
    except ValueError as error:  # the strict reader's refusals (drape.training.published.weights), naming file and tensor
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    return model


def _read_whole(path: Path, cls: type[TryOnModel]) -> TryOnModel:
    """A whole checkpoint's model, read strictly (`drape.training.published.weights.load_folder`: safetensors
    only, every tensor of the model from the files and no other, shapes equal, every value finite)."""
    arguments, state = load_folder(cls, path / "model", "model", dtype=None)
    with skipped_init():  # every tensor is overwritten (checked): random initial weights would be wasted
        model = cast(TryOnModel, cls.from_config(arguments))
    model.load_state_dict(state, strict=True)
    return model.eval()  # as `from_pretrained` leaves it


def _read_ema(path: Path, model: TryOnModel, manifest: dict) -> dict[str, torch.Tensor]:
    """``ema.safetensors``, strictly: tensors of the model only, in its shapes, every value finite."""
    where, tensors = str(path / "ema.safetensors"), read_file(path, "ema.safetensors", manifest)
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    stray = set(tensors) - set(shapes)
    if stray:
        raise ValueError(f"{where}: {len(stray)} tensor(s) are no tensor of the model ({some(stray)})")
    for name, tensor in tensors.items():
        if tensor.shape != shapes[name]:
            shape = tuple(shapes[name])
            raise ValueError(f"{where}: {name} in ema.safetensors has shape {tuple(tensor.shape)}, the model {shape}")
    return tensors


def base_of(path: str | Path, manifest: dict | None = None) -> Path | None:
    """The base folder a stage checkpoint was trained on (`drape.training.checkpoints.base.find_base`); None
    for a whole checkpoint. A CheckpointError says which base is missing and how to bring it back."""
    manifest = manifest if manifest is not None else read_manifest(path)
    if "base" not in manifest:
        return None
    digest = base_digest_of(manifest, path)
    found = find_base(path, digest)
    if found is None:
        raise CheckpointError(
            f"checkpoint {path} was trained on the frozen base {digest}, which is in no bases/{digest}/ above it: "
            f"bring it back from the object store (key bases/{digest}/, `drape storage restore`)"
        )
    return found


def base_digest_of(manifest: dict, path: str | Path) -> str:
    """The content hash a stage checkpoint's manifest names (checked to be one)."""
    base = manifest.get("base")
    try:
        return check_digest(base.get("sha256") if isinstance(base, dict) else None, f"checkpoint {path}/{MANIFEST}")
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def _assemble(path: Path, manifest: dict, cls: type[TryOnModel]) -> TryOnModel:
    """A stage checkpoint's model: built from its config, the base's tensors then the stage's copied
    in; every tensor of the model comes from exactly one of the two, and the base's content hash
    must be the one the manifest names."""
    base_dir, digest = base_of(path, manifest), base_digest_of(manifest, path)
    assert base_dir is not None
    with skipped_init():  # every tensor is overwritten below (checked): random initial weights would be wasted
        model = cast(TryOnModel, cls.from_config(cast(dict, cls.load_config(path / "model"))))
    model.eval()  # as `from_pretrained` leaves it
    state = model.state_dict()
    try:
        base_names, found = load_base_into(state, base_dir)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    if found != digest:
        raise CheckpointError(
            f"checkpoint {path} names the frozen base {digest} ({path / MANIFEST}), but {base_dir / BASE_FILE} "
            f"hashes to {found}: a different or damaged base; refusing to assemble the model from it"
        )
    stage = read_file(path, STAGE_FILE, manifest)  # every value finite; a packed file unpacked and verified
    overlap, missing = set(stage) & set(base_names), set(state) - set(stage) - set(base_names)
    if overlap or missing or set(stage) - set(state):
        odd = sorted(overlap or missing or set(stage) - set(state))[0]
        raise CheckpointError(f"checkpoint {path}: {STAGE_FILE} and base {digest[:12]} do not make the model (tensor {odd!r})")
    with torch.no_grad():
        for name, tensor in stage.items():
            if state[name].dtype != tensor.dtype or state[name].shape != tensor.shape:
                raise CheckpointError(f"checkpoint {path}: {STAGE_FILE} tensor {name!r} is not the model's dtype and shape")
            state[name].copy_(tensor)
    remember_hash(model, {name: state[name] for name in base_names}, digest)
    return model


def _weight_files(path: Path) -> list[Path]:
    """The files holding a checkpoint's model tensors: a stage checkpoint's (as stored) and its base's, or a whole one's."""
    manifest = read_manifest(path) if (path / MANIFEST).is_file() else {}
    if has_file(path, STAGE_FILE, manifest):
        base = base_of(path, manifest)
        return [path / stored_names(path, STAGE_FILE, manifest)[0]] + ([base / BASE_FILE] if base is not None else [])
    files = sorted((path / "model").glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {path}: no model/*.safetensors weights")
    return files


class _Unpacked:
    """A packed stage file's tensors, unpacked and verified, read as `safe_open` reads a file."""

    def __init__(self, path: Path) -> None:
        self.tensors = read_file(path, STAGE_FILE, read_manifest(path), strict=False)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get_tensor(self, key: str) -> torch.Tensor:
        return self.tensors[key]


def _open(path: Path, file: Path):
    from safetensors import safe_open

    return contextlib.nullcontext(_Unpacked(path)) if file.name.endswith(SUFFIX) else safe_open(str(file), framework="pt")


def model_tensor_names(path: str | Path) -> list[str]:
    """Names of a checkpoint's model tensors, from the safetensors headers alone (a stage
    checkpoint's and its base's; a packed stage file is unpacked)."""
    names = []
    for file in _weight_files(Path(path)):
        with _open(Path(path), file) as handle:
            names.extend(handle.keys())
    return names


def read_model_tensors(path: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named model tensors of a checkpoint, read from its safetensors files (a stage
    checkpoint's, then its base's) without building the model (a stage's trainable slice of a
    multi-GB model is a small read). Unverified: callers that use the weights load them with
    `load_model`, which checks every sha256 and the base's content hash."""
    wanted, tensors = set(names), dict[str, torch.Tensor]()
    for file in _weight_files(Path(path)):
        with _open(Path(path), file) as handle:
            for key in (wanted - set(tensors)).intersection(handle.keys()):
                tensors[key] = handle.get_tensor(key)
    missing = wanted - set(tensors)
    if missing:
        raise CheckpointError(
            f"checkpoint {path}: no tensor {sorted(missing)[0]!r} in its weights "
            f"({len(missing)} of {len(wanted)} asked for are missing)"
        )
    return tensors


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete checkpoints (committed by their manifest) under `directory`, oldest first (`drape.layout`)."""
    return [path for path in checkpoint_dirs(directory) if (path / MANIFEST).is_file()]

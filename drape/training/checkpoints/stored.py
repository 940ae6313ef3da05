"""A checkpoint's safetensors files as stored: as they are, or packed into byte planes.

With `train.checkpoint_compression: planes` a checkpoint keeps ``stage.safetensors``,
``optimizer.safetensors`` and ``ema.safetensors`` packed (`drape.training.checkpoints.planes`: lossless,
~0.83 of their size on AdamW-trained fp32 tensors) as ``<name>.planes``; its manifest's ``packed``
maps each name to the raw file's size and sha256 (and ``files``, as for every file, holds the
packed file's sha256). Readers ask for the name and get the safetensors file's tensors either way,
bit for bit what was saved: a packed file is unpacked, bounded and checked against ``packed``.
The optimizer's state goes through here too (`optimizer_tensors`, `load_training_state`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from drape.jsonfile import read_json_object
from drape.training.checkpoints.base import MANIFEST
from drape.training.checkpoints.planes import SUFFIX, PlanesError, load_packed, pack_file
from drape.training.published.weights import read_tensors, tensor_headers

PACKED = "packed"  # the manifest's map: safetensors file name → its packed file's record
PACKABLE = ("stage.safetensors", "optimizer.safetensors", "ema.safetensors")


def pack_files(directory: Path) -> dict[str, dict]:
    """Pack each of `PACKABLE` present in `directory` (an unpublished checkpoint), each verified by
    reading it back (`pack_file`) before the raw file is removed; the manifest's ``packed`` map."""
    records = {}
    for name in PACKABLE:
        raw = directory / name
        if raw.is_file():
            records[name] = pack_file(raw, directory / f"{name}{SUFFIX}")
            raw.unlink()  # its verified packed copy is beside it
    return records


def _record(directory: Path, name: str, manifest: dict) -> dict | None:
    """The manifest's record of `name` packed; None when the checkpoint keeps it as it is."""
    packed = manifest.get(PACKED)
    record = packed.get(name) if isinstance(packed, dict) else None
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("file") != f"{name}{SUFFIX}":
        raise PlanesError(f"checkpoint {directory}: its manifest's packed record of {name} is malformed")
    return record


def has_file(directory: Path, name: str, manifest: dict) -> bool:
    """Whether the checkpoint at `directory` holds the safetensors file `name`, as it is or packed."""
    if (directory / name).is_file():
        return True
    return _record(directory, name, manifest) is not None and (directory / f"{name}{SUFFIX}").is_file()


def stored_names(directory: Path, name: str, manifest: dict) -> list[str]:
    """The file(s) on disk that hold `name`: itself, or its packed file; none when absent."""
    if (directory / name).is_file():
        return [name]
    return [f"{name}{SUFFIX}"] if has_file(directory, name, manifest) else []


def read_file(directory: Path, name: str, manifest: dict, *, strict: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of the checkpoint's safetensors file `name` (as it is, or unpacked and verified);
    `strict`: every floating value finite (ValueError naming the tensor and the file otherwise)."""
    where = str(directory / name)
    if (directory / name).is_file():
        if not strict:
            from safetensors.torch import load_file

            return load_file(where)
        entries = tensor_headers(directory, name, stem=name.removesuffix(".safetensors"))
        return read_tensors(entries, entries, where, dtype=None)
    record = _record(directory, name, manifest)
    if record is None:
        raise PlanesError(f"checkpoint {directory}: no {name} (neither as it is nor packed in its manifest)")
    tensors = load_packed(directory / f"{name}{SUFFIX}", record)
    for key, tensor in tensors.items() if strict else ():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(f"{where}: {key} in {name} holds {bad:,} NaN or infinite value(s)")
    return tensors


def optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: list[str], moments: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """``<name>/<field>`` → the optimizer's state of each named parameter; with `moments`, its floating
    state other than ``step`` cast to that dtype (restoring casts it back to the parameter's)."""
    tensors, state = {}, optimizer.state_dict()["state"]
    for index, name in enumerate(names):
        for field, value in state.get(index, {}).items():
            tensor = torch.as_tensor(value)
            if moments is not None and field != "step" and tensor.is_floating_point():
                tensor = tensor.to(moments)
            tensors[f"{name}/{field}"] = tensor.clone().contiguous()
    return tensors


def restore_optimizer(optimizer: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor]) -> None:
    """Put `tensors` (`optimizer_tensors`' layout) back as `optimizer`'s state."""
    state = optimizer.state_dict()
    state["state"] = {}
    for index, name in enumerate(names):
        fields = {key.split("/", 1)[1]: value for key, value in tensors.items() if key.split("/", 1)[0] == name}
        if fields:
            state["state"][index] = fields
    optimizer.load_state_dict(state)


def load_training_state(path: str | Path, optimizer: torch.optim.Optimizer, trainable_names: list[str]) -> dict | None:
    """Restore optimizer moments in place; returns EMA tensors if the checkpoint has them (either
    file as it is or packed)."""
    path = Path(path)
    manifest = read_json_object(path / MANIFEST, "checkpoint manifest") if (path / MANIFEST).is_file() else {}
    if has_file(path, "optimizer.safetensors", manifest):
        restore_optimizer(optimizer, trainable_names, read_file(path, "optimizer.safetensors", manifest, strict=False))
    return read_file(path, "ema.safetensors", manifest, strict=False) if has_file(path, "ema.safetensors", manifest) else None

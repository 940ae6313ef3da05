"""Frozen bases: the tensors a stage does not train, kept once and named by their content hash.

A stage of CatVTON trains 49.57 M of 899 M parameters; a checkpoint that held the whole model
would repeat the same frozen 850 M at every save and in every stage's archive. A stage checkpoint
(`drape.training.checkpoints.checkpoint`) holds the tensors its stage trains and names the frozen rest by its
*content hash*; the frozen tensors live once in a base folder ``bases/<sha256>/`` (``base.safetensors``
and a ``manifest.json``), in live storage and, at the same key, in the object store.

The content hash (`content_hash`) is the sha256 of ``drape-base-v1\\n`` followed, for each tensor
in name order (Python's sort of the names), by the line ``<name>\\0<dtype>\\0<shape, comma-joined>\\0<bytes>\\n``
and the tensor's raw bytes (contiguous, little-endian as torch lays them out on CPU). It depends on
what the tensors are, not on how a file lays them out, so a base re-saved by another safetensors
version keeps its name. It is computed once per model object and cached on it (`cached_hash`: a
tensor written in place, or replaced, invalidates the cache), and checked again, tensor by
tensor, whenever a base is loaded (`load_base_into`): a base whose bytes differ is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from drape.layout import BASES
from drape.storage.checksum import sha256_file
from drape.storage.durable import fsync_dir, fsync_tree, whole_or_nothing

BASE_FILE = "base.safetensors"
MANIFEST = "manifest.json"  # a checkpoint's, and a base's
HASH_PREFIX = b"drape-base-v1\n"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def check_digest(value: object, where: str) -> str:
    """`value` as a base's content hash (64 lowercase hex digits); ValueError naming `where` otherwise."""
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise ValueError(f"{where}: base sha256 {value!r} is not 64 lowercase hex digits")
    return value


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (a DTensor) gathered from every rank (a collective)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _update(digest, name: str, tensor: torch.Tensor) -> None:
    flat = _whole(tensor).detach().to("cpu").contiguous().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    shape = ",".join(str(size) for size in tensor.shape)
    digest.update(f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{shape}\0{nbytes}\n".encode())
    if nbytes:
        digest.update(flat.view(torch.uint8).numpy().data)


def content_hash(tensors: Mapping[str, torch.Tensor]) -> str:
    """The content hash of `tensors` (module docstring): names, dtypes, shapes and bytes in name order."""
    digest = hashlib.sha256(HASH_PREFIX)
    for name in sorted(tensors):
        _update(digest, name, tensors[name])
    return digest.hexdigest()


def _identity(tensors: Mapping[str, torch.Tensor]) -> tuple:
    """What changes when a tensor is replaced or written in place (its storage, its version counter)."""
    return tuple((name, _local(t).data_ptr(), _local(t)._version, t.dtype, tuple(t.shape)) for name, t in sorted(tensors.items()))


def cached_hash(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> str:
    """`content_hash(tensors)` for tensors of `model` (its state dict's), computed once and cached on
    the model while none of them is replaced or written in place: the saves of a stage hash the
    frozen base once (2-3 s for CatVTON's 850 M frozen parameters; benchmarks/checkpoint_size.py).
    FSDP2 shards are gathered one tensor at a time: every rank calls it (the cache is alike on all)."""
    key = _identity(tensors)
    cached = model.__dict__.get("_drape_base_hash")
    if cached is not None and cached[0] == key:
        return cached[1]
    digest = content_hash(tensors)
    model.__dict__["_drape_base_hash"] = (key, digest)
    return digest


def remember_hash(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], digest: str) -> None:
    """Record that `tensors` of `model` hash to `digest` (verified while they were loaded)."""
    model.__dict__["_drape_base_hash"] = (_identity(tensors), digest)


_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
          "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")  # fmt: skip


@contextlib.contextmanager
def skipped_init() -> Iterator[None]:
    """Build a model without drawing its random initial weights (`torch.nn.init` does nothing
    inside): for a model whose every tensor is then overwritten from files (a stage checkpoint
    checks that it is). 899 M parameters initialise in ~90 s on two CPU cores; this skips that."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def find_base(checkpoint: str | Path, digest: str) -> Path | None:
    """The folder ``bases/<digest>`` nearest above `checkpoint` (the checkpoint's own folder first,
    then each parent: live storage's ``bases/`` serves every run, baseline and restored copy under it)."""
    start = Path(checkpoint).resolve()
    for folder in (start, *start.parents):
        candidate = folder / BASES / digest
        if (candidate / BASE_FILE).is_file():
            return candidate
    return None


def base_tensor_names(base_dir: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(base_dir / BASE_FILE), framework="pt") as handle:
        return list(handle.keys())


def iter_base(base_dir: Path, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the base's `names`, one at a time, in the given order (memory: one tensor)."""
    from safetensors import safe_open

    with safe_open(str(base_dir / BASE_FILE), framework="pt") as handle:
        for name in names:
            yield name, handle.get_tensor(name)


@torch.no_grad()
def load_base_into(state: Mapping[str, torch.Tensor], base_dir: Path) -> tuple[list[str], str]:
    """Copy the base's tensors into `state` (a model's state dict: views of its tensors), one tensor
    at a time, hashing each as it is read; returns (the names copied, their content hash). A tensor
    the model does not have, of another dtype or shape, or holding NaN/inf, is a ValueError naming it."""
    names = sorted(base_tensor_names(base_dir))
    digest = hashlib.sha256(HASH_PREFIX)
    for name, tensor in iter_base(base_dir, names):
        target = state.get(name)
        if target is None or target.dtype != tensor.dtype or target.shape != tensor.shape:
            have = "no such tensor" if target is None else f"{target.dtype} {tuple(target.shape)}"
            raise ValueError(
                f"{base_dir / BASE_FILE}: tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}, the model has {have}"
            )
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(f"{base_dir / BASE_FILE}: tensor {name!r} holds NaN or infinite values")
        _update(digest, name, tensor)
        target.copy_(tensor)
    return names, digest.hexdigest()


def write_base(base_dir: Path, frozen: dict[str, torch.Tensor], digest: str, model_class: str) -> None:
    """A base folder, written to a temporary name and renamed: whole or not there. Another writer
    that got there first (the same content, by its name) wins; ours is dropped."""
    temporary = base_dir.with_name(f".{base_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    size = sum(t.numel() * t.element_size() for t in frozen.values())
    with whole_or_nothing(temporary, base_dir, "a frozen base", size):
        temporary.mkdir(parents=True)
        save_file({name: tensor.contiguous() for name, tensor in frozen.items()}, str(temporary / BASE_FILE))
        record = {"format": "drape-base", "sha256": digest, "tensors": len(frozen), "bytes": size, "model_class": model_class}
        files = {BASE_FILE: sha256_file(temporary / BASE_FILE)}
        (temporary / MANIFEST).write_text(json.dumps({**record, "files": files}, indent=2, sort_keys=True))
        fsync_tree(temporary)
    try:
        os.replace(temporary, base_dir)
    except OSError:  # there now, written by another process
        shutil.rmtree(temporary, ignore_errors=True)
    fsync_dir(base_dir.parent)

"""Strict reading of diffusers weight folders: safetensors only, every tensor accounted for, finite, bounded.

diffusers' `from_pretrained` is lenient where a training run must not be: a file that lacks most
of the model's tensors builds with a warning (the rest keep their random initialisation, some
of them NaN), a folder holding only `diffusion_pytorch_model.fp16.safetensors` fails after the
model is built, a `.bin` beside no safetensors is unpickled, and a config.json asking for a
million channels reaches the allocator. drape reads a diffusers folder itself instead:

1. config.json (at most `MAX_CONFIG_BYTES`) is bounded by `check_model_shape` and the model it
   describes is built on the meta device and counted against `MAX_PARAMETERS`: before a byte is
   allocated.
2. The weight files are the folder's `diffusion_pytorch_model[.variant].safetensors`, or the
   shards its `.index.json` names (each a plain file name in the folder, present, holding exactly
   the tensors the index maps to it). Pickles (`PICKLE_SUFFIXES`) are never opened: a folder with
   no safetensors is refused naming them.
3. The files' tensor names (from the safetensors headers) must be the meta model's, shapes equal:
   missing and unexpected names are refused, the first few and a count named with the file.
4. Every tensor read is finite (the error names it), then cast to the dtype asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from drape.config.base import check_model_shape
from drape.jsonfile import parse_json

WEIGHTS_STEM = "diffusion_pytorch_model"  # diffusers' weight file name, before .[variant.]safetensors
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")  # never opened: unpickling runs code
MAX_PARAMETERS = 20 * 10**9  # beyond any published try-on model (CatVTON 0.9 B, FitDiT ~1 B) by far
MAX_CONFIG_BYTES = 1 << 20  # a diffusers config.json is a few KiB
MAX_INDEX_BYTES = 64 << 20  # a sharded model's index maps every tensor name to its shard: MiBs at most
SHOWN = 5  # names quoted in an error before "and N more"


@dataclass(frozen=True)
class TensorEntry:
    """Where a tensor is, as a safetensors header says: its file, shape and dtype (e.g. "F16")."""

    file: Path
    shape: tuple[int, ...]
    dtype: str


def some(names: Iterable[str]) -> str:
    """The first `SHOWN` of sorted `names` and how many more: 'a, b, c and 385 more'."""
    ordered = sorted(names)
    shown = ", ".join(ordered[:SHOWN])
    return f"{shown} and {len(ordered) - SHOWN} more" if len(ordered) > SHOWN else shown


def read_config(folder: Path, where: str) -> dict[str, Any]:
    """The constructor arguments in `folder`'s config.json (diffusers' `_` metadata left out), bounded
    by `check_model_shape`; ValueError naming `where` and the file otherwise."""
    file = folder / "config.json"
    if not file.is_file():
        raise ValueError(f"{where}: no config.json in {folder} (expected a diffusers model folder)")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{where}: {file} is {file.stat().st_size:,} bytes; a diffusers config.json is a few KiB")
    document = parse_json(file.read_bytes(), str(file), "model config")
    check_model_shape(document, f"{where}: {file}")
    assert isinstance(document, dict)  # check_model_shape refuses anything else
    return {key: value for key, value in document.items() if not key.startswith("_")}


def meta_shapes(cls: Any, arguments: dict[str, Any], where: str) -> dict[str, torch.Size]:
    """The state-dict shapes of `cls.from_config(arguments)` built on the meta device (no memory),
    refused when it counts more than `MAX_PARAMETERS` or the arguments do not build."""
    try:
        with torch.device("meta"):
            model = cls.from_config(arguments)
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as error:
        raise ValueError(f"{where}: its config does not build a {cls.__name__} ({error})") from None
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    count = sum(math.prod(shape) for shape in shapes.values())
    if count > MAX_PARAMETERS:
        raise ValueError(
            f"{where}: its config describes a {cls.__name__} of {count:,} parameters, beyond any try-on model "
            f"(at most {MAX_PARAMETERS:,}); refused before anything is allocated"
        )
    return shapes


def _plain_name(name: object, index: Path) -> str:
    if not isinstance(name, str) or Path(name).name != name or name in (".", "..") or not name.endswith(".safetensors"):
        raise ValueError(f"{index}: shard {name!r} is not a .safetensors file name in the index's own folder")
    return name


def read_index(index: Path) -> dict[str, Path]:
    """Tensor name → shard file of a sharded model's `*.safetensors.index.json` (its `weight_map`)."""
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise ValueError(f"{index}: {index.stat().st_size:,} bytes, beyond any index of shards ({MAX_INDEX_BYTES:,})")
    document = parse_json(index.read_bytes(), str(index), "shard index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: expected a JSON object with a non-empty weight_map (tensor name → shard file)")
    shards = {name: index.parent / _plain_name(shard, index) for name, shard in weight_map.items()}
    absent = sorted({shard.name for shard in shards.values() if not shard.is_file()})
    if absent:
        raise ValueError(f"{index}: {len(absent)} shard(s) it names are not in {index.parent}: {some(absent)}")
    return shards


def _refusal(folder: Path, name: str, field: str) -> str:
    """Why `folder` has no `name`: another variant, or pickles only, or nothing."""
    variants = sorted(p.name for p in folder.glob(f"{WEIGHTS_STEM}.*.safetensors*") if p.name != name)
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if variants:
        found = variants[0].removeprefix(f"{WEIGHTS_STEM}.").split(".")[0]
        hint = f"set {field}.variant: {found}" if found in ("fp16", "bf16") else f"{field}.variant is fp16 or bf16"
        return f"{folder} has no {name} (or its .index.json), only {some(variants)}: {hint}"
    if pickles:
        return (
            f"{folder} has no {name}, only pickle weights ({some(pickles)}): drape reads safetensors only and "
            "never unpickles (loading a pickle runs code)"
        )
    return f"{folder} has no {name} (or its .index.json)"


def tensor_headers(folder: Path, field: str, *, variant: str | None = None, stem: str = WEIGHTS_STEM) -> dict[str, TensorEntry]:
    """Every tensor of `folder`'s weights (`stem[.variant].safetensors`, or the shards of its index),
    from the safetensors headers alone (nothing is read but the headers)."""
    name = f"{stem}.{variant}.safetensors" if variant else f"{stem}.safetensors"
    single, index = folder / name, folder / f"{name}.index.json"
    if single.is_file():
        return _headers(single, None)
    if not index.is_file():
        raise ValueError(f"{field}: {_refusal(folder, name, field.rsplit('.', 1)[0])}")
    shards = read_index(index)
    entries: dict[str, TensorEntry] = {}
    for shard in sorted(set(shards.values())):
        entries.update(_headers(shard, {tensor for tensor, file in shards.items() if file == shard}))
    return entries


def _headers(file: Path, mapped: set[str] | None) -> dict[str, TensorEntry]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            entries = {
                key: TensorEntry(file, tuple(handle.get_slice(key).get_shape()), handle.get_slice(key).get_dtype())
                for key in handle.keys()
            }
    except (SafetensorError, OSError) as error:  # a damaged or truncated header
        raise ValueError(f"{file}: not a readable safetensors file ({error})") from None
    if mapped is not None and set(entries) != mapped:
        absent, stray = mapped - set(entries), set(entries) - mapped
        raise ValueError(
            f"{file}: does not hold what its index maps to it"
            + (f"; {len(absent)} tensor(s) missing: {some(absent)}" if absent else "")
            + (f"; {len(stray)} tensor(s) the index does not name: {some(stray)}" if stray else "")
        )
    return entries


def check_names(
    have: Iterable[str], want: Iterable[str], where: str, *, optional: Callable[[str], bool] = lambda name: False
) -> None:
    """ValueError naming `where` unless the file's tensor names `have` are the model's `want`
    (names `optional` accepts may be present or absent: tensors the recipe drops)."""
    have, want = set(have), set(want)
    missing = sorted(name for name in want - have if not optional(name))
    unexpected = sorted(name for name in have - want if not optional(name))
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) of the model are in no file ({some(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) in the file(s) belong to no tensor of the model ({some(unexpected)})")
    if problems:
        raise ValueError(f"{where}: {'; '.join(problems)}: not the weights of this model")


def check_shapes(entries: dict[str, TensorEntry], shapes: dict[str, torch.Size], where: str) -> None:
    """ValueError naming the first tensor whose stored shape is not the model's."""
    for name, shape in shapes.items():
        if name in entries and entries[name].shape != tuple(shape):
            raise ValueError(
                f"{where}: {name} in {entries[name].file.name} has shape {entries[name].shape}, the model {tuple(shape)}"
            )


def read_tensors(
    entries: dict[str, TensorEntry], names: Iterable[str], where: str, *, dtype: torch.dtype | None
) -> dict[str, torch.Tensor]:
    """The named tensors, each checked finite (the error names it), floating ones cast to `dtype` (None: as stored)."""
    from safetensors import safe_open

    wanted = set(names)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted({entry.file for name, entry in entries.items() if name in wanted}):
        with safe_open(str(file), framework="pt") as handle:
            for name in sorted(wanted.intersection(handle.keys())):
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    bad = int((~torch.isfinite(tensor)).sum())
                    raise ValueError(f"{where}: {name} in {file.name} holds {bad:,} NaN or infinite value(s)")
                tensors[name] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    return tensors


def stored_dtype(entries: dict[str, TensorEntry], where: str) -> torch.dtype:
    """The one floating dtype the files store (an fp16 variant: float16); ValueError if they mix several."""
    names = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
    found = {entry.dtype for entry in entries.values() if entry.dtype in names}
    if len(found) != 1:
        raise ValueError(f"{where}: the files store {', '.join(sorted(found)) or 'no floating'} tensors, not one dtype to keep")
    return names[found.pop()]


def load_folder(
    cls: Any,
    folder: Path,
    field: str,
    *,
    variant: str | None = None,
    dtype: torch.dtype | None = torch.float32,
    optional: Callable[[str], bool] = lambda name: False,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config arguments, state dict) of the `cls` (a diffusers ModelMixin) in `folder`, read strictly
    (the module docstring's steps); tensors `optional` accepts may be absent (the caller drops them)."""
    where = f"{field} {folder}"
    arguments = read_config(folder, where)
    shapes = meta_shapes(cls, arguments, where)
    entries = tensor_headers(folder, f"{field}", variant=variant)
    check_names(entries, shapes, f"{where} ({_files(entries)})", optional=optional)
    check_shapes(entries, shapes, where)
    return arguments, read_tensors(entries, [name for name in shapes if name in entries], where, dtype=dtype)


def _files(entries: dict[str, TensorEntry]) -> str:
    files = sorted({entry.file.name for entry in entries.values()})
    return files[0] if len(files) == 1 else f"{len(files)} shards"


def parameter_count(entries: dict[str, TensorEntry]) -> int:
    """Elements in every tensor the headers list."""
    return sum(math.prod(entry.shape) for entry in entries.values())

"""Pretrained denoisers: where their weights are, and how they map onto a recipe's layout.

Every published try-on model fine-tunes a pretrained diffusion checkpoint, so a recipe's
denoiser starts from `model.denoiser.path`: a local diffusers folder, or a hub id that is
already in the local Hugging Face cache. Nothing is downloaded (training nodes are offline and
a run must not depend on the hub): a path that is not there is an error naming it. Weights are
read with diffusers' `from_pretrained(local_files_only=True, use_safetensors=True)`, never
from pickle.

A recipe may need a different layout from the checkpoint's. The one change the mapping covers
is declared here (`GROWABLE_INPUTS`): a first convolution whose input channels grow (SD1.5's 4
latent channels into the inpainting layout's 9) keeps the pretrained channels first and
zero-initialises the new ones, so the model computes what the checkpoint did at step 0, as
SD-inpainting and CatVTON were made. Tensors a recipe removes (CatVTON's cross-attention) are
dropped by name; any other mismatch is an error naming both shapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from drape.config.base import check_model_shape
from drape.jsonfile import read_json_object

SUBFOLDER = "unet"  # a pipeline folder (or hub repo) keeps its denoiser here
WEIGHTS = "diffusion_pytorch_model*.safetensors"  # one file, or shards beside an index
GROWABLE_INPUTS = ("conv_in.weight",)  # the tensors whose input channels (dim 1) may grow, new ones zero
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _diffusers_folder(directory: Path) -> Path | None:
    """`directory` if it holds a diffusers model's config.json, else its unet/ if that does."""
    for candidate in (directory, directory / SUBFOLDER):
        if (candidate / "config.json").is_file():
            return candidate
    return None


def _from_hub_cache(repo_id: str, cache_dir: str | Path | None) -> Path | None:
    """The cached snapshot folder of `repo_id`'s denoiser (unet/config.json, else config.json), if cached."""
    from huggingface_hub import try_to_load_from_cache

    for filename in (f"{SUBFOLDER}/config.json", "config.json"):
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir)
        if isinstance(found, str):
            return Path(found).parent
    return None


def resolve_denoiser(path: str, *, field: str = "model.denoiser.path", cache_dir: str | Path | None = None) -> Path:
    """The local folder holding the denoiser at `path` (a diffusers folder, a pipeline folder with
    unet/, or a hub id resolved from the local Hugging Face cache, `cache_dir` default the hub's)."""
    local = Path(path).expanduser()
    folder = _diffusers_folder(local) if local.exists() else None
    if folder is None and not local.exists() and _HUB_ID.fullmatch(path):
        folder = _from_hub_cache(path, cache_dir)
    if folder is None:
        raise ValueError(
            f"{field} {path}: no diffusers model there (expected a folder with config.json and {WEIGHTS}, "
            f"or with {SUBFOLDER}/, or a hub id already in the local Hugging Face cache); drape never downloads weights"
        )
    if not any(folder.glob(WEIGHTS)):
        raise ValueError(f"{field} {path}: {folder} has no {WEIGHTS} (drape reads safetensors only, never pickle)")
    return folder


def read_model_config(folder: Path) -> dict[str, Any]:
    """The constructor arguments in `folder`'s config.json (diffusers' `_`-prefixed metadata left out)."""
    return {k: v for k, v in read_json_object(folder / "config.json", "model config").items() if not k.startswith("_")}


def load_pretrained(cls: Any, folder: Path) -> Any:
    """`cls` (a diffusers ModelMixin class) with the weights in `folder`: local files, safetensors only;
    its config.json's shape is checked first (`check_model_shape`)."""
    check_model_shape(read_json_object(folder / "config.json", "model config"), str(folder / "config.json"))
    return cls.from_pretrained(folder, local_files_only=True, use_safetensors=True, low_cpu_mem_usage=False)


def widen_input_channels(weight: torch.Tensor, in_channels: int, *, name: str = "conv_in.weight") -> torch.Tensor:
    """`weight` (out, in, *kernel) grown to `in_channels` inputs: the pretrained channels first, unchanged,
    the new ones zero, so the new inputs change nothing until training moves them. Fewer inputs than the
    checkpoint's is an error: dropping channels would silently change what the pretrained model computes."""
    have = weight.shape[1]
    if in_channels < have:
        raise ValueError(
            f"{name}: the checkpoint has {have} input channels, the recipe {in_channels}: the mapping only grows them"
        )
    grown = weight.new_zeros((weight.shape[0], in_channels, *weight.shape[2:]))
    grown[:, :have] = weight
    return grown


def map_pretrained(
    pretrained: dict[str, torch.Tensor],
    wanted: dict[str, torch.Tensor],
    *,
    dropped: Callable[[str], bool] = lambda name: False,
) -> dict[str, torch.Tensor]:
    """The state dict to load into a recipe's module (`wanted`: its own state dict, for names and
    shapes) from a checkpoint's: equal shapes as they are, `GROWABLE_INPUTS` widened, checkpoint
    tensors the recipe removes (`dropped`) left out. Anything else is an error naming both shapes."""
    missing = sorted(set(wanted) - set(pretrained))
    unexpected = sorted(name for name in set(pretrained) - set(wanted) if not dropped(name))
    if missing or unexpected:
        raise ValueError(
            f"the checkpoint does not fit the recipe: missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    return {name: _fit(name, pretrained[name], target.shape) for name, target in wanted.items()}


def _fit(name: str, tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if tensor.shape == shape:
        return tensor
    grows = (
        name in GROWABLE_INPUTS and tensor.dim() == len(shape) and tensor.shape[:1] + tensor.shape[2:] == shape[:1] + shape[2:]
    )
    if grows and tensor.shape[1] < shape[1]:
        return widen_input_channels(tensor, shape[1], name=name)
    raise ValueError(
        f"{name}: checkpoint shape {tuple(tensor.shape)}, recipe shape {tuple(shape)}; the declared mapping only "
        f"grows the input channels of {', '.join(GROWABLE_INPUTS)}"
    )

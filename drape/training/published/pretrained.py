"""Pretrained denoisers: where their weights are, and how they map onto a recipe's layout.

Every published try-on model fine-tunes a pretrained diffusion checkpoint, so a recipe's
denoiser starts from `model.denoiser.path`: a local diffusers folder (its weights one file, a
`variant` such as fp16, or shards beside an index), a hub id that is already in the local
Hugging Face cache, or CatVTON's attention-only release over the diffusers folder
`model.denoiser.base` (drape.training.published.catvton_release). Nothing is downloaded (training nodes are
offline and a run must not depend on the hub): a path that is not there is an error naming it.
Weights are read strictly by drape.training.published.weights (safetensors only, every tensor from a file,
finite, the config bounded before anything is allocated), never with diffusers' lenient
`from_pretrained`, never from pickle.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from diffusers import UNet2DConditionModel

from drape.training.published.catvton_release import RELEASE_FILE, is_release, release_file, release_versions
from drape.training.published.weights import load_folder, meta_shapes, read_config, tensor_headers

if TYPE_CHECKING:
    from drape.config.training import DenoiserConfig

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


def resolve_denoiser(
    path: str, *, field: str = "model.denoiser.path", cache_dir: str | Path | None = None, variant: str | None = None
) -> Path:
    """The local folder holding the denoiser at `path` (a diffusers folder, a pipeline folder with
    unet/, or a hub id resolved from the local Hugging Face cache, `cache_dir` default the hub's),
    its weight files checked from their headers (`drape.training.published.weights.tensor_headers`: the
    variant's file or every shard of its index; pickles refused by name)."""
    local = Path(path).expanduser()
    folder = _diffusers_folder(local) if local.exists() else None
    if folder is None and not local.exists() and _HUB_ID.fullmatch(path):
        folder = _from_hub_cache(path, cache_dir)
    if folder is None:
        raise ValueError(
            f"{field} {path}: no diffusers model there (expected a folder with config.json and {WEIGHTS}, "
            f"or with {SUBFOLDER}/, or a hub id already in the local Hugging Face cache, or CatVTON's release "
            f"layout {RELEASE_FILE} with model.denoiser.base); drape never downloads weights"
        )
    tensor_headers(folder, field, variant=variant)
    return folder


@dataclass(frozen=True)
class DenoiserSource:
    """Where a recipe's UNet comes from: a diffusers folder, and CatVTON's attention-only release over it."""

    unet: Path
    release: Path | None = None


def resolve_source(denoiser: DenoiserConfig, *, cache_dir: str | Path | None = None) -> DenoiserSource:
    """`model.denoiser`'s weights: `path` a diffusers folder (or hub id), or a CatVTON release
    (`attention/model.safetensors`) over the diffusers folder `base`."""
    assert denoiser.path is not None
    local = Path(denoiser.path).expanduser()
    if local.is_dir() and (is_release(local) or release_versions(local)):
        release_file(local, "model.denoiser.path")
        if denoiser.base is None:
            raise ValueError(
                f"model.denoiser.path {denoiser.path} is CatVTON's attention-only release ({RELEASE_FILE}): set "
                "model.denoiser.base to the UNet it goes over (SD1.5-inpainting's unet/)"
            )
        base = resolve_denoiser(denoiser.base, field="model.denoiser.base", cache_dir=cache_dir, variant=denoiser.variant)
        return DenoiserSource(base, local)
    if denoiser.base is not None:
        raise ValueError(
            f"model.denoiser.base is read only under a CatVTON release at model.denoiser.path; {denoiser.path} is not one "
            f"(no {RELEASE_FILE.parent}/ there)"
        )
    return DenoiserSource(resolve_denoiser(denoiser.path, cache_dir=cache_dir, variant=denoiser.variant))


def is_mounted(path: str, *, cache_dir: str | Path | None = None) -> bool:
    """Whether `path` is there at all: a local path, or a hub id in the local cache. The queue's estimate
    runs where the weights are not mounted and may fall back to a built-in shape only then."""
    if Path(path).expanduser().exists():
        return True
    return bool(_HUB_ID.fullmatch(path)) and _from_hub_cache(path, cache_dir) is not None


def read_model_config(folder: Path, field: str = "model.denoiser.path") -> dict[str, Any]:
    """The constructor arguments in `folder`'s config.json, bounded (values by `check_model_shape`,
    the UNet it builds counted on the meta device) before anything is allocated."""
    arguments = read_config(folder, f"{field} {folder}")
    meta_shapes(UNet2DConditionModel, arguments, f"{field} {folder / 'config.json'}")
    return arguments


def load_unet(folder: Path, *, variant: str | None, dropped: Callable[[str], bool], field: str) -> dict[str, torch.Tensor]:
    """The UNet2DConditionModel weights in `folder`, strictly (`drape.training.published.weights.load_folder`),
    upcast to float32 (the recipe trains fp32 master weights); tensors the recipe drops may be absent."""
    return load_folder(UNet2DConditionModel, folder, field, variant=variant, dtype=torch.float32, optional=dropped)[1]


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

"""Where a config's pretrained weights come from, said plainly for `drape model describe`.

`drape model describe` counts the model built on the meta device. Where `model.denoiser.path` or
`model.vae.path` is on this machine that build reads its config.json, and this module adds what
the weight files themselves hold (tensors and parameters from the safetensors headers, a CatVTON
release's keys mapped onto the UNet); where a path is not here at all (the weights are mounted on
the GPU nodes only) the count is the recipe's built-in shape or the config's fields, and the
line says so and names the path it could not read. A path that is here but wrong is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel

from drape.training.published.catvton_release import RELEASE_FILE, RELEASED, release_names
from drape.training.published.weights import (
    TensorEntry,
    check_names,
    check_shapes,
    meta_shapes,
    parameter_count,
    read_config,
    tensor_headers,
)

if TYPE_CHECKING:
    from drape.config import PipelineConfig


def _millions(count: int) -> str:
    return f"{count / 1e6:,.2f} M"


def _check(entries: dict[str, TensorEntry], shapes: dict[str, torch.Size], where: str) -> None:
    from drape.training.recipes.catvton import is_cross_attention

    check_names(entries, shapes, where, optional=is_cross_attention)
    check_shapes(entries, shapes, where)


def denoiser_lines(config: PipelineConfig) -> list[str]:
    """What `model.denoiser` (catvton) reads, or why the shown shape is not its files'."""
    from drape.training.published.pretrained import is_mounted, resolve_source
    from drape.training.recipes.catvton import remove_cross_attention, unet_arguments

    denoiser = config.model.denoiser
    shape = "model.denoiser.config" if denoiser.config else "the recipe's built-in shape (SD1.5-inpainting's UNet)"
    if denoiser.path is None:
        return [f"model.denoiser: no path set: random weights shaped by {shape}"]
    if not is_mounted(denoiser.path):
        return [f"model.denoiser.path {denoiser.path}: could not read it (not on this machine): shown is {shape}, not its files"]
    source = resolve_source(denoiser)
    entries = tensor_headers(source.unet, "model.denoiser", variant=denoiser.variant)
    _check(entries, meta_shapes(UNet2DConditionModel, unet_arguments(denoiser, source), str(source.unet)), str(source.unet))
    lines = [
        f"model.denoiser: {source.unet}: its config.json; {len(entries)} tensors, {_millions(parameter_count(entries))} "
        "in its safetensors headers, names and shapes the UNet's (the recipe drops the cross-attention)"
    ]
    if source.release is not None:
        with torch.device("meta"):
            unet = UNet2DConditionModel.from_config(unet_arguments(denoiser, source))
        remove_cross_attention(unet)
        file = source.release / RELEASE_FILE
        release = tensor_headers(file.parent, "model.denoiser.path", stem=file.stem)
        names = release_names(unet)
        check_names(release, names, str(file))
        parameters = dict(unet.named_parameters())
        check_shapes(release, {key: parameters[name].shape for key, name in names.items()}, str(file))
        lines.append(
            f"  over it, CatVTON's release {file}: {len(release)} tensors, {_millions(parameter_count(release))}, "
            f"every key mapped onto the UNet's {len(names) // len(RELEASED)} self-attention modules, shapes equal"
        )
    return lines


def vae_lines(config: PipelineConfig) -> list[str]:
    """What `model.vae` (latent kinds) reads, or why the shown shape is not its files'."""
    vae = config.model.vae
    if vae.path is None:
        return ["model.vae: no path set: a fresh VAE shaped by model.vae's fields"]
    if not Path(vae.path).exists():
        return [f"model.vae.path {vae.path}: could not read it (not on this machine): shown is model.vae's fields, not its files"]
    entries = tensor_headers(Path(vae.path), "model.vae", variant=vae.variant)
    _check(entries, meta_shapes(AutoencoderKL, read_config(Path(vae.path), vae.path), vae.path), vae.path)
    return [
        f"model.vae: {vae.path}: its config.json; {len(entries)} tensors, {_millions(parameter_count(entries))} "
        "in its safetensors headers, names and shapes the AutoencoderKL's"
    ]


def weight_lines(config: PipelineConfig) -> list[str]:
    """Every line above that applies to the config's model (none for pixel-space or outside models)."""
    if config.model.class_ is not None or not config.model.latent:
        return []
    return (denoiser_lines(config) if config.model.kind == "catvton" else []) + vae_lines(config)

"""Exporting a stage's result in the layouts the field loads: CatVTON's release and diffusers folders.

`drape model export` writes a checkpoint's `catvton` model out for tools outside drape:

- `catvton`: `OUT/attention/model.safetensors`, CatVTON's release layout (drape.training.published.catvton_release),
  what CatVTON's own pipeline loads over SD1.5-inpainting's UNet, and what `model.denoiser.path`
  (with `model.denoiser.base`) and `drape train --init` read back.
- `diffusers`: `OUT/unet/` and `OUT/vae/`, each a diffusers `save_pretrained` folder (config.json +
  safetensors). The UNet holds no cross-attention (CatVTON has none): drape reads it back with
  `model.denoiser.path: OUT` and `model.vae.path: OUT/vae`; diffusers' own `from_pretrained` would
  initialise the missing attn2 tensors at random, so outside drape skip the cross-attention as
  CatVTON's `SkipAttnProcessor` does.

Each is written to a temporary folder, read back through drape's strict readers and compared bit for
bit with the model, and only then renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel

from drape.training.published.catvton_release import read_release, write_release
from drape.training.published.weights import load_folder
from drape.training.recipes.catvton import is_cross_attention

FORMATS = ("catvton", "diffusers")


def _same(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor], what: str) -> int:
    """The tensors compared; ValueError naming the first that differs (names, dtype or any bit)."""
    if set(expected) != set(got):
        raise ValueError(f"{what}: read back {len(got)} tensors, wrote {len(expected)}")
    for name, tensor in expected.items():
        if got[name].dtype != tensor.dtype or not torch.equal(got[name], tensor):
            raise ValueError(f"{what}: {name} read back differs from what was written")
    return len(expected)


def _write_catvton(model: Any, folder: Path) -> int:
    write_release(model.unet, folder)
    written = read_release(folder, model.unet, "export")
    state = model.unet.state_dict()
    return _same({name: state[name] for name in written}, written, f"{folder}: the CatVTON release")


def _write_diffusers(model: Any, folder: Path) -> int:
    model.unet.save_pretrained(folder / "unet", safe_serialization=True)
    model.vae.save_pretrained(folder / "vae", safe_serialization=True)
    _, unet = load_folder(UNet2DConditionModel, folder / "unet", "export unet", dtype=None, optional=is_cross_attention)
    checked = _same(model.unet.state_dict(), unet, "unet")
    _, vae = load_folder(AutoencoderKL, folder / "vae", "export vae", dtype=None)
    return checked + _same(model.vae.state_dict(), vae, "vae")


def export_model(model: Any, out: Path, fmt: str) -> int:
    """`model` (a `catvton` model) written to `out` in `fmt` (`FORMATS`), verified by reading it back
    bit for bit before it is renamed into place; returns the tensors verified."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if type(model).__name__ != "CatVTON":
        raise ValueError(f"the checkpoint holds {type(model).__name__}; export writes the catvton recipe's layouts")
    temporary = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    try:
        verified = _write_catvton(model, temporary) if fmt == "catvton" else _write_diffusers(model, temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    temporary.rename(out)
    return verified

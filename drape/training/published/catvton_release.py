"""CatVTON's released weights: the attention-only file over a base UNet, read strictly and written back.

CatVTON (github.com/Zheng-Chong/CatVTON) releases only what it trains, the UNet's self-attention,
as `<version>/attention/model.safetensors` (versions `RELEASE_VERSIONS`), to be loaded over
SD1.5-inpainting's UNet. Its pipeline collects, in `named_modules()` order, every module whose
name contains "attn1" into one `nn.ModuleList` (model/utils.py `get_trainable_module(unet,
"attention")`) and loads the file into that list with accelerate's `load_checkpoint_in_model`.
Each self-attention contributes `ENTRIES_PER_ATTENTION` entries to the list: the attention
itself, to_q, to_k, to_v, to_out, to_out.0, to_out.1 (dropout) and its processor (CatVTON's
`AttnProcessor2_0` is an `nn.Module`). The list shares each Linear between two names (`0.to_q.weight`
and `1.weight`); the file keeps the first, so it holds, for the i-th self-attention,
`{8i}.to_q.weight`, `{8i}.to_k.weight`, `{8i}.to_v.weight`, `{8i}.to_out.0.weight` and
`{8i}.to_out.0.bias` (80 tensors, 49,574,080 parameters at SD1.5's shape; CatVTON issue #109
lists the aliases the file lacks: `1.weight`, `4.0.weight`, `5.bias`, ... `125.weight`).

The order is UNet2DConditionModel's registration order (`BLOCK_ORDER`: the down blocks, then the
up blocks, then the mid block; fixed here, not read from diffusers, so a diffusers release that
registers its blocks otherwise cannot silently permute the weights). Reading maps every key to a
drape parameter name and checks that every key maps, every attn1 parameter is covered, every
shape matches and every value is finite.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from drape.training.published.weights import PICKLE_SUFFIXES, check_names, check_shapes, read_tensors, some, tensor_headers

RELEASE_FILE = Path("attention") / "model.safetensors"
RELEASE_VERSIONS = ("mix-48k-1024", "vitonhd-16k-512", "dresscode-16k-512")  # sub-folders of the hub repo
ENTRIES_PER_ATTENTION = 8  # attn1, to_q, to_k, to_v, to_out, to_out.0, to_out.1, processor
RELEASED = ("to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight", "to_out.0.bias")
BLOCK_ORDER = ("down_blocks", "up_blocks", "mid_block")
_SELF_ATTENTION = re.compile(
    r"(down_blocks|up_blocks|mid_block)((?:\.\d+)?)\.attentions\.(\d+)\.transformer_blocks\.(\d+)\.attn1"
)


def is_release(folder: str | Path) -> bool:
    """Whether `folder` is one CatVTON release version (it holds attention/, with or without the file)."""
    return (Path(folder) / RELEASE_FILE.parent).is_dir() and not (Path(folder) / "config.json").is_file()


def release_versions(folder: str | Path) -> list[str]:
    """The CatVTON release versions under a hub snapshot folder (mix-48k-1024/attention/...)."""
    return [name for name in RELEASE_VERSIONS if is_release(Path(folder) / name)]


def self_attentions(unet: nn.Module) -> list[str]:
    """The UNet's self-attention modules (`...attn1`), in CatVTON's order (`BLOCK_ORDER`, then indices)."""
    found = []
    for name, _ in unet.named_modules():
        match = _SELF_ATTENTION.fullmatch(name)
        if match:
            block, level, attention, layer = match.groups()
            found.append(((BLOCK_ORDER.index(block), int(level[1:] or 0), int(attention), int(layer)), name))
    return [name for _, name in sorted(found)]


def release_names(unet: nn.Module, prefix: str = "") -> dict[str, str]:
    """Release key → the UNet's parameter name (`prefix` before it): every key the file must hold."""
    return {
        f"{ENTRIES_PER_ATTENTION * i}.{tensor}": f"{prefix}{module}.{tensor}"
        for i, module in enumerate(self_attentions(unet))
        for tensor in RELEASED
    }


def release_file(folder: Path, field: str) -> Path:
    """`folder`/attention/model.safetensors; ValueError naming the field, the folder and what is there."""
    file = folder / RELEASE_FILE
    if file.is_file():
        return file
    versions = release_versions(folder)
    if versions:
        raise ValueError(f"{field} {folder}: holds {len(versions)} CatVTON releases ({', '.join(versions)}): name one of them")
    stored = sorted(p.name for p in file.parent.iterdir()) if file.parent.is_dir() else []
    pickles = [name for name in stored if Path(name).suffix in PICKLE_SUFFIXES]
    why = (
        f"only pickle weights ({some(pickles)}): drape reads safetensors only and never unpickles" if pickles else "no such file"
    )
    raise ValueError(f"{field} {folder}: expected CatVTON's release layout {RELEASE_FILE}; {why}")


def read_release(folder: Path, unet: nn.Module, field: str) -> dict[str, torch.Tensor]:
    """The release's tensors under `unet`'s parameter names, read strictly: the file holds exactly the
    keys of `release_names` (missing and unexpected ones named), shapes equal, values finite, cast to
    the UNet's dtype."""
    file = release_file(folder, field)
    where = f"{field} {file}"
    entries = tensor_headers(file.parent, field, stem=file.name.removesuffix(".safetensors"))
    names = release_names(unet)
    check_names(entries, names, where)
    parameters = dict(unet.named_parameters())
    check_shapes(entries, {key: parameters[name].shape for key, name in names.items()}, where)
    dtype = next(iter(parameters.values())).dtype
    tensors = read_tensors(entries, names, where, dtype=dtype)
    return {names[key]: tensor for key, tensor in tensors.items()}


def load_release(unet: nn.Module, folder: Path, field: str) -> int:
    """The release in `folder` over `unet`'s self-attention; returns the tensors it replaced."""
    tensors = read_release(folder, unet, field)
    result = unet.load_state_dict(tensors, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # release_names are the UNet's own names
    return len(tensors)


def release_tensors(unet: nn.Module) -> dict[str, torch.Tensor]:
    """`unet`'s self-attention under CatVTON's release keys (contiguous copies, ready to save)."""
    state = unet.state_dict()
    return {key: state[name].detach().contiguous().clone() for key, name in release_names(unet).items()}


def write_release(unet: nn.Module, folder: Path) -> Path:
    """`unet`'s self-attention as CatVTON releases it: `folder`/attention/model.safetensors."""
    file = folder / RELEASE_FILE
    file.parent.mkdir(parents=True, exist_ok=True)
    save_file(release_tensors(unet), str(file), metadata={"format": "pt"})
    return file

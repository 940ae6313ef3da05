"""Strict reading of pretrained weights (drape/training/published/weights.py): a diffusers folder loads the
same tensors as one file, as an fp16 variant and as shards; and each way the field's files go
wrong is refused by name before anything is built: tensors missing or foreign, NaN, a missing
or escaping shard, a variant not asked for, pickles (never unpickled), a config beyond any
machine (the UNet's and the VAE's), and `drape model describe` says which files it read."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import yaml
from diffusers import AutoencoderKL, UNet2DConditionModel
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from drape.config.reading.extends import deep_merge
from drape.config.training import VaeConfig
from drape.training.published.pretrained import load_unet, resolve_denoiser
from drape.training.published.weights import MAX_PARAMETERS, tensor_headers
from drape.training.recipes.catvton import is_cross_attention
from drape.training.recipes.latent import load_vae, vae_config
from tests.conftest import TINY, TINY_UNET

TINY_VAE = {"latent_channels": 4, "block_out_channels": [8, 16], "layers_per_block": 1, "norm_num_groups": 4}


def _unet(seed: int = 3) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(**TINY_UNET)


def _load(folder: Path, variant: str | None = None) -> dict[str, torch.Tensor]:
    return load_unet(folder, variant=variant, dropped=is_cross_attention, field="model.denoiser.path")


def test_one_file_an_fp16_variant_and_shards_load_the_same_tensors(tmp_path):
    unet = _unet()
    unet.save_pretrained(tmp_path / "plain")
    unet.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    expected = {name: tensor.clone() for name, tensor in unet.state_dict().items()}
    unet.half().save_pretrained(tmp_path / "fp16", variant="fp16")
    plain, sharded = _load(tmp_path / "plain"), _load(tmp_path / "sharded")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2  # really sharded
    assert plain.keys() == sharded.keys() == expected.keys()
    assert all(torch.equal(plain[n], expected[n]) and torch.equal(sharded[n], expected[n]) for n in expected)
    fp16 = _load(tmp_path / "fp16", variant="fp16")  # upcast to the recipe's float32
    assert all(fp16[n].dtype == torch.float32 and torch.equal(fp16[n], expected[n].half().float()) for n in expected)
    with pytest.raises(ValueError, match=r"only diffusion_pytorch_model.fp16.safetensors: set model.denoiser.variant: fp16"):
        resolve_denoiser(str(tmp_path / "fp16"))


def test_a_file_holding_other_tensors_is_refused_naming_them_and_the_file(tmp_path):
    unet = _unet()
    unet.save_pretrained(tmp_path / "unet")
    weights = tmp_path / "unet" / "diffusion_pytorch_model.safetensors"
    attention = {
        n.replace("down_blocks.0.attentions.0.transformer_blocks.0.attn1.", "0."): t for n, t in unet.state_dict().items()
    }
    attention = {n: t.contiguous() for n, t in attention.items() if n.startswith("0.")}
    save_file(attention, str(weights))  # CatVTON's attention file where the UNet's weights belong
    count = len(unet.state_dict()) - sum(is_cross_attention(n) for n in unet.state_dict())
    with pytest.raises(
        ValueError, match=rf"{count} tensor\(s\) of the model are in no file \(conv_in.bias, .* and {count - 5} more\); "
    ):
        _load(tmp_path / "unet")
    with pytest.raises(ValueError, match=r"5 tensor\(s\) in the file\(s\) belong to no tensor of the model \(0.to_k.weight"):
        _load(tmp_path / "unet")


def test_nan_and_wrong_shapes_are_refused_naming_the_tensor(tmp_path):
    unet = _unet()
    unet.save_pretrained(tmp_path / "unet")
    weights = tmp_path / "unet" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state["conv_out.bias"] = torch.tensor([0.0, float("nan"), float("inf"), 1.0])
    save_file(state, str(weights))
    with pytest.raises(ValueError, match=r"conv_out.bias in diffusion_pytorch_model.safetensors holds 2 NaN or infinite"):
        _load(tmp_path / "unet")
    state["conv_out.bias"] = torch.zeros(5)
    save_file(state, str(weights))
    with pytest.raises(
        ValueError, match=r"conv_out.bias in diffusion_pytorch_model.safetensors has shape \(5,\), the model \(4,\)"
    ):
        _load(tmp_path / "unet")


def test_every_shard_the_index_names_must_be_there_in_its_folder_holding_its_tensors(tmp_path):
    _unet().save_pretrained(tmp_path / "unet", max_shard_size="40KB")
    index_file = tmp_path / "unet" / "diffusion_pytorch_model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shards = sorted(set(index["weight_map"].values()))
    moved = tmp_path / "unet" / shards[-1]
    moved.rename(tmp_path / "elsewhere.safetensors")
    with pytest.raises(ValueError, match=rf"1 shard\(s\) it names are not in .*unet: {shards[-1]}"):
        tensor_headers(tmp_path / "unet", "model.denoiser.path")
    (tmp_path / "elsewhere.safetensors").rename(moved)
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index_file.write_text(json.dumps({"weight_map": {**index["weight_map"], name: shards[1]}}))
    with pytest.raises(
        ValueError,
        match=rf"{shards[0]}: does not hold what its index maps to it; 1 tensor\(s\) the index does not name: {name}",
    ):
        tensor_headers(tmp_path / "unet", "model.denoiser.path")
    index_file.write_text(json.dumps({"weight_map": {**index["weight_map"], name: "../elsewhere.safetensors"}}))
    with pytest.raises(
        ValueError, match=r"shard '../elsewhere.safetensors' is not a .safetensors file name in the index's own folder"
    ):
        tensor_headers(tmp_path / "unet", "model.denoiser.path")


def test_pickles_are_refused_by_name_and_never_unpickled(tmp_path, monkeypatch):
    torch.manual_seed(0)
    vae = AutoencoderKL(**{**vae_config(VaeConfig(**TINY_VAE), 32)})
    vae.save_pretrained(tmp_path / "vae", safe_serialization=False)
    _unet().save_pretrained(tmp_path / "unet", safe_serialization=False)

    def never(*args, **kwargs):
        raise AssertionError("a pickle was opened")

    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(
        ValueError,
        match=r"model.vae.path: .*vae has no diffusion_pytorch_model.safetensors, only pickle weights \(diffusion_pytorch_model",
    ):
        load_vae(vae, VaeConfig(**TINY_VAE, path=str(tmp_path / "vae")))
    with pytest.raises(
        ValueError, match=r"only pickle weights \(diffusion_pytorch_model.bin\): drape reads safetensors only and never unpickles"
    ):
        resolve_denoiser(str(tmp_path / "unet"))


def test_a_vae_variant_is_upcast_or_kept_as_the_recipe_says(tmp_path):
    torch.manual_seed(0)
    vae = AutoencoderKL(**vae_config(VaeConfig(**TINY_VAE), 32))
    vae.half().save_pretrained(tmp_path / "vae", variant="fp16")
    stored = {n: t.clone() for n, t in vae.state_dict().items()}
    for weights_dtype, dtype in (("float32", torch.float32), ("stored", torch.float16)):
        fresh = AutoencoderKL(**vae_config(VaeConfig(**TINY_VAE), 32))
        load_vae(fresh, VaeConfig(**TINY_VAE, path=str(tmp_path / "vae"), variant="fp16", weights_dtype=weights_dtype))
        loaded = fresh.state_dict()
        assert all(loaded[n].dtype == dtype and torch.equal(loaded[n].half(), stored[n]) for n in stored)


def test_configs_beyond_any_machine_are_refused_before_anything_is_built(tmp_path, monkeypatch):
    _unet().save_pretrained(tmp_path / "unet")
    config_file = tmp_path / "unet" / "config.json"
    config = json.loads(config_file.read_text())
    built: list[str] = []
    original = UNet2DConditionModel.__init__

    @functools.wraps(original)  # diffusers reads the constructor's signature
    def counting(self, *args, **kwargs):
        built.append(str(torch.empty(0).device))
        original(self, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "__init__", counting)
    config_file.write_text(json.dumps({**config, "block_out_channels": [1000000] * 4}))
    with pytest.raises(ValueError, match=r"config.json: block_out_channels: 1e\+06 is beyond any machine"):
        _load(tmp_path / "unet")
    config_file.write_text(json.dumps({**config, "block_out_channels": [131072] * 4, "norm_num_groups": 32}))
    with pytest.raises(
        ValueError, match=rf"a UNet2DConditionModel of [\d,]+ parameters, beyond any try-on model \(at most {MAX_PARAMETERS:,}\)"
    ):
        _load(tmp_path / "unet")
    assert built == ["meta"]  # only the meta-device count ran: nothing was allocated
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [1000000, 1000000], "latent_channels": 4}))
    with pytest.raises(ValueError, match=r"model.vae.path .*vae/config.json: block_out_channels: 1e\+06 is beyond any machine"):
        vae_config(VaeConfig(path=str(tmp_path / "vae")), 32)


def _describe(tmp_path: Path, model: dict) -> str:
    """`drape model describe` of the tiny config with `model`: its exit code and output, lines unwrapped."""
    from drape.cli import app

    data = deep_merge(yaml.safe_load(TINY.read_text()), {"paths": {"root": str(tmp_path / "drape")}, "model": model})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["model", "describe", "--config", str(tmp_path / "config.yaml")], env={"COLUMNS": "300"})
    return f"exit {result.exit_code} " + " ".join(result.output.split())


def test_describe_reads_the_files_or_says_plainly_it_could_not(tmp_path):
    unet = _unet()
    unet.save_pretrained(tmp_path / "unet")
    count = sum(t.numel() for t in unet.state_dict().values())
    model = {"kind": "catvton", "vae": TINY_VAE, "denoiser": {"path": str(tmp_path / "unet")}}
    shown = _describe(tmp_path, model)
    assert (
        shown.startswith("exit 0")
        and f"{len(unet.state_dict())} tensors, {count / 1e6:,.2f} M in its safetensors headers" in shown
    )
    assert "model.vae: no path set: a fresh VAE shaped by model.vae's fields" in shown
    shown = _describe(tmp_path, {**model, "denoiser": {"path": str(tmp_path / "not-mounted")}})
    assert shown.startswith("exit 0") and "815.57 M" in shown  # the built-in SD1.5-inpainting shape, and it says so:
    assert (
        f"model.denoiser.path {tmp_path / 'not-mounted'}: could not read it (not on this machine): shown is the recipe's" in shown
    )
    (tmp_path / "unet" / "config.json").write_text(json.dumps({**unet.config, "block_out_channels": [1000000] * 4}))
    shown = _describe(tmp_path, model)
    assert shown.startswith("exit 2") and "block_out_channels: 1e+06 is beyond any machine" in shown and "978" not in shown

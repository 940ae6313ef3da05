"""CatVTON's released weights (drape/training/published/catvton_release.py, drape/training/checkpoints/export.py): the
attention-only file CatVTON's own code saves and loads maps key for key onto the recipe's UNet
(checked against a reference built the way CatVTON's pipeline builds it), loads through
`model.denoiser.path` and `drape train --init`, is refused by name when it does not fit, and a
stage's result exported as a release or as diffusers folders reads back bit for bit."""

from __future__ import annotations

import pytest
import torch
from diffusers import UNet2DConditionModel
from diffusers.models.attention_processor import AttnProcessor2_0
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from drape.training.checkpoints.checkpoint import save_checkpoint
from drape.training.loop.state import _start_model
from drape.training.published.catvton_release import RELEASE_FILE, release_names
from drape.training.recipes.catvton import SD15_INPAINTING_UNET, remove_cross_attention
from drape.training.recipes.model import build_model
from tests.conftest import TINY_UNET, tiny_config

TINY_VAE = {"latent_channels": 4, "block_out_channels": [8, 16], "layers_per_block": 1, "norm_num_groups": 4}


class _ModuleProcessor(torch.nn.Module):
    """As CatVTON's model/attn_processor.py AttnProcessor2_0: an nn.Module, so it is one of the
    modules named "...attn1..." that its get_trainable_module(unet, "attention") collects."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
        return AttnProcessor2_0()(attn, hidden_states, encoder_hidden_states, attention_mask, temb)


def _catvtons_own_file(unet: UNet2DConditionModel, file) -> dict[str, torch.Tensor]:
    """The release file as CatVTON makes it: every module whose name holds "attn1" in one ModuleList,
    its state dict saved with shared tensors under their first name (as accelerate's save does)."""
    unet.set_attn_processor({name: _ModuleProcessor() for name in unet.attn_processors})
    attention = torch.nn.ModuleList([module for name, module in unet.named_modules() if "attn1" in name])
    first: dict[int, tuple[str, torch.Tensor]] = {}
    for key, tensor in attention.state_dict().items():
        first.setdefault(tensor.data_ptr(), (key, tensor))
    tensors = {key: tensor.clone() for key, tensor in first.values()}
    file.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(file))
    return tensors


def _base(tmp_path, seed: int = 7) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**TINY_UNET)
    unet.save_pretrained(tmp_path / "base" / "unet")
    return unet


def _config(tmp_path, denoiser: dict):
    return tiny_config(tmp_path / "drape", model={"kind": "catvton", "vae": TINY_VAE, "denoiser": denoiser})


def test_catvtons_file_maps_key_for_key_onto_the_recipes_self_attention(tmp_path):
    torch.manual_seed(1)
    trained = UNet2DConditionModel(**TINY_UNET)  # CatVTON's fine-tuned UNet: its attn1 weights are the release
    saved = _catvtons_own_file(trained, tmp_path / "mix-48k-1024" / RELEASE_FILE)
    assert sorted(saved)[:5] == ["0.to_k.weight", "0.to_out.0.bias", "0.to_out.0.weight", "0.to_q.weight", "0.to_v.weight"]
    _base(tmp_path)
    model = build_model(_config(tmp_path, {"path": str(tmp_path / "mix-48k-1024"), "base": str(tmp_path / "base")}))
    names = release_names(model.unet)
    assert set(names) == set(saved)  # every key of CatVTON's file maps, and nothing else is asked for
    state, reference = model.unet.state_dict(), trained.state_dict()
    assert all(torch.equal(state[name], saved[key]) for key, name in names.items())
    base = UNet2DConditionModel.from_pretrained(tmp_path / "base" / "unet").state_dict()
    untouched = [n for n in state if ".attn1." not in n]
    assert untouched and all(torch.equal(state[n], base[n]) for n in untouched)  # the rest is the base's
    assert all(torch.equal(state[n], reference[n]) for n in state if ".attn1." in n)


def test_a_release_that_does_not_fit_is_refused_by_name(tmp_path):
    torch.manual_seed(1)
    saved = _catvtons_own_file(UNet2DConditionModel(**TINY_UNET), tmp_path / "rel" / RELEASE_FILE)
    _base(tmp_path)
    base = str(tmp_path / "base")
    with pytest.raises(ValueError, match=r"CatVTON's attention-only release .*: set model.denoiser.base"):
        build_model(_config(tmp_path, {"path": str(tmp_path / "rel")}))
    file = tmp_path / "rel" / RELEASE_FILE
    cases = [
        (
            {k: v for k, v in saved.items() if k != "120.to_v.weight"},
            r"1 tensor\(s\) of the model are in no file \(120.to_v.weight\)",
        ),
        (
            {**saved, "1.weight": saved["0.to_q.weight"].clone()},
            r"1 tensor\(s\) in the file\(s\) belong to no tensor .*\(1.weight\)",
        ),
        (
            {**saved, "8.to_q.weight": torch.zeros(3, 3)},
            r"8.to_q.weight in model.safetensors has shape \(3, 3\), the model \(8, 8\)",
        ),
        ({**saved, "0.to_out.0.bias": torch.full((8,), float("nan"))}, r"0.to_out.0.bias in model.safetensors holds 8 NaN"),
    ]
    for tensors, refusal in cases:
        save_file(tensors, str(file))
        with pytest.raises(ValueError, match=refusal):
            build_model(_config(tmp_path, {"path": str(tmp_path / "rel"), "base": base}))
    (tmp_path / "hub" / "mix-48k-1024" / "attention").mkdir(parents=True)
    (tmp_path / "hub" / "vitonhd-16k-512" / "attention").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds 2 CatVTON releases \(mix-48k-1024, vitonhd-16k-512\): name one of them"):
        build_model(_config(tmp_path, {"path": str(tmp_path / "hub"), "base": base}))


def test_full_size_counts_on_the_meta_device():
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(SD15_INPAINTING_UNET)
    remove_cross_attention(unet)
    names = release_names(unet)
    parameters = dict(unet.named_parameters())
    assert len(names) == 80 and max(int(key.split(".")[0]) for key in names) == 120  # 16 self-attentions, 8 apart
    assert sum(parameters[name].numel() for name in names.values()) == 49_574_080  # CatVTON's 49.57 M trainable
    assert set(names.values()) == {name for name in parameters if ".attn1." in name}


def test_export_reads_back_bit_for_bit_and_train_init_starts_from_a_release(tmp_path):
    _base(tmp_path)
    config = _config(tmp_path, {"path": str(tmp_path / "base")})
    model = build_model(config)
    with torch.no_grad():  # a stage's training moved the self-attention
        for name, parameter in model.unet.named_parameters():
            if ".attn1." in name:
                parameter.add_(torch.randn_like(parameter))
    checkpoint = save_checkpoint(tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[], ema=None, manifest={})
    from drape.cli import app

    expected = model.state_dict()
    for fmt in ("catvton", "diffusers"):
        result = CliRunner().invoke(
            app, ["model", "export", "--checkpoint", str(checkpoint), "--format", fmt, "--out", str(tmp_path / fmt)]
        )
        assert result.exit_code == 0 and "read back bit for bit" in result.output, result.output
    assert set(load_file(str(tmp_path / "catvton" / RELEASE_FILE))) == set(release_names(model.unet))
    from_release = build_model(_config(tmp_path, {"path": str(tmp_path / "catvton"), "base": str(tmp_path / "base")}))
    diffusers_config = tiny_config(
        tmp_path / "drape",
        model={
            "kind": "catvton",
            "vae": {**TINY_VAE, "path": str(tmp_path / "diffusers" / "vae")},
            "denoiser": {"path": str(tmp_path / "diffusers")},
        },
    )
    from_diffusers = build_model(diffusers_config)
    started = _start_model(config, tmp_path / "catvton")  # drape train --init <release>
    for loaded in (from_release, from_diffusers, started):
        state = loaded.state_dict()
        assert state.keys() == expected.keys() and all(torch.equal(state[n], expected[n]) for n in expected)
    base_only = build_model(config).state_dict()
    assert not all(torch.equal(base_only[n], expected[n]) for n in expected)  # the comparison can fail

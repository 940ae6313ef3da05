"""The catvton recipe and pretrained denoisers: a UNet saved in diffusers layout loads back through
`model.denoiser.path` (its input channels grown by the declared mapping), the recipe trains the
self-attention alone with no cross-attention left, and `drape model describe` counts CatVTON's
published size on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import UNet2DConditionModel
from torch.nn import functional as F
from typer.testing import CliRunner

from drape.config import ConfigError, load_config
from drape.data.shards import LATENT_FIELDS
from drape.training.checkpoints.checkpoint import load_model, save_checkpoint
from drape.training.published.pretrained import map_pretrained, resolve_denoiser, widen_input_channels
from drape.training.recipes.catvton import is_cross_attention
from drape.training.recipes.model import build_model, build_noise_scheduler, sample, trainable_parameter_names
from scheduler.jobs.profiles import model_facts
from tests.conftest import TINY_UNET, random_tryon_batch, tiny_config

REPO = Path(__file__).resolve().parents[2]
SELF_ATTENTION = ["unet.*.attn1.*"]


def _model(denoiser: dict, **model) -> dict:
    return {"kind": "catvton", "vae": {"latent_channels": 4}, "denoiser": denoiser, **model}


def _save_unet(folder: Path, seed: int = 7, **changes) -> dict[str, torch.Tensor]:
    """A tiny random UNet saved in diffusers layout (safetensors); returns its weights."""
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**{**TINY_UNET, **changes})
    unet.save_pretrained(folder, safe_serialization=True)
    return unet.state_dict()


def test_a_pretrained_unet_loads_through_the_denoiser_path(tmp_path):
    saved = _save_unet(tmp_path / "sd15-inpainting" / "unet")
    for path in (tmp_path / "sd15-inpainting", tmp_path / "sd15-inpainting" / "unet"):  # a pipeline folder or its unet/
        model = build_model(tiny_config(tmp_path / "drape", model=_model({"path": str(path)})))
        loaded = model.unet.state_dict()
        assert loaded and all(torch.equal(loaded[name], saved[name]) for name in loaded)
        assert {name for name in saved if name not in loaded} == {name for name in saved if is_cross_attention(name)}


class _SkipAttnProcessor:
    """CatVTON's own cross-attention stand-in (model/attn_processor.py): the reference the recipe matches."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
        return hidden_states


def test_the_recipe_computes_what_catvtons_skipped_cross_attention_does(tmp_path):
    _save_unet(tmp_path / "unet")
    model = build_model(tiny_config(tmp_path / "drape", model=_model({"path": str(tmp_path / "unet")})))
    reference = UNet2DConditionModel.from_pretrained(tmp_path / "unet", use_safetensors=True)
    reference.set_attn_processor(
        {name: _SkipAttnProcessor() if "attn2" in name else p for name, p in reference.attn_processors.items()}
    )
    canvas, timestep = torch.randn(2, 9, 32, 16), torch.tensor([10, 900])
    with torch.no_grad():
        ours = model.unet(canvas, timestep, encoder_hidden_states=None).sample
        theirs = reference(canvas, timestep, encoder_hidden_states=torch.randn(2, 1, 8)).sample  # text is ignored
    torch.testing.assert_close(ours, theirs)


def test_a_4_channel_base_grows_to_the_9_channel_inpainting_layout(tmp_path):
    saved = _save_unet(tmp_path / "sd15", in_channels=4)
    model = build_model(tiny_config(tmp_path / "drape", model=_model({"path": str(tmp_path / "sd15")})))
    conv_in = model.unet.conv_in.weight
    assert conv_in.shape[1] == 9 and torch.equal(conv_in[:, :4], saved["conv_in.weight"])
    assert not conv_in[:, 4:].any()  # mask and masked-person channels start at zero
    assert torch.equal(model.unet.conv_out.weight, saved["conv_out.weight"])


def test_the_channel_mapping_grows_inputs_only_and_names_both_shapes():
    weight = torch.randn(6, 4, 3, 3)
    grown = widen_input_channels(weight, 9)
    assert grown.shape == (6, 9, 3, 3) and torch.equal(grown[:, :4], weight) and not grown[:, 4:].any()
    with pytest.raises(ValueError, match="conv_in.weight: checkpoint shape \\(6, 12, 3, 3\\), recipe shape \\(6, 9, 3, 3\\)"):
        map_pretrained({"conv_in.weight": torch.zeros(6, 12, 3, 3)}, {"conv_in.weight": torch.zeros(6, 9, 3, 3)})
    with pytest.raises(ValueError, match="conv_out.weight: checkpoint shape \\(4, 6, 3, 3\\), recipe shape \\(16, 6, 3, 3\\)"):
        map_pretrained({"conv_out.weight": torch.zeros(4, 6, 3, 3)}, {"conv_out.weight": torch.zeros(16, 6, 3, 3)})
    with pytest.raises(ValueError, match="missing \\['time.bias'\\], unexpected \\['extra'\\]"):
        map_pretrained({"extra": torch.zeros(1)}, {"time.bias": torch.zeros(1)})


def test_a_missing_path_is_an_error_naming_it_and_nothing_is_downloaded(tmp_path):
    config = tiny_config(tmp_path / "drape", model=_model({"path": str(tmp_path / "nowhere"), "config": TINY_UNET}))
    with pytest.raises(ValueError, match="model.denoiser.path .*nowhere: no diffusers model there.*never downloads"):
        build_model(config)
    with pytest.raises(ValueError, match="model.denoiser.path org/not-cached: .*local Hugging Face cache"):
        resolve_denoiser("org/not-cached", cache_dir=tmp_path / "hub")
    with torch.device("meta"):  # shapes alone (the queue's estimate) need no weights: model.denoiser.config
        assert build_model(config, pretrained=False).unet.config.block_out_channels == [8, 8, 16, 16]
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    torch.save({}, pickled / "diffusion_pytorch_model.bin")
    (pickled / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="only pickle weights \\(diffusion_pytorch_model.bin\\).*never unpickles"):
        resolve_denoiser(str(pickled))


def test_a_hub_id_resolves_from_the_local_cache_only(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--tiny-inpainting" / "snapshots" / "abc123"
    _save_unet(snapshot / "unet")
    (tmp_path / "hub" / "models--org--tiny-inpainting" / "refs").mkdir(parents=True)
    (tmp_path / "hub" / "models--org--tiny-inpainting" / "refs" / "main").write_text("abc123")
    assert resolve_denoiser("org/tiny-inpainting", cache_dir=tmp_path / "hub") == snapshot / "unet"


@pytest.mark.parametrize("axis", ["height", "width"])
def test_catvton_trains_the_self_attention_alone(axis, tmp_path):
    model = build_model(tiny_config(tmp_path, model=_model({"config": TINY_UNET}, concat_axis=axis)))
    names = [name for name, _ in model.named_parameters()]
    assert not [name for name in names if "attn2" in name or is_cross_attention(name.removeprefix("unet."))]
    chosen = set(trainable_parameter_names(SELF_ATTENTION, names, model.frozen_prefixes))
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in chosen)
    clean, condition = model.prepare(random_tryon_batch())
    assert clean.shape == (2, 4, 16, 16) and set(condition) == {"agnostic", "mask", "garment"}  # no pose
    noise = torch.randn_like(clean)
    prediction = model(clean + noise, torch.tensor([10, 900]), **condition)
    loss = F.mse_loss(prediction, noise)
    loss.backward()
    assert prediction.shape == clean.shape and torch.isfinite(loss)
    graded = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert graded and graded <= chosen and all(".attn1." in name for name in graded)


def test_catvton_samples_pixels_and_loads_alone_from_a_checkpoint(tmp_path):
    config = tiny_config(tmp_path / "drape", model=_model({"config": TINY_UNET}))
    model = build_model(config)
    batch = random_tryon_batch()
    images = sample(model, config.diffusion, batch, seed=3, num_steps=2)
    assert images.shape == (2, 3, 32, 32) and images.abs().max() <= 1
    assert not torch.allclose(
        images, sample(model, config.diffusion, {**batch, "garment": batch["garment"].flip(0)}, seed=3, num_steps=2)
    )
    fields = model.latent_fields(batch)  # a latent dataset keeps every field, the pose too; prepare reads it back
    assert set(fields) == set(LATENT_FIELDS)
    clean, condition = model.prepare(fields)
    assert torch.equal(clean, fields["target_latent"]) and set(condition) == {"agnostic", "mask", "garment"}
    path = save_checkpoint(tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[], ema=None, manifest={})
    loaded = load_model(path)
    assert type(loaded).__name__ == "CatVTON" and not any("attn2" in name for name in loaded.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_a_unet_whose_output_is_not_the_vaes_latents_is_refused(tmp_path):
    config = tiny_config(tmp_path, model=_model({"config": {**TINY_UNET, "out_channels": 16}}))
    with pytest.raises(ValueError, match="the UNet predicts 16 channels, model.vae's latents have 4"):
        build_model(config)
    with pytest.raises(ConfigError, match="model.denoiser is set but latent-unet does not read it"):
        tiny_config(tmp_path, model={"kind": "latent-unet", "denoiser": {"path": "/models/unet"}})


def test_describe_prints_catvtons_published_size_from_the_meta_device():
    config = load_config(REPO / "configs" / "h100.yaml")  # its weights are not on this machine
    facts = model_facts(config)
    sizes = dict(facts.sizes)
    trainable = {
        name
        for stage in config.train.stages.values()
        for name in trainable_parameter_names(stage.trainable, list(sizes), facts.frozen_prefixes)
    }
    assert sum(sizes.values()) == pytest.approx(899.06e6, abs=0.2e6)  # UNet less cross-attention + VAE: 899.23 M
    assert sum(sizes[name] for name in trainable) == 49_574_080  # the self-attention: 49.57 M, as published
    assert facts.frozen == 83_653_863  # SD's VAE
    from drape.cli import app

    result = CliRunner().invoke(
        app, ["model", "describe", "--config", str(REPO / "configs" / "h100.yaml")], env={"COLUMNS": "240"}
    )
    assert result.exit_code == 0, result.output
    assert "899.23 M parameters (83.65 M frozen), 49.57 M trainable by the stages" in result.output
    assert "unet 815.57 M" in result.output and "vae 83.65 M (frozen)" in result.output


def test_the_schedule_is_sd15s(tmp_path):
    config = load_config(REPO / "configs" / "h100.yaml")
    scheduler = build_noise_scheduler(config.diffusion)
    assert (scheduler.config.beta_start, scheduler.config.beta_end, scheduler.config.prediction_type) == (
        0.00085,
        0.012,
        "epsilon",
    )
    with pytest.raises(ConfigError, match="diffusion.beta_start 0.02 must be below diffusion.beta_end 0.01"):
        tiny_config(tmp_path, diffusion={"beta_start": 0.02, "beta_end": 0.01})

"""The model interface: every built-in and an outside class build from config, train on pixels or
VAE latents with the VAE frozen, sample pixels, checkpoint and load alone; a manifest does not
choose what code runs."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from drape.config import ConfigError
from drape.training.checkpoints.checkpoint import CheckpointError, load_model, read_manifest, save_checkpoint
from drape.training.recipes.model import BUILT_IN, build_model, resolve_class, sample, trainable_parameter_names
from scheduler.jobs.profiles import ASSUMED_MFU, H100_DENSE_BF16_FLOPS, estimate, model_facts, parameter_counts, workload
from tests.conftest import random_tryon_batch, tiny_config

LATENT = {
    "latent-dit": {"kind": "latent-dit", "patch_size": 2, "garment_patch_size": 4, "vae": {"latent_channels": 4}},
    "latent-unet": {"kind": "latent-unet", "vae": {"latent_channels": 4}, "unet": {"block_out_channels": [16, 16]}},
}


@pytest.mark.parametrize("kind", list(LATENT))
def test_a_latent_model_diffuses_vae_latents_and_samples_pixels(kind, tmp_path):
    config = tiny_config(tmp_path, model=LATENT[kind])
    model = build_model(config)
    batch = random_tryon_batch()
    clean, condition = model.prepare(batch)
    assert clean.shape == (2, 4, 16, 16)  # 32 px, the VAE's two blocks halve it once, 4 channels
    prediction = model(torch.randn_like(clean), torch.tensor([10, 900]), **condition)
    assert prediction.shape == clean.shape
    images = sample(model, config.diffusion, {k: v for k, v in batch.items() if k != "target"}, seed=3, num_steps=2)
    assert images.shape == (2, 3, 32, 32) and images.abs().max() <= 1
    other = sample(model, config.diffusion, {**batch, "garment": batch["garment"].flip(0)}, seed=3, num_steps=2)
    assert not torch.allclose(images, other)  # the garment conditions the output


@pytest.mark.parametrize("kind", list(LATENT))
def test_the_vae_never_trains_whatever_the_patterns_say(kind, tmp_path):
    model = build_model(tiny_config(tmp_path, model=LATENT[kind]))
    names = [name for name, _ in model.named_parameters()]
    chosen = trainable_parameter_names(["*"], names, model.frozen_prefixes)
    assert chosen and not any(name.startswith("vae.") for name in chosen)
    assert {name for name in names if name.startswith("vae.")} and len(chosen) < len(names)


@pytest.mark.parametrize("kind", list(LATENT))
def test_a_latent_checkpoint_loads_alone_as_its_class(kind, tmp_path):
    model = build_model(tiny_config(tmp_path / "drape", model=LATENT[kind]))
    path = save_checkpoint(
        tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[], ema=None, manifest={"stage": "identity"}
    )
    assert read_manifest(path)["model_class"] == BUILT_IN[kind]
    loaded = load_model(path)
    assert type(loaded) is type(model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_a_vae_path_supplies_the_weights_and_the_shape(tmp_path):
    from diffusers import AutoencoderKL

    from drape.training.recipes.latent import vae_config

    config = tiny_config(tmp_path / "drape", model=LATENT["latent-dit"])
    shape = {**vae_config(config.model.vae, 32), "latent_channels": 8, "scaling_factor": 1.5, "shift_factor": 0.1}
    torch.manual_seed(7)
    AutoencoderKL.from_config(shape).save_pretrained(tmp_path / "vae", safe_serialization=True)
    pretrained = AutoencoderKL.from_pretrained(tmp_path / "vae").state_dict()
    config = tiny_config(tmp_path / "drape", model={**LATENT["latent-dit"], "vae": {"path": str(tmp_path / "vae")}})
    model = build_model(config)
    assert model.vae.config.latent_channels == 8 and model.vae.config.scaling_factor == 1.5
    assert all(torch.equal(model.vae.state_dict()[k], v) for k, v in pretrained.items())
    assert parameter_counts(config, "identity")[0] == sum(
        p.numel() for p in model.parameters()
    )  # the meta build reads config.json only
    missing = tiny_config(tmp_path / "drape", model={**LATENT["latent-dit"], "vae": {"path": str(tmp_path / "nowhere")}})
    with pytest.raises(ValueError, match="model.vae.path .*nowhere: no config.json"):
        build_model(missing)


def test_the_queue_estimate_reads_the_models_workload(tmp_path):
    pixel = tiny_config(tmp_path)
    latent = tiny_config(tmp_path, model=LATENT["latent-dit"])
    assert workload(pixel).tokens == (32 // 4) ** 2 + (32 // 8) ** 2
    assert workload(latent).tokens == (16 // 2) ** 2 + (16 // 4) ** 2
    for config in (pixel, latent):
        total, trainable = parameter_counts(config, "texture")
        assert 0 < trainable < total
        assert estimate(config, "stage-training", "texture")[0] > estimate(config, "gate-eval", "texture")[0]
    # the frozen VAE holds memory but does no per-token work: the time counts the denoiser alone
    total, _ = parameter_counts(latent, "texture")
    frozen = model_facts(latent).frozen
    assert 0 < frozen < total and model_facts(pixel).frozen == 0
    denoiser_flops = (
        6 * (total - frozen) * workload(latent).tokens * latent.train.batch_size * latent.train.stages["texture"].steps
    )
    seconds = estimate(latent, "stage-training", "texture")[1]
    assert seconds == pytest.approx(denoiser_flops / (H100_DENSE_BF16_FLOPS * ASSUMED_MFU))


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="model.patch_size 3 must divide the latent height 16"):
        tiny_config(tmp_path, model={**LATENT["latent-dit"], "patch_size": 3})
    with pytest.raises(ConfigError, match="model.unet.attention has 1 flags, block_out_channels 2 levels"):
        tiny_config(tmp_path, model={"kind": "latent-unet", "unet": {"attention": [True]}})
    with pytest.raises(ConfigError, match="model.class must be 'package.module:Name'"):
        tiny_config(tmp_path, model={"class": "os.system('x')"})


OUTSIDE = """
    from diffusers.configuration_utils import register_to_config
    from torch import nn

    from drape.training.recipes.model import TryOnModel, Workload


    class Tiny(TryOnModel):
        @register_to_config
        def __init__(self, width: int = 8):
            super().__init__()
            self.net = nn.Conv2d(10, 3, 3, padding=1)

        @classmethod
        def from_drape_config(cls, config, *, pretrained=True):
            return cls(**config.model.options)

        def condition(self, inputs):
            return {k: inputs[k] for k in ("agnostic", "mask", "pose", "garment")}

        def forward(self, noisy, timestep, agnostic, mask, pose, garment):
            import torch
            return self.net(torch.cat([noisy, agnostic, mask, pose], dim=1))

        def sharded_blocks(self):
            return [self.net]

        def workload(self):
            return Workload(1, 1, 1)


    class NotAModel:
        pass
"""


@pytest.fixture
def outside(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "models.py").write_text(textwrap.dedent(OUTSIDE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "pkg.models:Tiny"
    for name in ("pkg", "pkg.models"):
        sys.modules.pop(name, None)


def test_an_outside_class_loads_only_when_the_config_names_it(outside, tmp_path):
    config = tiny_config(tmp_path / "drape", model={"class": outside, "options": {"width": 4}})
    model = build_model(config)
    assert model.config.width == 4
    path = save_checkpoint(tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[], ema=None, manifest={})
    assert read_manifest(path)["model_class"] == outside
    with pytest.raises(CheckpointError, match="'pkg.models:Tiny' is neither built in .* set model.class to load it"):
        load_model(path)  # the manifest alone does not choose what code runs
    assert type(load_model(path, allowed=(outside,))).__name__ == "Tiny"


def test_a_forged_manifest_cannot_name_another_class(outside, tmp_path):
    model = build_model(tiny_config(tmp_path / "drape"))
    path = save_checkpoint(tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[], ema=None, manifest={})
    manifest = read_manifest(path)
    (path / "manifest.json").write_text(json.dumps({**manifest, "model_class": "subprocess:Popen"}))
    with pytest.raises(CheckpointError, match="'subprocess:Popen' is neither built in"):
        load_model(path)
    with pytest.raises(ValueError, match="is not a drape.training.recipes.model.TryOnModel subclass"):
        resolve_class("pkg.models:NotAModel", ("pkg.models:NotAModel",))
    with pytest.raises(ValueError, match="cannot import it"):
        resolve_class("pkg.nothing:Here", ("pkg.nothing:Here",))


def test_a_checkpoint_saved_before_the_rooms_names_its_built_in_class_by_the_old_path():
    """Checkpoints archived before drape/training was grouped into rooms name 'drape.training.pixel:…':
    they still load as the built-in, and no other old-looking path is let in."""
    from drape.training.recipes.model import BUILT_IN, MOVED, resolve_class
    from drape.training.recipes.pixel import TryOnTransformer

    assert resolve_class("drape.training.pixel:TryOnTransformer") is TryOnTransformer
    assert set(MOVED.values()) == set(BUILT_IN.values())
    with pytest.raises(ValueError, match="neither built in"):
        resolve_class("drape.training.trainer:StageTrainer")

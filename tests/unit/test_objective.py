"""Diffusion objectives: flow matching's noising, target and logit-normal timesteps against a hand
computation; FlowMatchEuler sampling (deterministic, the Euler steps by hand); a tiny flow-matching
latent transformer trains; the DDPM objective draws what the trainer always drew."""

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from drape.config import ConfigError
from drape.data.partition import split_data
from drape.training.checkpoints.checkpoint import load_model
from drape.training.loop.trainer import train_stage
from drape.training.recipes.model import build_model, initial_noise, sample
from drape.training.recipes.objective import DdpmObjective, FlowMatchingObjective, build_objective
from tests.conftest import tiny_config
from tests.unit.test_model import _inputs

LATENT_DIT = {"kind": "latent-dit", "patch_size": 2, "garment_patch_size": 4, "vae": {"latent_channels": 4}}


@pytest.fixture
def flow(tmp_path):
    return tiny_config(tmp_path / "drape", model=LATENT_DIT, diffusion={"objective": "flow_matching", "sampling_steps": 4})


def test_flow_matching_noises_and_targets_as_rectified_flow(flow):
    """x_t = (1 − t)·x0 + t·noise with t = timestep / num_train_timesteps; the target is noise − x0."""
    objective = build_objective(flow.diffusion)
    assert isinstance(objective, FlowMatchingObjective)
    generator = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(3, 4, 8, 8, generator=generator), torch.randn(3, 4, 8, 8, generator=generator)
    timesteps = torch.tensor([0.0, 250.0, 999.0])
    noisy, target = objective.add_noise(clean, noise, timesteps), objective.target(clean, noise, timesteps)
    for row, t in enumerate([0.0, 0.25, 0.999]):
        torch.testing.assert_close(noisy[row], (1 - t) * clean[row] + t * noise[row], atol=1e-6, rtol=0)
        assert torch.equal(target[row], noise[row] - clean[row])
    assert torch.equal(noisy[0], clean[0])


def test_logit_normal_timesteps(tmp_path):
    """SD3's density: logit(t) ~ N(logit_mean, logit_std), t in (0, 1), drawn from the step's generator."""
    config = tiny_config(tmp_path, diffusion={"objective": "flow_matching", "logit_mean": 0.5, "logit_std": 1.5})
    objective, count = build_objective(config.diffusion), 20000
    t = objective.draw_timesteps(count, torch.Generator().manual_seed(3)) / config.diffusion.num_train_timesteps
    assert 0 < float(t.min()) and float(t.max()) < 1
    logits = torch.log(t / (1 - t))
    assert abs(float(logits.mean()) - 0.5) < 3 * 1.5 / math.sqrt(count)
    assert abs(float(logits.std()) - 1.5) < 0.05
    again = objective.draw_timesteps(count, torch.Generator().manual_seed(3)) / config.diffusion.num_train_timesteps
    assert torch.equal(t, again)


def test_the_ddpm_objective_draws_what_the_trainer_always_drew(config):
    objective = build_objective(config.diffusion)
    assert isinstance(objective, DdpmObjective)
    drawn = objective.draw_timesteps(16, torch.Generator().manual_seed(9))
    assert torch.equal(drawn, torch.randint(0, 1000, (16,), generator=torch.Generator().manual_seed(9)))


@torch.no_grad()
def test_flow_sampling_is_deterministic_and_takes_euler_steps(flow):
    model = build_model(flow).eval()
    inputs = _inputs(2, flow.data.resolution)
    a, b = sample(model, flow.diffusion, inputs, seed=4), sample(model, flow.diffusion, inputs, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, sample(model, flow.diffusion, inputs, seed=5))
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)
    scheduler.set_timesteps(4)
    current, condition = initial_noise(model.sample_shape(inputs), 4), model.condition(inputs)
    sigmas = scheduler.sigmas.tolist()  # 1 … 1/1000, then 0
    for index, sigma in enumerate(sigmas[:-1]):
        velocity = model(current, torch.full((2,), sigma * 1000), **condition)
        current = current + (sigmas[index + 1] - sigma) * velocity  # x_{t-Δ} = x_t − Δ·v
    torch.testing.assert_close(a, model.decode(current).clamp(-1, 1), atol=1e-5, rtol=0)


@torch.no_grad()
def test_flow_sampling_guides_too(flow):
    model = build_model(flow).eval()
    inputs = _inputs(1, flow.data.resolution)
    guided = flow.diffusion.model_copy(update={"guidance_scale": 2.5})
    assert not torch.allclose(sample(model, guided, inputs, seed=1), sample(model, flow.diffusion, inputs, seed=1))


def test_a_tiny_flow_matching_transformer_trains(flow, tiny_dataset, tmp_path):
    directory, manifest, _ = tiny_dataset
    data = flow.model_dump(mode="json")
    data["train"].update({"checkpoint_every": 3, "cfg_dropout": {"garment": 0.1}})
    data["train"]["stages"]["texture"] = {"steps": 3, "trainable": ["*"]}
    config = type(flow).model_validate(data)
    result = train_stage(
        config, stage="texture", data=split_data(directory, manifest, "texture"), out_dir=tmp_path, init_checkpoint=None
    )
    assert math.isfinite(result.final_loss) and result.final_loss > 0
    model = load_model(result.checkpoint)
    images = sample(model.eval(), config.diffusion, _inputs(1, config.data.resolution), seed=0)
    assert torch.isfinite(images).all()


@pytest.mark.parametrize(
    ("diffusion", "message"),
    [
        ({"objective": "flow_matching", "prediction_type": "epsilon"}, "diffusion.prediction_type is a ddpm setting"),
        ({"objective": "flow_matching", "beta_schedule": "linear"}, "diffusion.beta_schedule is a ddpm setting"),
        ({"logit_mean": 1.0}, "diffusion.logit_mean is a flow_matching setting"),
        ({"objective": "flow_matching", "logit_std": 0}, "diffusion.logit_std"),
        ({"objective": "flow_matching", "flow_shift": 0}, "diffusion.flow_shift"),
        ({"objective": "rectified"}, "diffusion.objective"),
    ],
)
def test_objective_settings_fail_at_load_naming_the_field(tmp_path, diffusion, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, diffusion=diffusion)


def test_min_snr_is_a_ddpm_weighting(tmp_path):
    with pytest.raises(ConfigError, match="train.loss_weighting min_snr .* diffusion.objective is flow_matching"):
        tiny_config(tmp_path, diffusion={"objective": "flow_matching"}, train={"loss_weighting": "min_snr"})

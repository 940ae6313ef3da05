"""Classifier-free guidance: condition dropout drawn from the step's generator at the configured
rate, and guided sampling (scale 1: the unguided sampler; above 1: uncond + s · (cond − uncond))."""

import math

import pytest
import torch
from diffusers import DDIMScheduler

from drape.config import ConfigError
from drape.training.loop.batches import step_generator
from drape.training.loop.distributed import DistContext
from drape.training.loop.step import draw_step, without_dropped
from drape.training.recipes.model import build_model, build_noise_scheduler, initial_noise, sample, unconditional
from drape.training.recipes.objective import build_objective
from tests.conftest import tiny_config
from tests.unit.test_model import _inputs

RATES = {"garment": 0.1, "agnostic": 0.3}


def _guided(config, **diffusion):
    return config.model_copy(update={"diffusion": config.diffusion.model_copy(update=diffusion)})


def test_condition_dropout_happens_at_the_configured_rate(tmp_path):
    """125 steps × 16 rows = 2000 draws per condition, each rate within 3 sigma of its probability."""
    config = tiny_config(tmp_path, train={"cfg_dropout": RATES})
    objective, steps, size = build_objective(config.diffusion), 125, config.train.batch_size
    drawn = [draw_step(config.train, objective, (3, 4, 4), step_generator(0, "texture", s), DistContext()) for s in range(steps)]
    for name, probability in RATES.items():
        dropped = torch.cat([draws.dropped[name] for draws in drawn])
        assert len(dropped) == steps * size == 2000
        assert abs(float(dropped.float().mean()) - probability) < 3 * math.sqrt(probability * (1 - probability) / 2000), name
    both = torch.cat([d.dropped["garment"] & d.dropped["agnostic"] for d in drawn]).float().mean()
    assert abs(float(both) - 0.03) < 3 * math.sqrt(0.03 * 0.97 / 2000)  # drawn independently
    again = draw_step(config.train, objective, (3, 4, 4), step_generator(0, "texture", 7), DistContext())
    assert all(torch.equal(again.dropped[n], drawn[7].dropped[n]) for n in RATES)  # a resumed step draws alike


def test_the_draws_without_dropout_are_those_before_it(config, tmp_path):
    """Noise and timesteps come first: turning dropout on changes nothing else a step draws."""
    objective = build_objective(config.diffusion)
    plain = draw_step(config.train, objective, (3, 4, 4), step_generator(0, "identity", 3), DistContext())
    train = tiny_config(tmp_path, train={"cfg_dropout": RATES}).train
    dropping = draw_step(train, objective, (3, 4, 4), step_generator(0, "identity", 3), DistContext())
    assert torch.equal(plain.noise, dropping.noise) and torch.equal(plain.timesteps, dropping.timesteps)
    assert plain.dropped == {}


def test_dropped_conditions_are_zero_in_the_drawn_rows_only(config):
    model = build_model(config)
    condition = model.condition(_inputs(4, config.data.resolution))
    rows = torch.tensor([True, False, True, False])
    dropped = without_dropped(model, condition, {"garment": rows})
    assert torch.all(dropped["garment"][rows] == 0) and torch.equal(dropped["garment"][~rows], condition["garment"][~rows])
    assert all(torch.equal(dropped[n], condition[n]) for n in ("agnostic", "mask", "pose"))
    with pytest.raises(ValueError, match="train.cfg_dropout: TryOnTransformer is not conditioned on 'face'"):
        without_dropped(model, condition, {"face": rows})


def _unguided_ddim(model, diffusion, inputs, seed):
    """The sampler as it was before guidance: DDIM, one pass per step."""
    scheduler = DDIMScheduler.from_config(build_noise_scheduler(diffusion).config, clip_sample=model.clip_sample)
    scheduler.set_timesteps(diffusion.sampling_steps)
    condition, current = model.condition(inputs), initial_noise(model.sample_shape(inputs), seed)
    for timestep in scheduler.timesteps:
        prediction = model(current, torch.full((len(current),), int(timestep)), **condition)
        current = scheduler.step(prediction, timestep, current).prev_sample
    return model.decode(current).clamp(-1, 1)


def _guided_by_hand(model, diffusion, inputs, seed):
    """Two separate passes per step, combined as uncond + s · (cond − uncond)."""
    scheduler = DDIMScheduler.from_config(build_noise_scheduler(diffusion).config, clip_sample=model.clip_sample)
    scheduler.set_timesteps(diffusion.sampling_steps)
    condition, current = model.condition(inputs), initial_noise(model.sample_shape(inputs), seed)
    null = {**condition, "garment": torch.zeros_like(condition["garment"])}
    for timestep in scheduler.timesteps:
        t = torch.full((len(current),), int(timestep))
        cond, uncond = model(current, t, **condition), model(current, t, **null)
        current = scheduler.step(uncond + diffusion.guidance_scale * (cond - uncond), timestep, current).prev_sample
    return model.decode(current).clamp(-1, 1)


@torch.no_grad()
def test_guidance_scale_one_is_the_unguided_sampler_and_above_one_the_guided_combination(config):
    model = build_model(config).eval()
    inputs = _inputs(2, config.data.resolution)
    plain = sample(model, config.diffusion, inputs, seed=5)
    assert torch.equal(plain, _unguided_ddim(model, config.diffusion, inputs, seed=5))
    guided_config = _guided(config, guidance_scale=3.0)
    guided = sample(model, guided_config.diffusion, inputs, seed=5)
    assert not torch.allclose(guided, plain)
    torch.testing.assert_close(guided, _guided_by_hand(model, guided_config.diffusion, inputs, seed=5), atol=1e-5, rtol=0)


def test_the_null_condition_zeroes_what_guidance_names(config):
    condition = build_model(config).condition(_inputs(2, config.data.resolution))
    null = unconditional(condition, ["garment", "pose"])
    assert not null["garment"].any() and not null["pose"].any() and torch.equal(null["agnostic"], condition["agnostic"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"diffusion": {"guidance_scale": 0.5}}, "diffusion.guidance_scale"),
        ({"diffusion": {"guidance_scale": 31}}, "diffusion.guidance_scale"),
        ({"diffusion": {"guidance_conditions": []}}, "diffusion.guidance_conditions"),
        ({"diffusion": {"guidance_conditions": ["face"]}}, "diffusion.guidance_conditions"),
        ({"train": {"cfg_dropout": {"garment": 1.0}}}, "train.cfg_dropout.garment"),
        ({"train": {"cfg_dropout": {"garment": -0.1}}}, "train.cfg_dropout.garment"),
        ({"train": {"cfg_dropout": {"text": 0.1}}}, "train.cfg_dropout"),
    ],
)
def test_guidance_settings_fail_at_load_naming_the_field(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, **overrides)


def test_a_model_without_pose_refuses_to_drop_it(tmp_path):
    catvton = {"model": {"kind": "catvton", "denoiser": {"config": {}}}}
    with pytest.raises(ConfigError, match="train.cfg_dropout: model.kind catvton is not conditioned on pose"):
        tiny_config(tmp_path, train={"cfg_dropout": {"pose": 0.1}}, **catvton)


@torch.no_grad()
def test_the_gate_samples_with_the_configured_guidance_and_objective(tmp_path):
    """`sample_control` renders through `sample` with `config.diffusion`: guidance and flow matching included."""
    from drape.data.dataset import synthesize_split, to_model_inputs
    from drape.gates.run import sample_control

    config = tiny_config(tmp_path, diffusion={"guidance_scale": 2.0, "sampling_steps": 2})
    flow = tiny_config(tmp_path, diffusion={"objective": "flow_matching", "guidance_scale": 2.0, "sampling_steps": 2})
    control = synthesize_split(config, "control", 2)
    rendered = {}
    for name, cfg in (("guided", config), ("flow", flow), ("plain", _guided(config, guidance_scale=1.0))):
        model = build_model(cfg).eval()
        (keys, rendered[name]), *_ = list(sample_control(cfg, model, control))
        expected = sample(model, cfg.diffusion, to_model_inputs(control), seed=cfg.gates.sample_seed)
        assert keys == list(control["keys"]) and torch.equal(rendered[name], expected)
    assert not torch.allclose(rendered["guided"], rendered["plain"])

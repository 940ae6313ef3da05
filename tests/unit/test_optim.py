"""The optimizer step: gradient accumulation, the learning-rate schedule, 8-bit AdamW's refusals,
Min-SNR weights; a run with accumulation, a warmup + cosine schedule and condition dropout resumes
to the same weights."""

import math

import pytest
import torch

from drape.config import ConfigError
from drape.training.checkpoints.checkpoint import load_model
from drape.training.loop.optim import build_optimizer, check_optimizer, lr_schedule
from drape.training.loop.step import micro_batches
from drape.training.loop.trainer import train_stage
from drape.training.recipes.objective import DdpmObjective
from tests.conftest import tiny_config
from tests.unit.conftest import seven_texture_steps, uninterrupted_and_resumed

SCHEDULED = {
    "grad_accumulation_steps": 2,
    "lr_scheduler": "cosine",
    "lr_warmup_steps": 2,
    "ema": {"enabled": True},
    "cfg_dropout": {"garment": 0.5},  # drawn from the step's generator: resumed alike
}


def test_resume_with_accumulation_and_a_schedule_matches_uninterrupted(config, texture_data, tmp_path):
    cfg = seven_texture_steps(config, **SCHEDULED)
    full, resumed = uninterrupted_and_resumed(cfg, texture_data, tmp_path)
    assert resumed.resumed_from_step == 3
    a, b = load_model(full.checkpoint).state_dict(), load_model(resumed.checkpoint).state_dict()
    assert max(float((a[n] - b[n]).abs().max()) for n in a) == 0
    assert resumed.final_loss == full.final_loss


def test_accumulation_trains_the_same_global_batch(config, texture_data, tmp_path):
    """Two micro-batches of 8 take the same samples and draws as one batch of 16: the weights
    differ only by the order of float sums."""
    whole = train_stage(
        seven_texture_steps(config), stage="texture", data=texture_data, out_dir=tmp_path / "a", init_checkpoint=None
    )
    halves = train_stage(
        seven_texture_steps(config, grad_accumulation_steps=2),
        stage="texture",
        data=texture_data,
        out_dir=tmp_path / "b",
        init_checkpoint=None,
    )
    a, b = load_model(whole.checkpoint).state_dict(), load_model(halves.checkpoint).state_dict()
    assert max(float((a[n] - b[n]).abs().max()) for n in a) < 1e-4
    assert abs(whole.final_loss - halves.final_loss) < 1e-4
    assert micro_batches(8, 2) == [slice(0, 4), slice(4, 8)]


@pytest.mark.parametrize("name", ["constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"])
def test_a_schedule_set_to_a_step_is_the_schedule_stepped_there(config, name):
    """A resumed stage sets its schedule from the checkpoint's step: the rate, and every rate after
    it, equal those of a schedule stepped there one optimizer step at a time."""
    train = seven_texture_steps(config, lr_scheduler=name, lr_warmup_steps=3).train
    stepped_optimizer, resumed_optimizer = (build_optimizer(train, [torch.nn.Parameter(torch.ones(2))], 0.01) for _ in "ab")
    stepped = lr_schedule(train, stepped_optimizer, total=20)
    rates = [stepped_optimizer.param_groups[0]["lr"]]
    for _ in range(19):
        stepped_optimizer.step()
        stepped.step()
        rates.append(stepped_optimizer.param_groups[0]["lr"])
    assert rates[0] == 0 and max(rates) == 0.01  # warmup from 0 to the peak
    resumed = lr_schedule(train, resumed_optimizer, total=20, step=7)
    after = [resumed_optimizer.param_groups[0]["lr"]]
    for _ in range(12):
        resumed_optimizer.step()
        resumed.step()
        after.append(resumed_optimizer.param_groups[0]["lr"])
    assert after == rates[7:] and resumed.get_last_lr() == [rates[-1]]


def test_the_default_schedule_keeps_the_rate(config):
    train = config.train
    optimizer = build_optimizer(train, [torch.nn.Parameter(torch.ones(2))], train.lr)
    schedule = lr_schedule(train, optimizer, total=10, step=4)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.param_groups[0]["lr"] == train.lr
    schedule.step()
    assert optimizer.param_groups[0]["lr"] == train.lr


def test_8bit_adamw_is_refused_where_it_cannot_run(config, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="train.optimizer adamw8bit .* train.device is cpu"):
        tiny_config(tmp_path / "a", train={"optimizer": "adamw8bit"})
    train = tiny_config(tmp_path / "b", train={"optimizer": "adamw8bit", "device": "auto"}).train
    with pytest.raises(RuntimeError, match="train.optimizer adamw8bit runs on CUDA only"):
        check_optimizer(train, torch.device("cpu"))
    monkeypatch.setitem(__import__("sys").modules, "bitsandbytes", None)  # not installed
    with pytest.raises(RuntimeError, match="train.optimizer adamw8bit needs bitsandbytes installed"):
        check_optimizer(train, torch.device("cuda"))
    check_optimizer(config.train, torch.device("cpu"))  # adamw: nothing to check


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction", "sample"])
def test_min_snr_weights_match_the_paper(config, prediction):
    """Hang et al. 2023: SNR(t) = ᾱ_t / (1 − ᾱ_t); weight min(SNR, γ) on x0, / SNR on epsilon, / (SNR + 1) on v."""
    diffusion = config.diffusion.model_copy(update={"prediction_type": prediction})
    objective = DdpmObjective(diffusion)
    timesteps = torch.tensor([0, 10, 300, 700, 999])
    weights = objective.min_snr_weights(timesteps, gamma=5.0)
    for t, weight in zip(timesteps.tolist(), weights.tolist()):
        alpha = float(objective.scheduler.alphas_cumprod[t])
        snr = alpha / (1 - alpha)
        expected = min(snr, 5.0) / {"epsilon": snr, "v_prediction": snr + 1, "sample": 1}[prediction]
        assert math.isclose(weight, expected, rel_tol=1e-4), (t, weight, expected)


def test_min_snr_trains_with_a_finite_loss(config, texture_data, tmp_path):
    data = config.model_dump(mode="json")
    data["diffusion"]["prediction_type"] = "epsilon"
    data["train"].update({"loss_weighting": "min_snr", "min_snr_gamma": 5.0})
    data["train"]["stages"]["texture"]["steps"] = 2
    result = train_stage(
        type(config).model_validate(data), stage="texture", data=texture_data, out_dir=tmp_path, init_checkpoint=None
    )
    assert math.isfinite(result.final_loss)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"grad_accumulation_steps": 3}, "train.batch_size 16 does not split into train.grad_accumulation_steps 3"),
        ({"grad_accumulation_steps": 0}, "train.grad_accumulation_steps"),
        ({"lr_warmup_steps": 5}, "train.lr_scheduler constant has no warmup: use constant_with_warmup"),
        ({"lr_scheduler": "cosine", "lr_warmup_steps": 20}, "train.lr_warmup_steps 20 must be below"),
        ({"lr_scheduler": "piecewise_constant"}, "train.lr_scheduler"),
        ({"optimizer": "sgd"}, "train.optimizer"),
        ({"loss_weighting": "p2"}, "train.loss_weighting"),
        ({"min_snr_gamma": 0}, "train.min_snr_gamma"),
    ],
)
def test_training_choices_fail_at_load_naming_the_field(tmp_path, train, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(tmp_path, train=train)


def test_only_the_last_micro_batch_reduces_gradients_across_ranks():
    """DDP's `no_sync` and FSDP2's `set_requires_gradient_sync` hold the all-reduce to the last micro-batch."""
    from contextlib import contextmanager

    from drape.training.loop.step import gradient_sync

    events = []

    class Ddp(torch.nn.Module):
        @contextmanager
        def no_sync(self):
            events.append("no_sync")
            yield

    class Fsdp(torch.nn.Module):
        def set_requires_gradient_sync(self, enabled):
            events.append(f"sync={enabled}")

    for model in (Ddp(), Fsdp(), torch.nn.Linear(1, 1)):
        for last in (False, True):
            with gradient_sync(model, enabled=last):
                events.append("backward")
    assert events == [
        "no_sync",
        "backward",
        "backward",
        "sync=False",
        "backward",
        "sync=True",
        "backward",
        "backward",
        "backward",
    ]

"""One optimizer step of a stage: micro-batches, the step's draws, condition dropout, the loss.

`train.batch_size` is the global batch of one optimizer step. Each rank takes its rows and runs
them as `train.grad_accumulation_steps` micro-batches (forward and backward each, gradients summed,
reduced across ranks on the last only), then steps the optimizer and the learning-rate schedule
once. The step's draws (noise, timesteps, which conditions drop) are made for the whole global
batch from the step's generator before any micro-batch runs, so a sample gets the same draws
whatever the accumulation or the world size, and checkpoints, which fall between optimizer steps,
never hold a half-accumulated gradient.

Classifier-free guidance trains with `train.cfg_dropout`: each sample's condition is zeroed
with its probability (CatVTON zeroes the garment), the unconditional the sampler guides against
(`drape.training.recipes.model.guided_prediction`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.nn import functional as F

from drape.config import PipelineConfig, TrainConfig
from drape.data.dataset import to_model_inputs
from drape.training.loop.distributed import DistContext, unwrap
from drape.training.loop.state import TrainingState
from drape.training.recipes.model import TryOnModel, unconditional
from drape.training.recipes.objective import Objective


@dataclass(frozen=True)
class StepDraws:
    """This rank's rows of the step's draws for the global batch."""

    noise: torch.Tensor
    timesteps: torch.Tensor
    dropped: dict[str, torch.Tensor]  # per condition of train.cfg_dropout: which rows train without it


def draw_step(
    train: TrainConfig, objective: Objective, sample_shape: tuple[int, ...], generator: torch.Generator, context: DistContext
) -> StepDraws:
    """The step's draws for all `train.batch_size` rows, in a fixed order (noise, timesteps, then each
    condition's dropout by name), this rank's rows kept, on its device."""
    local, size, device = context.local_slice(train.batch_size), train.batch_size, context.device
    noise = torch.randn((size, *sample_shape), generator=generator)[local].to(device)
    timesteps = objective.draw_timesteps(size, generator)[local].to(device)
    dropped: dict[str, torch.Tensor] = {
        name: (torch.rand(size, generator=generator) < probability)[local].to(device)
        for name, probability in sorted(train.cfg_dropout.items())
        if probability > 0
    }
    return StepDraws(noise, timesteps, dropped)


def micro_batches(rows: int, parts: int) -> list[slice]:
    """`rows` cut into `parts` equal, consecutive slices (the config guarantees they divide)."""
    size = rows // parts
    return [slice(index * size, (index + 1) * size) for index in range(parts)]


@contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """DDP and FSDP2 reduce gradients across ranks in backward: only the last micro-batch needs to."""
    no_sync: Any = getattr(model, "no_sync", None)  # DistributedDataParallel
    set_sync: Any = getattr(model, "set_requires_gradient_sync", None)  # an FSDP2 module
    if enabled or (no_sync is None and set_sync is None):
        yield
    elif no_sync is not None:
        with no_sync():
            yield
    else:
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)


def without_dropped(model: TryOnModel, condition: dict[str, torch.Tensor], dropped: dict[str, torch.Tensor]) -> dict:
    """`condition` with each `dropped` condition zeroed in the rows drawn for it."""
    for name, rows in dropped.items():
        if name not in condition:
            raise ValueError(
                f"train.cfg_dropout: {type(model).__name__} is not conditioned on {name!r} "
                f"(its conditions: {', '.join(condition)})"
            )
        condition = unconditional(condition, [name], rows)
    return condition


def diffusion_loss(
    train: TrainConfig, objective: Objective, prediction: torch.Tensor, target: torch.Tensor, timesteps: torch.Tensor
) -> torch.Tensor:
    """The MSE to the target; with `train.loss_weighting` min_snr, each sample's weighted by Min-SNR-γ."""
    if train.loss_weighting == "none":
        return F.mse_loss(prediction.float(), target)
    per_sample = F.mse_loss(prediction.float(), target.float(), reduction="none").mean(dim=tuple(range(1, prediction.ndim)))
    return (per_sample * objective.min_snr_weights(timesteps, train.min_snr_gamma)).mean()


def _prepare(model: TryOnModel, batch: dict[str, torch.Tensor], parts: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The rows' clean samples and conditions, a micro-batch at a time (a VAE encodes no more at once)."""
    rows = len(next(iter(batch.values())))
    with torch.no_grad():
        prepared = [model.prepare({k: v[part] for k, v in batch.items()}) for part in micro_batches(rows, parts)]
    if len(prepared) == 1:
        return prepared[0]
    condition = {name: torch.cat([c[name] for _, c in prepared]) for name in prepared[0][1]}
    return torch.cat([clean for clean, _ in prepared]), condition


def _micro_loss(
    config: PipelineConfig, state: TrainingState, objective: Objective, clean, condition, draws: StepDraws, part: slice
) -> torch.Tensor:
    train, device = config.train, clean.device
    noise, timesteps = draws.noise[part], draws.timesteps[part]
    rows = {name: value[part] for name, value in condition.items()}
    rows = without_dropped(cast(TryOnModel, unwrap(state.model)), rows, {n: d[part] for n, d in draws.dropped.items()})
    noisy = objective.add_noise(clean[part], noise, timesteps)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=train.precision == "bf16"):
        prediction = state.model(noisy, timesteps, **rows)
    return diffusion_loss(train, objective, prediction, objective.target(clean[part], noise, timesteps), timesteps)


def train_step(
    config: PipelineConfig,
    state: TrainingState,
    objective: Objective,
    batch: dict,
    generator: torch.Generator,
    context: DistContext,
) -> torch.Tensor:
    """One optimizer step on this rank's rows of the global batch (uint8, as decoded); returns the loss."""
    train, device, parts = config.train, context.device, config.train.grad_accumulation_steps
    batch = to_model_inputs({k: v.to(device, non_blocking=True) for k, v in batch.items()})
    clean, condition = _prepare(cast(TryOnModel, unwrap(state.model)), batch, parts)  # pixels, or the frozen VAE's latents
    draws = draw_step(train, objective, tuple(clean.shape[1:]), generator, context)
    if state.lora is not None and train.lora.dropout:  # the adapters' dropout masks, drawn again alike on resume
        torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)) + context.rank)
    state.optimizer.zero_grad(set_to_none=True)
    loss = torch.zeros((), device=device)
    for index, part in enumerate(micro_batches(len(clean), parts)):
        with gradient_sync(state.model, enabled=index == parts - 1):
            micro = _micro_loss(config, state, objective, clean, condition, draws, part) / parts
            micro.backward()
        loss += micro.detach()
    torch.nn.utils.clip_grad_norm_([state.parameters[n] for n in state.names], train.grad_clip)
    state.optimizer.step()
    if state.lr_schedule is not None:
        state.lr_schedule.step()
    if state.ema is not None:
        with torch.no_grad():
            for n in state.names:
                state.ema[n].lerp_(state.parameters[n].detach(), 1 - train.ema.decay)
    return loss

"""Diffusion objectives: how training noises a clean sample and what the model learns to predict,
and which diffusers scheduler samples it (`diffusion.objective`).

- ``ddpm``: diffusers' `DDPMScheduler` noising at integer timesteps drawn uniformly, the target of
  `diffusion.prediction_type`, DDIM sampling; optionally Min-SNR-γ loss weights (Hang et al. 2023,
  as diffusers' training examples compute them).
- ``flow_matching``: rectified flow as SD3 and FitDiT train it: t ~ sigmoid(N(logit_mean,
  logit_std)) (diffusers' `compute_density_for_timestep_sampling`), x_t = (1 − t)·x0 + t·noise,
  the velocity target noise − x0, the model fed t × num_train_timesteps (SD3's convention);
  sampled by `FlowMatchEulerDiscreteScheduler`.

The objective is independent of the model class: any `TryOnModel` trains under either. Every draw
takes the step's generator, so a resumed run draws what an uninterrupted one does.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import DDIMScheduler, DDPMScheduler

from drape.config import DiffusionConfig


class DdpmObjective:
    """DDPM noising (`add_noise`) and target (`prediction_type`); DDIM sampling from the same config."""

    def __init__(self, diffusion: DiffusionConfig):
        self.diffusion = diffusion
        self.scheduler: Any = build_noise_scheduler(diffusion)  # diffusers' config attributes are dynamic

    def draw_timesteps(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """`count` integer timesteps, uniform over the training schedule."""
        return torch.randint(0, self.diffusion.num_train_timesteps, (count,), generator=generator)

    def timesteps_at(self, fraction: float, count: int) -> torch.Tensor:
        """`count` copies of the timestep `fraction` of the way to pure noise."""
        return torch.full((count,), int(fraction * (self.diffusion.num_train_timesteps - 1)))

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        return self.scheduler.add_noise(clean, noise, timesteps)

    def target(self, clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        return diffusion_target(self.scheduler, clean, noise, timesteps)

    def min_snr_weights(self, timesteps: torch.Tensor, gamma: float) -> torch.Tensor:
        """Per-sample Min-SNR-γ weights of the MSE on this objective's target: min(SNR, γ) for x0,
        divided by SNR for epsilon and by SNR + 1 for v (diffusers' train_text_to_image.py)."""
        # imported when used: diffusers.training_utils costs ~3 s of CPU in every process that imports it
        from diffusers.training_utils import compute_snr

        snr = compute_snr(self.scheduler, timesteps)
        weights = torch.clamp(snr, max=gamma)
        kind = self.scheduler.config.prediction_type
        if kind == "epsilon":
            return weights / snr.clamp_min(torch.finfo(snr.dtype).tiny)
        return weights / (snr + 1) if kind == "v_prediction" else weights

    def sampler(self, clip_sample: bool) -> Any:
        return DDIMScheduler.from_config(self.scheduler.config, clip_sample=clip_sample)

    def model_timesteps(self, timestep: torch.Tensor, count: int, device: torch.device) -> torch.Tensor:
        """A sampler's timestep as the model's batch of them (integers)."""
        return torch.full((count,), int(timestep), device=device)


class FlowMatchingObjective:
    """Rectified flow (SD3): logit-normal t, x_t = (1 − t)·x0 + t·noise, velocity target noise − x0."""

    def __init__(self, diffusion: DiffusionConfig):
        self.diffusion = diffusion

    def draw_timesteps(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """`count` model timesteps t × num_train_timesteps, t logit-normal in (0, 1)."""
        # diffusers' compute_density_for_timestep_sampling("logit_normal", ...): the same draw, without
        # importing diffusers.training_utils (~3 s of CPU in every trainer process)
        normal = torch.normal(self.diffusion.logit_mean, self.diffusion.logit_std, size=(count,), generator=generator)
        t = torch.sigmoid(normal)
        return t * self.diffusion.num_train_timesteps

    def timesteps_at(self, fraction: float, count: int) -> torch.Tensor:
        return torch.full((count,), fraction * self.diffusion.num_train_timesteps)

    def sigmas(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """t (the noise fraction) per sample, shaped to broadcast over `like`."""
        sigma = timesteps.to(like.device, torch.float32) / self.diffusion.num_train_timesteps
        return sigma.reshape(-1, *([1] * (like.ndim - 1)))

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        sigma = self.sigmas(timesteps, clean)
        return ((1 - sigma) * clean + sigma * noise).to(clean.dtype)

    def target(self, clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        return (noise - clean).float()

    def min_snr_weights(self, timesteps: torch.Tensor, gamma: float) -> torch.Tensor:
        raise ValueError("train.loss_weighting min_snr needs diffusion.objective ddpm")  # the config refuses it at load

    def sampler(self, clip_sample: bool) -> Any:
        """Flow samples are not clipped: the Euler steps run to t = 0 (the pixels are clamped after decoding)."""
        # imported when used: its module imports scipy.stats (~0.5 s of CPU in every trainer process)
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=self.diffusion.num_train_timesteps, shift=self.diffusion.flow_shift
        )

    def model_timesteps(self, timestep: torch.Tensor, count: int, device: torch.device) -> torch.Tensor:
        return torch.full((count,), float(timestep), device=device)


Objective = DdpmObjective | FlowMatchingObjective


def build_objective(diffusion: DiffusionConfig) -> Objective:
    """The objective `diffusion.objective` names."""
    return FlowMatchingObjective(diffusion) if diffusion.objective == "flow_matching" else DdpmObjective(diffusion)


def build_noise_scheduler(diffusion: DiffusionConfig) -> DDPMScheduler:
    """The DDPM training scheduler (`add_noise`); sampling uses DDIM from the same config."""
    return DDPMScheduler(
        num_train_timesteps=diffusion.num_train_timesteps,
        beta_schedule=diffusion.beta_schedule,
        beta_start=diffusion.beta_start,  # read by linear and scaled_linear only
        beta_end=diffusion.beta_end,
        prediction_type=diffusion.prediction_type,
        clip_sample=True,
    )


def diffusion_target(scheduler: Any, clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """What the model learns to predict under the (DDPM) scheduler's prediction_type."""
    kind = scheduler.config.prediction_type
    if kind == "sample":
        return clean
    if kind == "epsilon":
        return noise
    if kind == "v_prediction":
        return scheduler.get_velocity(clean, noise, timesteps)
    raise ValueError(f"diffusion.prediction_type {kind!r} is not supported; expected sample, epsilon or v_prediction")

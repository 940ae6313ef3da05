"""The try-on diffusion model: one conditional model for any garment.

Person-side inputs (noisy target, agnostic image, its mask, rendered pose) are concatenated on
channels and patch-embedded by a diffusers `SD3Transformer2DModel`; the flat-lay garment is
encoded to tokens that enter the transformer's joint attention (as text tokens do in SD3), and
their mean is the pooled conditioning. No per-garment training: any garment image works at
inference. Sampling goes through a diffusers scheduler (`set_timesteps`, `add_noise`, `step`).
"""

from __future__ import annotations

import fnmatch

import torch
from diffusers import DDIMScheduler, DDPMScheduler, SD3Transformer2DModel
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from drape.config import DiffusionConfig, PipelineConfig

IMAGE_CHANNELS = 3


class GarmentEncoder(nn.Module):
    """Flat-lay garment image → a grid of tokens with learned positions."""

    def __init__(self, resolution: int, patch_size: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(IMAGE_CHANNELS, dim, kernel_size=patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.zeros(1, (resolution // patch_size) ** 2, dim))
        self.norm = nn.LayerNorm(dim)

    def forward(self, garment: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(garment).flatten(2).transpose(1, 2)
        return self.norm(tokens + self.pos)


class TryOnTransformer(ModelMixin, ConfigMixin):
    """Predicts the diffusion target for a noisy try-on image given person inputs and a garment."""

    @register_to_config
    def __init__(
        self,
        resolution: int = 64,
        patch_size: int = 4,
        num_layers: int = 2,
        num_attention_heads: int = 4,
        attention_head_dim: int = 32,
        garment_patch_size: int = 8,
        pose_channels: int = 3,
    ):
        super().__init__()
        hidden = num_attention_heads * attention_head_dim
        self.garment_encoder = GarmentEncoder(resolution, garment_patch_size, hidden)
        self.transformer = SD3Transformer2DModel(
            sample_size=resolution,
            patch_size=patch_size,
            in_channels=2 * IMAGE_CHANNELS + 1 + pose_channels,
            out_channels=IMAGE_CHANNELS,
            num_layers=num_layers,
            attention_head_dim=attention_head_dim,
            num_attention_heads=num_attention_heads,
            joint_attention_dim=hidden,
            caption_projection_dim=hidden,
            pooled_projection_dim=hidden,
            pos_embed_max_size=resolution // patch_size,
        )

    def forward(
        self,
        noisy: torch.Tensor,
        timestep: torch.Tensor,
        agnostic: torch.Tensor,
        mask: torch.Tensor,
        pose: torch.Tensor,
        garment: torch.Tensor,
    ) -> torch.Tensor:
        tokens = self.garment_encoder(garment)
        person = torch.cat([noisy, agnostic, mask, pose], dim=1)
        return self.transformer(
            hidden_states=person,
            encoder_hidden_states=tokens,
            pooled_projections=tokens.mean(dim=1),
            timestep=timestep,
            return_dict=False,
        )[0]


def trainable_parameter_names(patterns: list[str], names: list[str]) -> list[str]:
    """Parameter names matched by any glob pattern of a stage's `trainable` (``*`` matches everything)."""
    return [name for name in names if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


def build_model(config: PipelineConfig) -> TryOnTransformer:
    """A freshly initialised model sized by `config.model`, its weights a function of `config.seed`."""
    m = config.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return TryOnTransformer(
            resolution=config.data.resolution,
            patch_size=m.patch_size,
            num_layers=m.num_layers,
            num_attention_heads=m.num_attention_heads,
            attention_head_dim=m.attention_head_dim,
            garment_patch_size=m.garment_patch_size,
            pose_channels=m.pose_channels,
        )


def build_noise_scheduler(diffusion: DiffusionConfig) -> DDPMScheduler:
    """The training scheduler (`add_noise`); sampling uses DDIM from the same config."""
    return DDPMScheduler(
        num_train_timesteps=diffusion.num_train_timesteps,
        beta_schedule=diffusion.beta_schedule,
        prediction_type=diffusion.prediction_type,
        clip_sample=True,
    )


def diffusion_target(scheduler: DDPMScheduler, clean: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """What the model learns to predict under the scheduler's prediction_type."""
    kind = scheduler.config.prediction_type
    if kind == "sample":
        return clean
    if kind == "epsilon":
        return noise
    if kind == "v_prediction":
        return scheduler.get_velocity(clean, noise, timesteps)
    raise ValueError(f"diffusion.prediction_type {kind!r} is not supported; expected sample, epsilon or v_prediction")


@torch.no_grad()
def sample(
    model: TryOnTransformer,
    diffusion: DiffusionConfig,
    inputs: dict[str, torch.Tensor],
    *,
    seed: int,
    num_steps: int | None = None,
) -> torch.Tensor:
    """Generate try-on images in [-1, 1] for a batch of conditioning inputs, deterministically per seed."""
    scheduler = DDIMScheduler.from_config(build_noise_scheduler(diffusion).config)
    scheduler.set_timesteps(num_steps or diffusion.sampling_steps)
    agnostic = inputs["agnostic"]
    generator = torch.Generator(device="cpu").manual_seed(seed)
    image = torch.randn(agnostic.shape, generator=generator).to(agnostic.device, agnostic.dtype)
    was_training = model.training
    model.eval()
    for timestep in scheduler.timesteps:
        t = torch.full((agnostic.shape[0],), int(timestep), device=agnostic.device)
        prediction = model(image, t, agnostic, inputs["mask"], inputs["pose"], inputs["garment"])
        image = scheduler.step(prediction, timestep, image).prev_sample
    model.train(was_training)
    return image.clamp(-1, 1)

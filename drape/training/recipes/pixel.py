"""`pixel-dit`: the built-in pixel-space try-on model (the demo's), one conditional model for any garment.

Person-side inputs (noisy target, agnostic image, its mask, rendered pose) are concatenated on
channels and patch-embedded by a diffusers `SD3Transformer2DModel`; the flat-lay garment is
encoded to tokens that enter the transformer's joint attention (as text tokens do in SD3), and
their mean is the pooled conditioning. No per-garment training: any garment image works at
inference. `drape.training.recipes.latent` runs the same design on VAE latents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from diffusers import SD3Transformer2DModel
from diffusers.configuration_utils import register_to_config
from torch import nn

from drape.config.data import height_width
from drape.training.recipes.model import IMAGE_CHANNELS, TryOnModel, Workload

if TYPE_CHECKING:
    from drape.config import PipelineConfig


class GarmentEncoder(nn.Module):
    """Flat-lay garment image (or its latents) → a grid of tokens with learned positions."""

    def __init__(self, resolution: int | tuple[int, int], patch_size: int, dim: int, channels: int = IMAGE_CHANNELS):
        super().__init__()
        height, width = height_width(resolution)
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.zeros(1, (height // patch_size) * (width // patch_size), dim))
        self.norm = nn.LayerNorm(dim)

    def forward(self, garment: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(garment).flatten(2).transpose(1, 2)
        return self.norm(tokens + self.pos)


def joint_transformer(
    size: int | tuple[int, int],
    channels: int,
    pose_channels: int,
    *,
    patch_size: int,
    num_layers: int,
    num_attention_heads: int,
    attention_head_dim: int,
) -> Any:  # an SD3Transformer2DModel (mypy sees no ModelMixin methods on it)
    """The SD3-style joint-attention transformer over a `size` grid (a side, or (height, width)) of
    `channels`-channel samples: in, the noisy sample, the agnostic person, the mask and the pose on
    channels; out, the prediction. Its position table covers the longer side, cropped to the grid
    at each forward (SD3's `pos_embed_max_size`), so a 3:4 grid is as much at home as a square."""
    hidden = num_attention_heads * attention_head_dim
    longer = max(height_width(size))
    return SD3Transformer2DModel(
        sample_size=longer,
        patch_size=patch_size,
        in_channels=2 * channels + 1 + pose_channels,
        out_channels=channels,
        num_layers=num_layers,
        attention_head_dim=attention_head_dim,
        num_attention_heads=num_attention_heads,
        joint_attention_dim=hidden,
        caption_projection_dim=hidden,
        pooled_projection_dim=hidden,
        pos_embed_max_size=longer // patch_size,
    )


def dit_arguments(config: PipelineConfig) -> dict[str, Any]:
    """The constructor arguments a joint-attention denoiser takes from `model.*` and `data.resolution`."""
    m = config.model
    return {
        "resolution": config.data.resolution,
        "patch_size": m.patch_size,
        "num_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "attention_head_dim": m.attention_head_dim,
        "garment_patch_size": m.garment_patch_size,
    }


class JointAttentionDenoiser:
    """The denoiser of `pixel-dit` and `latent-dit`: garment tokens (`garment_encoder`) in the joint
    attention of an SD3 `transformer` over the person-side inputs concatenated on channels."""

    garment_encoder: GarmentEncoder
    transformer: Any
    config: Any

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

    def sharded_blocks(self) -> list[nn.Module]:
        return list(self.transformer.transformer_blocks)

    def grid_workload(self, height: int, width: int) -> Workload:
        """Tokens of a height × width grid and of the garment, the transformer's width and depth."""
        c = self.config
        tokens = sum((height // patch) * (width // patch) for patch in (c["patch_size"], c["garment_patch_size"]))
        return Workload(tokens, c["num_attention_heads"] * c["attention_head_dim"], c["num_layers"])


class TryOnTransformer(JointAttentionDenoiser, TryOnModel):  # type: ignore[misc]  # diffusers: config_name differs in its two bases
    """Predicts the diffusion target for a noisy try-on image given person inputs and a garment."""

    @register_to_config
    def __init__(
        self,
        resolution: int | tuple[int, int] = 64,
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
        self.transformer = joint_transformer(
            resolution,
            IMAGE_CHANNELS,
            pose_channels,
            patch_size=patch_size,
            num_layers=num_layers,
            num_attention_heads=num_attention_heads,
            attention_head_dim=attention_head_dim,
        )

    @classmethod
    def from_drape_config(cls, config: PipelineConfig, *, pretrained: bool = True) -> TryOnTransformer:
        return cls(**dit_arguments(config), pose_channels=config.model.pose_channels)

    def condition(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: inputs[name] for name in ("agnostic", "mask", "pose", "garment")}

    def workload(self) -> Workload:
        return self.grid_workload(*height_width(self.config["resolution"]))

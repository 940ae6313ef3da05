"""`catvton`: CatVTON's recipe, fine-tuned from Stable Diffusion 1.5 inpainting's UNet.

CatVTON ("Concatenation Is All You Need", ICLR 2025) keeps SD1.5-inpainting's UNet as it is and
changes only what it sees: the person and the garment latents concatenated spatially into one
canvas, no text encoder, and only the self-attention trained. Here:

- Input (9 channels, SD-inpainting's order, which its conv_in was trained on): the noisy latent,
  the mask, the masked-person latent; each a canvas [person | garment] along `model.concat_axis`
  (CatVTON's released code concatenates along height). The garment half carries the clean
  garment latent in the noisy and masked channels and a zero mask. The output and the loss are
  the person half: the diffusion runs on the person's latents, as every drape model's does.
- No text: every transformer block's cross-attention (``attn2``) is replaced by
  `SkippedCrossAttention`, which has no parameters and returns what it is given, exactly as
  CatVTON's `SkipAttnProcessor` does: the block still adds its ``norm2`` LayerNorm of the
  hidden states to the residual where the cross-attention was, so CatVTON's released attn1
  weights meet the function they were trained under. The UNet runs with
  `encoder_hidden_states=None`. The self-attention (``attn1``) is what the stages train
  (`unet.*.attn1.*` in configs/h100.yaml). Pose or DensePose is not an input: widening the
  pretrained input for it would silently change the model CatVTON is.
- The UNet's weights come from `model.denoiser.path` (drape.training.published.pretrained: a local folder or
  the local Hugging Face cache, safetensors only); a 4-channel SD1.5 base grows to 9 inputs by
  the declared mapping (new channels zero). The VAE is the frozen `model.vae` of every latent model.

Size, as `drape model describe` counts it (every tensor the model holds), at SD1.5's shapes: the
UNet without its cross-attention 815.57 M (859.54 M less attn2's 43.96 M; the norm2 LayerNorms it
still applies stay) plus the VAE 83.65 M = 899.23 M; CatVTON publishes 899.06 M (0.17 M it does
not itemise). Trainable: the attn1 weights, 49.57 M, as published.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
from diffusers import UNet2DConditionModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.attention import BasicTransformerBlock
from torch import nn

from drape.training.published.catvton_release import load_release
from drape.training.published.pretrained import (
    DenoiserSource,
    is_mounted,
    load_unet,
    map_pretrained,
    read_model_config,
    resolve_source,
)
from drape.training.published.weights import meta_shapes
from drape.training.recipes.latent import LatentModel, frozen_vae
from drape.training.recipes.model import Workload

if TYPE_CHECKING:
    from drape.config import PipelineConfig
    from drape.config.training import DenoiserConfig

# SD1.5-inpainting's unet/config.json: the shape `drape model describe` and the queue count when
# model.denoiser names no mounted checkpoint (the meta device needs no weights)
SD15_INPAINTING_UNET: dict[str, Any] = {
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 9,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
AXES = {"height": -2, "width": -1}
_CROSS_ATTENTION = re.compile(r"\.transformer_blocks\.\d+\.attn2\.")


def is_cross_attention(name: str) -> bool:
    """Whether a UNet parameter name belongs to the cross-attention CatVTON removes (attn2)."""
    return bool(_CROSS_ATTENTION.search(f".{name}"))


class SkippedCrossAttention(nn.Module):
    """In attn2's place: returns the (norm2-normalised) hidden states it is given, as CatVTON's
    `SkipAttnProcessor` does. No parameters; text embeddings and masks are ignored."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


def _is_attention(module: nn.Module | None) -> bool:
    return module is not None and not isinstance(module, SkippedCrossAttention)


def remove_cross_attention(unet: nn.Module) -> int:
    """Replace every transformer block's cross-attention by `SkippedCrossAttention` (CatVTON reads no
    text), so its parameters do not exist. Returns the blocks changed."""
    blocks: list[Any] = [m for m in unet.modules() if isinstance(m, BasicTransformerBlock) and _is_attention(m.attn2)]
    for block in blocks:
        block.attn2 = SkippedCrossAttention()
    return len(blocks)


def denoiser_source(denoiser: DenoiserConfig, pretrained: bool) -> DenoiserSource | None:
    """Where `model.denoiser`'s weights are (None: no path). For shapes alone (`pretrained` False) also
    None where the path is not mounted at all (the queue estimates off the GPU nodes); a path that is
    there but wrong is an error either way."""
    if denoiser.path is None:
        return None
    if not pretrained and not is_mounted(denoiser.path):
        return None
    return resolve_source(denoiser)


def unet_arguments(denoiser: DenoiserConfig, source: DenoiserSource | None) -> dict[str, Any]:
    """The UNet's constructor arguments: `source`'s config.json, else `model.denoiser.config`, else
    SD1.5-inpainting's; bounded on the meta device before the UNet is built."""
    if source is not None:
        field = "model.denoiser.base" if source.release else "model.denoiser.path"
        return read_model_config(source.unet, field)
    arguments = denoiser.config or SD15_INPAINTING_UNET
    meta_shapes(UNet2DConditionModel, arguments, "model.denoiser.config")
    return arguments


class CatVTON(LatentModel):
    """`catvton`: SD1.5-inpainting's UNet over [person | garment] latent canvases, no cross-attention."""

    unet: Any  # a UNet2DConditionModel

    @register_to_config
    def __init__(
        self,
        resolution: int | tuple[int, int] = 64,
        concat_axis: str = "height",
        unet_arguments: dict | None = None,
        vae_arguments: dict | None = None,
    ):
        super().__init__()
        if concat_axis not in AXES:
            raise ValueError(f"model.concat_axis must be one of {', '.join(AXES)}, got {concat_axis!r}")
        self.vae = frozen_vae(vae_arguments, resolution)
        self.unet = UNet2DConditionModel.from_config(self._layout(unet_arguments or SD15_INPAINTING_UNET))
        remove_cross_attention(self.unet)

    def _layout(self, arguments: dict) -> dict:
        """The UNet's arguments with the recipe's inputs (noisy latent, mask, masked person: 2c + 1
        channels); its output must already be the VAE's c latent channels."""
        channels = self.latent_channels
        if arguments.get("out_channels") != channels:
            raise ValueError(
                f"model.denoiser: the UNet predicts {arguments.get('out_channels')} channels, model.vae's latents have {channels}"
            )
        return {**arguments, "in_channels": 2 * channels + 1}

    @classmethod
    def from_drape_config(cls, config: PipelineConfig, *, pretrained: bool = True) -> CatVTON:
        """The recipe on `model.denoiser`'s UNet (its config.json; else `model.denoiser.config`, else
        SD1.5-inpainting's) and `model.vae`, the pretrained weights of both loaded when `pretrained`."""
        denoiser = config.model.denoiser
        source = denoiser_source(denoiser, pretrained)
        model: Any = cls._with_vae(
            config,
            pretrained,
            resolution=config.data.resolution,
            concat_axis=config.model.concat_axis,
            unet_arguments=unet_arguments(denoiser, source),
        )
        if pretrained and source is not None:
            model.load_denoiser(source, variant=denoiser.variant)
        return model

    def load_denoiser(self, source: DenoiserSource, *, variant: str | None = None) -> None:
        """The pretrained UNet of `source` into this one, read strictly: by the declared mapping (conv_in's
        inputs may grow, new ones zero), its cross-attention dropped; a CatVTON release over it after."""
        field = "model.denoiser.base" if source.release else "model.denoiser.path"
        checkpoint = load_unet(source.unet, variant=variant, dropped=is_cross_attention, field=field)
        self.unet.load_state_dict(map_pretrained(checkpoint, self.unet.state_dict(), dropped=is_cross_attention))
        if source.release is not None:
            load_release(self.unet, source.release, "model.denoiser.path")

    def condition(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The masked person and the garment as latents, the mask pooled to the latent grid (no pose)."""
        return {
            "agnostic": self.encode(inputs["agnostic"]),
            "mask": self.pooled_mask(inputs["mask"]),
            "garment": self.encode(inputs["garment"]),
        }

    def prepare(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """As every latent model's, less the pose a latent dataset stores for the models that read it."""
        clean, condition = super().prepare(inputs)
        condition.pop("pose", None)
        return clean, condition

    @torch.no_grad()
    def latent_fields(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every `drape.data.shards.LATENT_FIELDS`, the pose too: a latent dataset serves any model on this VAE."""
        return {**super().latent_fields(inputs), "pose_latent": self.encode(inputs["pose"])}

    def forward(self, noisy, timestep, agnostic, mask, garment) -> torch.Tensor:
        """The prediction for the person half of the canvas [person | garment]."""
        axis = AXES[self.config["concat_axis"]]
        canvas = torch.cat(
            [
                torch.cat([noisy, garment], dim=axis),
                torch.cat([mask, torch.zeros_like(mask)], dim=axis),
                torch.cat([agnostic, garment], dim=axis),
            ],
            dim=1,
        )
        prediction = self.unet(canvas, timestep, encoder_hidden_states=None, return_dict=False)[0]
        return prediction.narrow(axis, 0, noisy.shape[axis])

    def sharded_blocks(self) -> list[nn.Module]:
        return [*self.unet.down_blocks, self.unet.mid_block, *self.unet.up_blocks]

    def workload(self) -> Workload:
        """The canvas's latent positions × the widest level × the resnet layers of both paths (as latent-unet)."""
        height, width = self.latent_grid(self.config["resolution"])
        unet = self.unet.config
        return Workload(2 * height * width, unet.block_out_channels[-1], 2 * len(unet.block_out_channels) * unet.layers_per_block)

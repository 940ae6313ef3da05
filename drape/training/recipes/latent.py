"""Latent try-on models: the diffusion runs on the latents of a frozen diffusers `AutoencoderKL`.

Every try-on model in the field is latent diffusion. The VAE encodes the target, the agnostic
person, the pose map and the garment; the mask is pooled to the latent grid; the gates decode
samples to pixels. The VAE is frozen (`frozen_prefixes`): no stage trains it, whatever its
patterns say. `model.vae.path` loads real weights (SD3's vae/: 16 channels, 8× down), read
strictly by drape.training.published.weights (safetensors only, every tensor from a file, finite, its
config.json bounded before the VAE is built); unset, a fresh VAE shaped by `model.vae` (tests
fit one briefly with `fit_vae`). Its config is one of the model's constructor arguments and its
weights are in the checkpoint, so a checkpoint loads alone.

- `latent-dit` (`LatentTryOnTransformer`): pixel-dit's design (SD3 joint attention, garment
  tokens) on latents.
- `latent-unet` (`LatentTryOnUNet`): CatVTON's: a UNet2DConditionModel over person and garment
  latents concatenated side by side (width), mask and masked person on channels, no text: the
  cross-attention reads one learned null token and the self-attention (``attn1``) does the work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.configuration_utils import register_to_config
from torch import nn
from torch.nn import functional as F

from drape.config.data import height_width
from drape.training.published.weights import load_folder, meta_shapes, read_config, stored_dtype, tensor_headers
from drape.training.recipes.model import IMAGE_CHANNELS, TryOnModel, Workload
from drape.training.recipes.pixel import GarmentEncoder, JointAttentionDenoiser, dit_arguments, joint_transformer

if TYPE_CHECKING:
    from drape.config import PipelineConfig
    from drape.config.training import VaeConfig


def vae_config(vae: VaeConfig, resolution: int | tuple[int, int]) -> dict[str, Any]:
    """The AutoencoderKL constructor arguments of `model.vae`: read from `vae.path`'s config.json
    when set, else the fresh VAE its fields describe."""
    if vae.path is not None:  # bounded (values, and the VAE counted on the meta device) before it is built
        where = f"model.vae.path {vae.path}"
        arguments = read_config(Path(vae.path), where)
        meta_shapes(AutoencoderKL, arguments, where)
        return arguments
    blocks = len(vae.block_out_channels)
    return {
        "in_channels": IMAGE_CHANNELS,
        "out_channels": IMAGE_CHANNELS,
        "down_block_types": ["DownEncoderBlock2D"] * blocks,
        "up_block_types": ["UpDecoderBlock2D"] * blocks,
        "block_out_channels": list(vae.block_out_channels),
        "layers_per_block": vae.layers_per_block,
        "latent_channels": vae.latent_channels,
        "norm_num_groups": vae.norm_num_groups,
        "sample_size": max(height_width(resolution)),
        "scaling_factor": vae.scaling_factor,
        "shift_factor": vae.shift_factor,
        "mid_block_add_attention": vae.mid_block_attention,
    }


def load_vae(vae: Any, config: VaeConfig) -> None:
    """`config.path`'s weights into `vae`, read strictly (drape.training.published.weights: safetensors only, every
    tensor from a file, finite); upcast to float32, or kept as stored (`weights_dtype`)."""
    assert config.path is not None
    field = "model.vae.path"
    keep = config.weights_dtype == "stored"
    _, weights = load_folder(
        AutoencoderKL, Path(config.path), field, variant=config.variant, dtype=None if keep else torch.float32
    )
    if keep:
        entries = tensor_headers(Path(config.path), field, variant=config.variant)
        vae.to(stored_dtype(entries, f"{field} {config.path}"))
    vae.load_state_dict(weights)


def frozen_vae(arguments: dict[str, Any] | None, resolution: int | tuple[int, int]) -> Any:
    """The frozen AutoencoderKL of `arguments` (a model's stored `vae_arguments`), else the default `model.vae`'s."""
    if arguments is None:
        from drape.config.training import VaeConfig

        arguments = vae_config(VaeConfig(), resolution)
    vae = AutoencoderKL.from_config(arguments)
    vae.requires_grad_(False)
    return vae.eval()


class LatentModel(TryOnModel):
    """What both latent families share: the frozen VAE, encoding and decoding, the pooled mask."""

    frozen_prefixes = ("vae.",)
    clip_sample = False
    vae: Any  # an AutoencoderKL (mypy sees no ModelMixin methods on diffusers' classes)

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def latent_channels(self) -> int:
        return self.vae.config.latent_channels

    def latent_grid(self, resolution: int | tuple[int, int] | list[int]) -> tuple[int, int]:
        """(height, width) of the latents of images at `resolution`."""
        height, width = height_width(resolution)
        return height // self.downsample, width // self.downsample

    def train(self, mode: bool = True) -> LatentModel:
        super().train(mode)
        self.vae.eval()  # frozen: never in training mode
        return self

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] → scaled latents (the posterior's mode: deterministic, so resumed runs match)."""
        c = self.vae.config
        latents = self.vae.encode(images.to(self.vae.dtype)).latent_dist.mode()
        return ((latents - (c.shift_factor or 0.0)) * c.scaling_factor).to(images.dtype)

    @torch.no_grad()
    def decode(self, sample: torch.Tensor) -> torch.Tensor:
        c = self.vae.config
        latents = sample / c.scaling_factor + (c.shift_factor or 0.0)
        return self.vae.decode(latents.to(self.vae.dtype)).sample.to(sample.dtype)

    def pooled_mask(self, mask: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(mask, self.downsample)

    def condition(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The agnostic person, pose map and garment as latents; the mask pooled to the latent grid."""
        return {
            "agnostic": self.encode(inputs["agnostic"]),
            "mask": self.pooled_mask(inputs["mask"]),
            "pose": self.encode(inputs["pose"]),
            "garment": self.encode(inputs["garment"]),
        }

    def prepare(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """As `TryOnModel.prepare`; a batch of a latent dataset (`drape data encode`) is already encoded."""
        if "target_latent" in inputs:
            return inputs["target_latent"], {name: inputs[f"{name}_latent"] for name in ("agnostic", "mask", "pose", "garment")}
        return super().prepare(inputs)

    @torch.no_grad()
    def latent_fields(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a latent dataset stores per sample (`drape.data.shards.LATENT_FIELDS`): the batch as
        `prepare` would give it, encoded once."""
        clean, condition = self.prepare(inputs)
        return {"target_latent": clean, **{f"{name}_latent": value for name, value in condition.items()}}

    def sample_shape(self, inputs: dict[str, torch.Tensor]) -> tuple[int, ...]:
        batch, _, height, width = inputs["agnostic"].shape
        return (batch, self.latent_channels, height // self.downsample, width // self.downsample)

    @classmethod
    def _with_vae(cls, config: PipelineConfig, pretrained: bool, **arguments: Any) -> LatentModel:
        vae = config.model.vae
        if not pretrained and vae.path is not None and not Path(vae.path).exists():
            # shapes only (the queue estimates off the GPU nodes, where the weights are not mounted): model.vae's
            # fields; a path that is there but wrong is an error (`drape model describe` says which it showed)
            vae = vae.model_copy(update={"path": None})
        model: Any = cls(vae_arguments=vae_config(vae, config.data.resolution), **arguments)  # type: ignore[call-arg]
        if pretrained and config.model.vae.path is not None:
            load_vae(model.vae, config.model.vae)
        return model


class LatentTryOnTransformer(JointAttentionDenoiser, LatentModel):  # type: ignore[misc]  # as TryOnTransformer
    """`latent-dit`: SD3 joint attention over latent patches, garment latents as tokens."""

    @register_to_config
    def __init__(
        self,
        resolution: int | tuple[int, int] = 64,
        patch_size: int = 2,
        num_layers: int = 2,
        num_attention_heads: int = 4,
        attention_head_dim: int = 32,
        garment_patch_size: int = 2,
        vae_arguments: dict | None = None,
    ):
        super().__init__()
        self.vae = frozen_vae(vae_arguments, resolution)
        size, channels = self.latent_grid(resolution), self.latent_channels
        hidden = num_attention_heads * attention_head_dim
        self.garment_encoder = GarmentEncoder(size, garment_patch_size, hidden, channels=channels)
        self.transformer = joint_transformer(
            size,
            channels,
            channels,  # the pose map, encoded
            patch_size=patch_size,
            num_layers=num_layers,
            num_attention_heads=num_attention_heads,
            attention_head_dim=attention_head_dim,
        )

    @classmethod
    def from_drape_config(cls, config: PipelineConfig, *, pretrained: bool = True) -> LatentTryOnTransformer:
        return cls._with_vae(config, pretrained, **dit_arguments(config))  # type: ignore[return-value]

    def workload(self) -> Workload:
        return self.grid_workload(*self.latent_grid(self.config["resolution"]))


class LatentTryOnUNet(LatentModel):
    """`latent-unet`: CatVTON's layout. In: [noisy person | garment latents] side by side, with
    [agnostic | garment], [mask | 0] and [pose | 0] on channels; out: the person half."""

    unet: Any  # a UNet2DConditionModel

    @register_to_config
    def __init__(
        self,
        resolution: int | tuple[int, int] = 64,
        block_out_channels: tuple[int, ...] = (32, 64),
        attention: tuple[bool, ...] = (False, True),
        layers_per_block: int = 1,
        attention_head_dim: int = 8,
        norm_num_groups: int = 8,
        vae_arguments: dict | None = None,
    ):
        super().__init__()
        self.vae = frozen_vae(vae_arguments, resolution)
        channels, (height, width) = self.latent_channels, self.latent_grid(resolution)
        down = tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attention)
        up = tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attention))
        self.unet = UNet2DConditionModel(
            sample_size=(height, 2 * width),
            in_channels=3 * channels + 1,
            out_channels=channels,
            down_block_types=down,
            up_block_types=up,
            block_out_channels=tuple(block_out_channels),
            layers_per_block=layers_per_block,
            attention_head_dim=attention_head_dim,
            norm_num_groups=norm_num_groups,
            cross_attention_dim=block_out_channels[-1],
        )
        self.null_token = nn.Parameter(torch.zeros(1, 1, block_out_channels[-1]))  # no text: one learned token

    @classmethod
    def from_drape_config(cls, config: PipelineConfig, *, pretrained: bool = True) -> LatentTryOnUNet:
        u = config.model.unet
        return cls._with_vae(  # type: ignore[return-value]
            config,
            pretrained,
            resolution=config.data.resolution,
            block_out_channels=tuple(u.block_out_channels),
            attention=tuple(u.attention),
            layers_per_block=u.layers_per_block,
            attention_head_dim=u.attention_head_dim,
            norm_num_groups=u.norm_num_groups,
        )

    def forward(self, noisy, timestep, agnostic, mask, pose, garment) -> torch.Tensor:
        width = noisy.shape[-1]
        side = torch.cat(
            [
                torch.cat([noisy, garment], dim=-1),
                torch.cat([agnostic, garment], dim=-1),
                torch.cat([mask, torch.zeros_like(mask)], dim=-1),
                torch.cat([pose, torch.zeros_like(pose)], dim=-1),
            ],
            dim=1,
        )
        context = self.null_token.expand(noisy.shape[0], -1, -1)
        return self.unet(side, timestep, encoder_hidden_states=context, return_dict=False)[0][..., :width]

    def sharded_blocks(self) -> list[nn.Module]:
        return [*self.unet.down_blocks, *self.unet.up_blocks]

    def workload(self) -> Workload:
        c = self.config
        height, width = self.latent_grid(c["resolution"])
        return Workload(2 * height * width, c["block_out_channels"][-1], 2 * len(c["block_out_channels"]) * c["layers_per_block"])


def fit_vae(
    images: Iterator[torch.Tensor],
    config: dict[str, Any],
    steps: int,
    lr: float = 1e-2,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """Briefly fit a fresh AutoencoderKL (reconstruction + a light KL) on batches of images in
    [-1, 1], then set its shift and scaling factors so its latents have zero mean and unit
    variance: a stand-in VAE for tests and smoke runs, where no pretrained one is at hand. The
    same images, steps and seed give the same VAE."""
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKL.from_config(config)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=lr)
    for step in range(steps):
        batch = next(images)
        posterior = vae.encode(batch).latent_dist
        reconstruction = vae.decode(posterior.sample(generator)).sample
        loss = F.mse_loss(reconstruction, batch) + 1e-6 * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if progress:
            progress(step + 1, steps)
    vae.eval()
    with torch.no_grad():
        latents = torch.cat([vae.encode(next(images)).latent_dist.mode() for _ in range(4)])
    vae.register_to_config(shift_factor=float(latents.mean()), scaling_factor=float(1 / latents.std()))
    return vae


def synthetic_images(config: PipelineConfig, samples: int, batch_size: int = 16, seed: int = 0) -> Iterator[torch.Tensor]:
    """Endless shuffled batches of every image field (target, agnostic, pose, garment) of `samples`
    synthetic samples at the config's resolution, in [-1, 1]."""
    from drape.data.dataset import synthesize_split, to_model_inputs

    inputs = to_model_inputs(synthesize_split(config, "identity", samples))
    pool = torch.cat([inputs[name] for name in ("target", "agnostic", "pose", "garment")])
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield pool[torch.randint(0, len(pool), (batch_size,), generator=generator)]


def reconstruction_error(vae: Any, images: torch.Tensor) -> float:
    """Mean absolute error (in [-1, 1] units) of `images` through the VAE's encoder mode and decoder."""
    with torch.no_grad():
        return float((vae.decode(vae.encode(images).latent_dist.mode()).sample - images).abs().mean())

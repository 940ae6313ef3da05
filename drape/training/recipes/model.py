"""The model interface: what drape needs of a try-on model, and which model a config builds.

drape trains, gates, checkpoints and queues any `TryOnModel`: a diffusers `ModelMixin` +
`ConfigMixin` (so `save_pretrained` / `from_pretrained` write and read safetensors plus a
config.json of its constructor arguments) that says how a batch becomes the clean sample the
diffusion runs on (`prepare`: pixels, or VAE latents), what conditions the denoiser
(`condition`), how a sample becomes pixels (`decode`), which blocks FSDP shards, and what one
sample costs (`workload`, for the queue's memory profile). Which parameters a stage trains are
glob patterns over its parameter names (`train.stages.*.trainable`); a model's frozen parts
(`frozen_prefixes`, e.g. the VAE) never train whatever the patterns say.

A config selects the model: `model.kind` names a built-in (`BUILT_IN`), `model.class`
('package.module:Name') a model drape does not ship. A checkpoint's manifest names its class, so
it loads alone; a class that is not built in loads only when the caller's config names it
(a manifest is untrusted input and must not choose what code runs).
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from diffusers.configuration_utils import ConfigMixin
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from drape.config import DiffusionConfig
from drape.training.recipes.objective import build_noise_scheduler, build_objective, diffusion_target  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from drape.config import PipelineConfig

IMAGE_CHANNELS = 3
BUILT_IN = {
    "pixel-dit": "drape.training.recipes.pixel:TryOnTransformer",
    "latent-dit": "drape.training.recipes.latent:LatentTryOnTransformer",
    "latent-unet": "drape.training.recipes.latent:LatentTryOnUNet",
    "catvton": "drape.training.recipes.catvton:CatVTON",
}
# where the built-ins lived before drape/training was grouped into rooms: checkpoints saved then name these
MOVED = {path.replace(".recipes.", "."): path for path in BUILT_IN.values()}
PIXEL_DIT = BUILT_IN["pixel-dit"]  # what a checkpoint that names no class holds (written before the interface)


@dataclass(frozen=True)
class Workload:
    """What one sample costs the denoiser: tokens (or latent positions) × hidden width × layers."""

    tokens: int
    hidden: int
    layers: int


class TryOnModel(ModelMixin, ConfigMixin):
    """A try-on denoiser drape can train, gate and serve. Subclasses register their constructor
    arguments with diffusers' `@register_to_config` and implement the methods below."""

    frozen_prefixes: tuple[str, ...] = ()  # parameter-name prefixes that never train (a VAE)
    clip_sample: bool = True  # sampling clips predicted clean samples to [-1, 1] (pixels; latents are not bounded)

    @classmethod
    def from_drape_config(cls, config: PipelineConfig, *, pretrained: bool = True) -> TryOnModel:
        """A freshly initialised model for `config` (`model.*`, `data.resolution`), its pretrained
        parts (a VAE's `model.vae.path`) loaded; `pretrained` False: shapes only (the queue's
        estimate builds the model on the meta device)."""
        raise NotImplementedError(f"{cls.__name__}.from_drape_config")

    def condition(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The denoiser's keyword arguments besides the noisy sample and timestep, from model inputs
        in [-1, 1] (agnostic, mask, pose, garment)."""
        raise NotImplementedError

    def prepare(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the clean sample the diffusion runs on, the conditioning) of a training batch. Runs under
        no_grad on the unwrapped model: it may use frozen parts only."""
        return self.encode(inputs["target"]), self.condition(inputs)

    def latent_fields(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The `drape.data.shards.LATENT_FIELDS` of a batch, for a latent dataset (`drape data
        encode`) that `prepare` then reads as is. Models in pixel space have nothing to cache."""
        raise ValueError(f"{type(self).__name__} works in pixel space: there are no latents to cache (`drape data encode`)")

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] → the space the diffusion runs in (pixels: unchanged)."""
        return images

    def decode(self, sample: torch.Tensor) -> torch.Tensor:
        """A denoised sample → images in [-1, 1] (pixels: unchanged)."""
        return sample

    def sample_shape(self, inputs: dict[str, torch.Tensor]) -> tuple[int, ...]:
        """The shape of the noise sampling starts from, for a batch of conditioning inputs."""
        return tuple(inputs["agnostic"].shape)

    def sharded_blocks(self) -> list[nn.Module]:
        """The repeated blocks FSDP shards one by one (the root is sharded too)."""
        raise NotImplementedError

    def workload(self) -> Workload:
        raise NotImplementedError

    def frozen_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if name.startswith(self.frozen_prefixes)]

    def enable_denoiser_checkpointing(self) -> None:
        """Activation checkpointing on every diffusers submodule that supports it, frozen parts aside."""
        for name, module in self.named_modules():
            if module is not self and isinstance(module, ModelMixin) and module._supports_gradient_checkpointing:
                if not f"{name}.".startswith(self.frozen_prefixes):
                    module.enable_gradient_checkpointing()


def class_path(model: TryOnModel | type) -> str:
    cls = model if isinstance(model, type) else type(model)
    return f"{cls.__module__}:{cls.__qualname__}"


def configured_class_path(config: PipelineConfig) -> str:
    return config.model.class_ or BUILT_IN[config.model.kind]


def resolve_class(path: str, allowed: tuple[str, ...] = ()) -> type[TryOnModel]:
    """The `TryOnModel` subclass at 'package.module:Name': a built-in (by its path now or before the
    move into rooms, `MOVED`), or one of `allowed`."""
    path = MOVED.get(path, path)
    if path not in BUILT_IN.values() and path not in allowed:
        raise ValueError(
            f"model class {path!r} is neither built in ({', '.join(BUILT_IN)}) nor the configured model.class "
            f"({', '.join(allowed) or 'none'}): set model.class to load it"
        )
    module_name, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"model.class {path!r}: cannot import it ({error})") from error
    if not (isinstance(cls, type) and issubclass(cls, TryOnModel)):
        raise ValueError(f"model.class {path!r} is not a drape.training.recipes.model.TryOnModel subclass")
    return cls


def build_model(config: PipelineConfig, *, pretrained: bool = True) -> TryOnModel:
    """A freshly initialised model of `config`'s kind or class, its weights a function of
    `config.seed` (`pretrained` False: pretrained parts are not read, for shapes alone)."""
    path = configured_class_path(config)
    cls = resolve_class(path, (path,))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = cls.from_drape_config(config, pretrained=pretrained)
    if not isinstance(model, TryOnModel):
        raise ValueError(f"{path}.from_drape_config returned {type(model).__name__}, not a TryOnModel")
    return model


def trainable_parameter_names(patterns: list[str], names: list[str], frozen: tuple[str, ...] = ()) -> list[str]:
    """Parameter names matched by any glob pattern of a stage's `trainable` (``*`` matches
    everything), less those under a `frozen` prefix."""
    return [name for name in names if any(fnmatch.fnmatchcase(name, p) for p in patterns) and not name.startswith(frozen)]


def noise_seed(seed: int, index: int) -> int:
    """The seed of sample `index`'s starting noise under `seed`: a hash of both, so that neighbouring
    seeds share no sample's noise (with seed + index, seed 1's sample 0 would be seed 0's sample 1)."""
    digest = hashlib.sha256(f"drape-noise/{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # under 2**63: any torch generator takes it


def initial_noise(shape: tuple[int, ...], seed: int, first_index: int = 0) -> torch.Tensor:
    """Standard normal noise of `shape` (N, ...) on the CPU, row i from its own generator
    (`noise_seed(seed, first_index + i)`): a sample's noise, hence its output, is the same whichever
    batch it is drawn in (the gate renders its control set in chunks, `gates.batch_size`)."""
    rows = [
        torch.randn(shape[1:], generator=torch.Generator(device="cpu").manual_seed(noise_seed(seed, first_index + i)))
        for i in range(shape[0])
    ]
    return torch.stack(rows)


def unconditional(
    condition: dict[str, torch.Tensor], names: Sequence[str], drop: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """`condition` with `names` zeroed (the null condition of classifier-free guidance, as CatVTON
    zeroes the garment's latent), in every row or in the rows where `drop` is true."""
    nulled = dict(condition)
    for name in names:
        value = condition[name]
        if drop is None:
            nulled[name] = torch.zeros_like(value)
        else:
            nulled[name] = torch.where(drop.to(value.device).reshape(-1, *([1] * (value.ndim - 1))), 0, value)
    return nulled


def guided_prediction(
    model: TryOnModel, diffusion: DiffusionConfig, current: torch.Tensor, t: torch.Tensor, condition: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The model's prediction; with `diffusion.guidance_scale` s > 1 classifier-free guided: the
    unconditional and conditional passes in one batch, combined as uncond + s · (cond − uncond)."""
    scale = diffusion.guidance_scale
    if scale == 1:
        return model(current, t, **condition)
    null = unconditional(condition, diffusion.guidance_conditions)
    both = {name: torch.cat([null[name], value]) for name, value in condition.items()}
    uncond, cond = model(torch.cat([current, current]), torch.cat([t, t]), **both).chunk(2)
    return uncond + scale * (cond - uncond)


@torch.no_grad()
def sample(
    model: TryOnModel,
    diffusion: DiffusionConfig,
    inputs: dict[str, torch.Tensor],
    *,
    seed: int,
    first_index: int = 0,
    num_steps: int | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """Generate try-on images in [-1, 1] for a batch of conditioning inputs, deterministically per seed.

    The sampler is the objective's (`diffusion.objective`: DDIM, or FlowMatchEuler), guided when
    `diffusion.guidance_scale` is above 1 (`guided_prediction`). Each sample starts from its own
    noise (`initial_noise`): row i of the batch is sample `first_index + i` of a larger set, and
    renders as it would in a batch of any size. `on_phase` hears "denoise" as the loop starts and
    "decode" as it ends (the inference stick times the denoising alone between the two)."""
    objective = build_objective(diffusion)
    scheduler = objective.sampler(model.clip_sample)
    scheduler.set_timesteps(num_steps or diffusion.sampling_steps)
    agnostic = inputs["agnostic"]
    was_training = model.training
    model.eval()
    condition = model.condition(inputs)
    current = initial_noise(model.sample_shape(inputs), seed, first_index).to(agnostic.device, agnostic.dtype)
    if on_phase:
        on_phase("denoise")
    for timestep in scheduler.timesteps:
        t = objective.model_timesteps(timestep, agnostic.shape[0], agnostic.device)
        prediction = guided_prediction(model, diffusion, current, t, condition)
        current = scheduler.step(prediction, timestep, current).prev_sample
    if on_phase:
        on_phase("decode")
    model.train(was_training)
    return model.decode(current).clamp(-1, 1)

"""Config of the model, the diffusion schedule and each stage's training."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from drape import STAGES
from drape.config.base import StageName, StrictModel, mounted

ModelKind = Literal["pixel-dit", "latent-dit", "latent-unet", "catvton"]
LATENT_KINDS = ("latent-dit", "latent-unet", "catvton")  # diffuse the latents of model.vae
UNET_KINDS = ("latent-unet", "catvton")  # convolutional: no patch size to divide the latents
PRETRAINED_KINDS = ("catvton",)  # recipes whose denoiser starts from model.denoiser
ConditionName = Literal["agnostic", "mask", "pose", "garment"]  # what the built-in models condition on
WeightsVariant = Literal["fp16", "bf16"]  # the weight-file variants the hub ships beside the float32 files
# diffusers.optimization's schedules that are a LambdaLR of the step alone (resume sets the step)
LrSchedulerName = Literal["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"]


class VaeConfig(StrictModel):
    """The frozen autoencoder of a latent model (`model.kind: latent-*`)."""

    path: str | None = Field(
        default=None,
        description=(
            "a diffusers AutoencoderKL directory (config.json + safetensors, one file or shards beside an index; "
            "never pickle), e.g. SD3's vae/; unset: a fresh one shaped by the fields below (tests, smoke runs)"
        ),
        json_schema_extra=mounted("model"),
    )
    variant: WeightsVariant | None = Field(
        default=None,
        description="read diffusion_pytorch_model.<variant>.safetensors (the hub's fp16 / bf16 files) instead of the plain one",
    )
    weights_dtype: Literal["float32", "stored"] = Field(
        default="float32",
        description=(
            "float32: the VAE's weights upcast on load; stored: kept in the dtype the files hold (an fp16 variant: half "
            "the memory; the VAE is frozen, so nothing trains in it)"
        ),
    )
    latent_channels: int = Field(default=16, gt=0, description="SD3 and FLUX use 16")
    block_out_channels: list[int] = Field(default=[32, 64], min_length=1, description="each block after the first halves H and W")
    layers_per_block: int = Field(default=1, gt=0, description="ResNet layers per encoder and decoder block")
    norm_num_groups: int = Field(default=8, gt=0, description="GroupNorm groups (dividing every block's channels)")
    scaling_factor: float = Field(default=1.0, gt=0, description="latents = (z - shift_factor) * scaling_factor")
    shift_factor: float = Field(default=0.0, description="subtracted before scaling (SD3: 0.0609; SD1.5: 0)")
    mid_block_attention: bool = Field(
        default=False, description="an attention layer in the encoder's and decoder's mid block (SD's and SD3's VAEs: true)"
    )

    @property
    def downsample(self) -> int:
        """Pixels per latent along each side."""
        return 2 ** (len(self.block_out_channels) - 1)


class UNetConfig(StrictModel):
    """The denoiser of `model.kind: latent-unet` (a CatVTON-style UNet2DConditionModel)."""

    block_out_channels: list[int] = Field(default=[32, 64], min_length=1, description="per level, highest resolution first")
    attention: list[bool] = Field(
        default=[False, True],
        description="per level: whether it has attention blocks (SD1.5: all but the lowest; tiny CPU runs: the lowest only)",
    )
    layers_per_block: int = Field(default=1, gt=0, description="ResNet layers per down and up block")
    attention_head_dim: int = Field(default=8, gt=0, description="channels per attention head")
    norm_num_groups: int = Field(default=8, gt=0, description="GroupNorm groups (dividing every level's channels)")

    @model_validator(mode="after")
    def _a_flag_per_level(self) -> UNetConfig:
        if len(self.attention) != len(self.block_out_channels):
            raise ValueError(
                f"model.unet.attention has {len(self.attention)} flags, block_out_channels {len(self.block_out_channels)} levels"
            )
        if not any(self.attention):
            raise ValueError(
                "model.unet.attention: at least one level needs attention (the self-attention is what try-on trains)"
            )
        return self


class DenoiserConfig(StrictModel):
    """Where a recipe's denoiser (`model.kind: catvton`) starts from: pretrained weights, never a download."""

    path: str | None = Field(
        default=None,
        description=(
            "a local diffusers folder (config.json + diffusion_pytorch_model.safetensors or shards beside its "
            ".index.json, or one holding unet/), a hub id found in the local Hugging Face cache (nothing is "
            "downloaded), or CatVTON's release (a folder holding attention/model.safetensors) over `base`; "
            "unset: random weights shaped by `config` (tests, smoke runs)"
        ),
        json_schema_extra=mounted("model"),
    )
    base: str | None = Field(
        default=None,
        description=(
            "where `path` is CatVTON's attention-only release: the diffusers UNet folder (or hub id) it goes over, "
            "SD1.5-inpainting's unet/"
        ),
        json_schema_extra=mounted("model"),
    )
    variant: WeightsVariant | None = Field(
        default=None,
        description=(
            "read diffusion_pytorch_model.<variant>.safetensors (the hub's fp16 / bf16 files) instead of the plain one; "
            "the denoiser trains, so its weights are always upcast to float32 master weights"
        ),
    )
    config: dict[str, Any] | None = Field(
        default=None,
        description=(
            "the denoiser's constructor arguments (its config.json) where `path` is unset or not mounted "
            "(the queue's estimate builds on the meta device); unset: the recipe's (catvton: SD1.5-inpainting's UNet)"
        ),
    )


class ModelConfig(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    kind: ModelKind = Field(default="pixel-dit", description="a built-in model (drape/training/recipes/model.py BUILT_IN)")
    class_: str | None = Field(
        default=None,
        alias="class",
        description="'package.module:Name', a drape.training.recipes.model.TryOnModel subclass drape does not ship; "
        "replaces kind",
    )
    options: dict[str, Any] = Field(default={}, description="keyword arguments an outside model's from_drape_config reads")
    patch_size: int = Field(
        default=4, gt=0, description="DiT kinds: pixels (or latents) per side of one image token; must divide the resolution"
    )
    num_layers: int = Field(default=2, gt=0, description="DiT kinds: transformer blocks")
    num_attention_heads: int = Field(default=4, gt=0, description="DiT kinds: attention heads per block")
    attention_head_dim: int = Field(default=32, gt=0, description="DiT kinds: channels per head (width = heads × this)")
    garment_patch_size: int = Field(default=8, gt=0, description="DiT kinds: pixels (or latents) per side of one garment token")
    pose_channels: int = Field(default=3, gt=0, description="pixel-dit: channels of the pose map it is conditioned on")
    concat_axis: Literal["height", "width"] = Field(
        default="height",
        description="catvton: the latent axis person and garment are concatenated along (CatVTON's code: height)",
    )
    vae: VaeConfig = Field(default=VaeConfig(), description="the frozen autoencoder of latent kinds")
    unet: UNetConfig = Field(default=UNetConfig(), description="the denoiser of kind latent-unet")
    denoiser: DenoiserConfig = Field(default=DenoiserConfig(), description="where catvton's pretrained denoiser starts from")

    @field_validator("class_")
    @classmethod
    def _import_path(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            raise ValueError(f"model.class must be 'package.module:Name', got {value!r}")
        return value

    @model_validator(mode="after")
    def _denoiser_is_read(self) -> ModelConfig:
        if self.denoiser != DenoiserConfig() and (self.class_ is not None or self.kind not in PRETRAINED_KINDS):
            raise ValueError(
                f"model.denoiser is set but {self.class_ or self.kind} does not read it "
                f"(recipes from a pretrained denoiser: {', '.join(PRETRAINED_KINDS)})"
            )
        return self

    @property
    def latent(self) -> bool:
        return self.class_ is None and self.kind in LATENT_KINDS

    @property
    def downsample(self) -> int:
        """Pixels per element of the space the denoiser works in (1 in pixel space)."""
        return self.vae.downsample if self.latent else 1


class DiffusionConfig(StrictModel):
    """The diffusion a model trains and samples with (drape/training/recipes/objective.py): DDPM noising
    (`prediction_type` its target, DDIM sampling) or rectified flow matching (SD3 / FitDiT: velocity
    target, logit-normal timesteps, FlowMatchEulerDiscreteScheduler sampling), and sampling guidance."""

    objective: Literal["ddpm", "flow_matching"] = Field(
        default="ddpm",
        description="ddpm: DDPMScheduler noising, DDIM sampling; flow_matching: x_t = (1 - t)·x0 + t·noise, target noise - x0",
    )
    num_train_timesteps: int = Field(default=1000, gt=0, description="ddpm: timesteps of the training schedule")
    prediction_type: Literal["sample", "epsilon", "v_prediction"] = Field(default="sample", description="ddpm only")
    beta_schedule: Literal["linear", "scaled_linear", "squaredcos_cap_v2"] = Field(
        default="squaredcos_cap_v2",
        description="ddpm: diffusers' beta schedule (SD1.5: scaled_linear; squaredcos_cap_v2: cosine)",
    )
    beta_start: float = Field(
        default=0.0001, gt=0, lt=1, description="linear / scaled_linear: the first beta (SD1.5: 0.00085; diffusers' default)"
    )
    beta_end: float = Field(default=0.02, gt=0, lt=1, description="linear / scaled_linear: the last beta (SD1.5: 0.012)")

    logit_mean: float = Field(
        default=0.0, ge=-5, le=5, description="flow_matching: training t = sigmoid(N(logit_mean, logit_std)) (SD3: 0)"
    )
    logit_std: float = Field(default=1.0, gt=0, le=5, description="flow_matching: see logit_mean (SD3: 1)")
    flow_shift: float = Field(
        default=1.0, gt=0, le=20, description="flow_matching sampling: FlowMatchEulerDiscreteScheduler's shift (SD3: 3.0)"
    )
    sampling_steps: int = Field(default=10, gt=0, description="denoising steps when sampling (gate outputs, try-ons)")
    guidance_scale: float = Field(
        default=1.0,
        ge=1,
        le=30,
        description="classifier-free guidance at sampling; 1: none (one pass), above 1: a conditional and an unconditional pass",
    )
    guidance_conditions: list[ConditionName] = Field(
        default=["garment"],
        min_length=1,
        description="what the unconditional pass zeroes (CatVTON: the garment); train with train.cfg_dropout on them",
    )

    @model_validator(mode="after")
    def _betas_grow(self) -> DiffusionConfig:
        if self.beta_start >= self.beta_end:
            raise ValueError(f"diffusion.beta_start {self.beta_start} must be below diffusion.beta_end {self.beta_end}")
        return self

    @model_validator(mode="after")
    def _settings_of_the_objective(self) -> DiffusionConfig:
        changed = [name for name, field in type(self).model_fields.items() if getattr(self, name) != field.default]
        ddpm_only = {"prediction_type", "beta_schedule", "beta_start", "beta_end"} & set(changed)
        flow_only = {"logit_mean", "logit_std", "flow_shift"} & set(changed)
        if self.objective == "flow_matching" and ddpm_only:
            raise ValueError(
                f"diffusion.{sorted(ddpm_only)[0]} is a ddpm setting; diffusion.objective flow_matching predicts the velocity"
            )
        if self.objective == "ddpm" and flow_only:
            raise ValueError(f"diffusion.{sorted(flow_only)[0]} is a flow_matching setting; diffusion.objective is ddpm")
        return self


class StageTrainConfig(StrictModel):
    steps: int = Field(gt=0, description="steps of this stage in a full run")
    finetune_steps: int = Field(default=550, gt=0, description="steps of a fine-tune pass")
    trainable: list[str] = Field(min_length=1, description="glob patterns over parameter names")
    lr: float | None = Field(default=None, gt=0, description="this stage's peak learning rate; unset: train.lr")
    gpus: int | None = Field(default=None, gt=0, le=1024, description="GPUs of this stage's job; default train.gpus")


class EmaConfig(StrictModel):
    enabled: bool = Field(default=False, description="keep an exponential moving average of the weights (saved and gated)")
    decay: float = Field(default=0.999, gt=0, lt=1, description="the average's decay per step (0.9999: ~10,000 steps)")


class LoraConfig(StrictModel):
    """LoRA fine-tune passes (peft, drape/training/checkpoints/lora.py): with `enabled`, `--mode finetune` freezes
    the baseline and trains low-rank adapters on the nn.Linear layers each stage's `trainable`
    patterns select; the adapter is saved apart (a few MB) and merged into the checkpoint the gate
    and promotion read. Full runs never use it."""

    enabled: bool = Field(default=False, description="fine-tune passes (--mode finetune) train LoRA adapters instead of weights")
    rank: int = Field(default=8, gt=0, le=1024, description="the adapters' rank")
    alpha: float | None = Field(default=None, gt=0, description="the update is scaled by alpha / rank; default rank (scale 1)")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="dropout on the adapters' input")
    lr: float | None = Field(default=None, gt=0, description="the adapters' learning rate; default the stage's")


class TrainConfig(StrictModel):
    batch_size: int = Field(
        default=16, gt=0, description="the global batch of one optimizer step, over all GPUs and accumulated micro-batches"
    )
    grad_accumulation_steps: int = Field(
        default=1,
        gt=0,
        le=1024,
        description=(
            "micro-batches per optimizer step: each GPU runs batch_size / (GPUs × grad_accumulation_steps) samples "
            "at a time, the same batch and draws as without accumulation"
        ),
    )
    lr: float = Field(default=1e-3, gt=0, description="the peak learning rate (after warmup)")
    lr_scheduler: LrSchedulerName = Field(
        default="constant", description="diffusers.optimization.get_scheduler's schedule over the stage's steps"
    )
    lr_warmup_steps: int = Field(default=0, ge=0, description="steps of linear warmup (not with the plain constant schedule)")
    optimizer: Literal["adamw", "adamw8bit"] = Field(
        default="adamw", description="adamw8bit: bitsandbytes' 8-bit AdamW (CUDA and bitsandbytes installed, else an error)"
    )
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW's decoupled weight decay")
    grad_clip: float = Field(default=1.0, gt=0, description="the gradients' global norm is clipped to this")
    loss_weighting: Literal["none", "min_snr"] = Field(
        default="none", description="min_snr: Min-SNR-γ (Hang et al. 2023) per sample, diffusion.objective ddpm only"
    )
    min_snr_gamma: float = Field(default=5.0, gt=0, le=100, description="min_snr: γ of min(SNR, γ) (the paper: 5)")
    cfg_dropout: dict[ConditionName, Annotated[float, Field(ge=0, lt=1)]] = Field(
        default={},
        description=(
            "per condition, the probability a sample's condition is zeroed in training (classifier-free guidance; "
            "CatVTON: garment 0.1); drawn from the step's generator"
        ),
    )
    ema: EmaConfig = Field(default=EmaConfig(), description="an exponential moving average of the weights")
    lora: LoraConfig = Field(default=LoraConfig(), description="LoRA adapters for fine-tune passes")
    checkpoint_every: int = Field(
        default=50, gt=0, description="steps between intermediate checkpoints (a stage's last step always saves)"
    )
    log_every: int = Field(default=10, gt=0, description="steps between logged metrics (loss, throughput, data-wait)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="where training runs; auto: CUDA when there is one"
    )
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="bf16: autocast in bfloat16 (CUDA), fp32 master weights"
    )
    parallelism: Literal["ddp", "fsdp"] = Field(default="ddp", description="under torchrun: DDP, or FSDP2 fully_shard")
    gradient_checkpointing: bool = Field(
        default=False, description="recompute activations in the backward pass: less memory, about a third more compute"
    )
    async_checkpoint: bool = Field(default=True, description="under torchrun: DCP saves in the background")
    checkpoint_moments: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description=(
            "the dtype a safetensors checkpoint stores AdamW's moments in; bfloat16 halves them (CatVTON's stage "
            "checkpoint 0.79 → 0.60 GB) but is lossy: each moment is rounded to 8 significant bits, so a stage "
            "resumed from it no longer matches an uninterrupted one bit for bit (DCP intermediates keep float32)"
        ),
    )
    checkpoint_compression: Literal["planes", "none"] = Field(
        default="planes",
        description=(
            "how a safetensors checkpoint keeps its stage, optimizer and EMA files: planes packs each losslessly in "
            "byte planes (zstd, as ZipNN: CatVTON's stage checkpoint 0.79 → 0.66 GB), read back and verified bit for "
            "bit before the checkpoint is published; none keeps plain safetensors files"
        ),
    )
    data_partitions: int | None = Field(
        default=None,
        gt=0,
        description=(
            "disjoint shard groups the global batch is drawn from (drape/data/partition.py); default the world size. "
            "Fix it, a multiple of every world size you use, to train identically on any number of ranks"
        ),
    )
    gpus: int = Field(
        default=1,
        gt=0,
        le=1024,
        description="GPUs (ranks) of each stage job through the queue; above 1 the job runs under torchrun",
    )
    stages: dict[StageName, StageTrainConfig] = Field(
        description="every stage (identity, texture, geometry, denoise): its steps and the parameters it trains"
    )

    def gpus_for(self, stage: str) -> int:
        """The ranks of `stage`'s job: its own `gpus`, else `train.gpus`."""
        return self.stages[stage].gpus or self.gpus

    @model_validator(mode="after")
    def _all_stages_configured(self) -> TrainConfig:
        missing = [stage for stage in STAGES if stage not in self.stages]
        if missing:
            raise ValueError(f"stages must configure every stage; missing {missing}")
        for stage in STAGES:
            gpus = self.gpus_for(stage)
            if self.batch_size % gpus:
                raise ValueError(f"train.batch_size {self.batch_size} does not split over {stage}'s {gpus} GPUs")
            if self.batch_size % (gpus * self.grad_accumulation_steps):
                raise ValueError(
                    f"train.batch_size {self.batch_size} does not split into train.grad_accumulation_steps "
                    f"{self.grad_accumulation_steps} micro-batches on each of {stage}'s {gpus} GPUs"
                )
            if self.data_partitions is not None and self.data_partitions % gpus:
                raise ValueError(
                    f"train.data_partitions {self.data_partitions} is not a multiple of {stage}'s {gpus} GPUs "
                    "(each rank holds whole partitions)"
                )
        return self

    @model_validator(mode="after")
    def _warmup_fits(self) -> TrainConfig:
        if self.lr_warmup_steps and self.lr_scheduler == "constant":
            raise ValueError("train.lr_warmup_steps is set; train.lr_scheduler constant has no warmup: use constant_with_warmup")
        for stage, stage_config in self.stages.items():
            shortest = min(stage_config.steps, stage_config.finetune_steps)
            if self.lr_warmup_steps >= shortest:
                raise ValueError(
                    f"train.lr_warmup_steps {self.lr_warmup_steps} must be below {stage}'s {shortest} steps "
                    "(its steps and finetune_steps): the schedule would never reach train.lr"
                )
        return self

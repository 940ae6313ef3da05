"""What a stage run trains and where it resumes: the model, its trainable parameters, optimizer and EMA.

A stage resumes from the newest checkpoint in its ``checkpoints/`` (sharded or whole), else starts
from the checkpoint it was given (the previous stage's baseline, or CatVTON's released attention
weights over the config's base UNet) or fresh weights. A LoRA
fine-tune pass (`drape.training.checkpoints.lora`) trains adapters on a frozen base instead, and resumes from
its newest adapter checkpoint in ``adapters/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR

from drape import stage_index
from drape.config import PipelineConfig
from drape.layout import StagePaths, checkpoint_step, is_sharded_checkpoint
from drape.training.checkpoints.checkpoint import list_checkpoints, load_model, load_training_state
from drape.training.checkpoints.lora import (
    LoraPass,
    adapter_step,
    attach,
    base_digest,
    load_adapter,
    lora_targets,
    newest_adapter,
)
from drape.training.loop.distributed import DistContext, load_sharded, unwrap, wrap_model
from drape.training.loop.optim import build_optimizer
from drape.training.published.catvton_release import is_release, load_release
from drape.training.recipes.model import TryOnModel, build_model, configured_class_path, trainable_parameter_names


@dataclass
class TrainingState:
    """What a stage trains and where it resumes: model (wrapped), optimizer and its schedule, EMA, the first step."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    names: list[str]  # the trainable parameters
    parameters: dict[str, torch.nn.Parameter]
    ema: dict[str, torch.Tensor] | None
    start_step: int
    resumed_from: Path | None  # the whole checkpoint it resumed from (None: started, or resumed from DCP or an adapter)
    lora: LoraPass | None = None  # a LoRA pass: what it adapts
    lr_schedule: LambdaLR | None = None  # the learning rate per step (`drape.training.loop.optim.lr_schedule`), set at start_step


def resume_point(checkpoints_dir: Path) -> Path | None:
    """The newest checkpoint in `checkpoints_dir` (sharded or whole): where a stage resumes."""
    existing = list_checkpoints(checkpoints_dir)
    return existing[-1] if existing else None


def resume_step(stage_dir: str | Path, *, lora: bool = False) -> int:
    """The step a stage run in `stage_dir` goes on from: its newest checkpoint's; in a LoRA pass,
    which writes a whole checkpoint only at its end, the newest adapter's until then."""
    paths = StagePaths(Path(stage_dir))
    newest = resume_point(paths.checkpoints)
    if newest is not None:
        return checkpoint_step(newest)
    return adapter_step(paths.adapters) if lora else 0


def _configure_trainable(model: TryOnModel, patterns: list[str]) -> list[str]:
    names = trainable_parameter_names(patterns, [name for name, _ in model.named_parameters()], model.frozen_prefixes)
    if not names:
        raise ValueError(
            f"train.stages: trainable patterns {patterns} match no trainable parameter of {type(model).__name__} "
            f"(`drape model describe` lists them)"
        )
    chosen = set(names)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in chosen)
    return names


def _optimizer(config: PipelineConfig, stage: str, model: torch.nn.Module, names: list[str], lr: float | None = None):
    """`train.optimizer` over `names` of the (wrapped) model, and a fresh EMA of them when EMA is on."""
    train = config.train
    parameters = dict(unwrap(model).named_parameters())
    optimizer = build_optimizer(train, [parameters[n] for n in names], lr or train.stages[stage].lr or train.lr)
    ema = {n: parameters[n].detach().clone() for n in names} if train.ema.enabled else None
    return parameters, optimizer, ema


def _start_model(config: PipelineConfig, source: str | Path | None) -> TryOnModel:
    """The model a stage starts (or resumes) from: a drape checkpoint, CatVTON's release layout over the
    config's base (`drape train --init <release>`: the recipe built, its self-attention read from the
    release strictly), or fresh weights."""
    if source is None:
        return build_model(config)
    if is_release(source):
        if config.model.class_ is not None or config.model.kind != "catvton":
            raise ValueError(f"--init {source} is CatVTON's release layout: only model.kind catvton starts from it")
        model = build_model(config)
        load_release(model.unet, Path(source), "--init")
        return model
    return load_model(source, allowed=(configured_class_path(config),))


def prepare_training(
    config: PipelineConfig,
    stage: str,
    stage_dir: str | Path,
    init_checkpoint: str | Path | None,
    context: DistContext,
    *,
    lora: bool = False,
) -> TrainingState:
    """Model, optimizer and EMA for `stage`, resumed from the newest checkpoint in `stage_dir`
    (sharded or whole), else started from `init_checkpoint` or fresh weights. With `lora`, adapters
    on `init_checkpoint` (`drape.training.checkpoints.lora`) unless the pass already wrote its merged checkpoint."""
    paths, train = StagePaths(Path(stage_dir)), config.train
    resume_from = resume_point(paths.checkpoints)
    if lora and resume_from is None:
        return _prepare_lora(config, stage, paths.adapters, init_checkpoint, context)
    sharded_resume = resume_from is not None and is_sharded_checkpoint(resume_from)
    source = init_checkpoint if sharded_resume or resume_from is None else resume_from
    plain = _start_model(config, source)
    model: torch.nn.Module = plain.to(context.device)  # type: ignore[arg-type]
    if train.gradient_checkpointing:
        plain.enable_denoiser_checkpointing()
    names = _configure_trainable(plain, train.stages[stage].trainable)
    model = wrap_model(model, context, train.parallelism, bf16=train.precision == "bf16")
    parameters, optimizer, ema = _optimizer(config, stage, model, names)
    if resume_from is not None and sharded_resume:
        load_sharded(resume_from, model, optimizer, ema)
    elif resume_from is not None:
        restored = load_training_state(resume_from, optimizer, names)
        if ema is not None and restored is not None:
            ema = {n: restored[n].to(context.device) for n in names}
    start = checkpoint_step(resume_from) if resume_from is not None else 0
    return TrainingState(model, optimizer, names, parameters, ema, start, resume_from)


def _prepare_lora(
    config: PipelineConfig, stage: str, adapters: Path, init_checkpoint: str | Path | None, context: DistContext
) -> TrainingState:
    """Adapters on the frozen base `init_checkpoint`, resumed from the newest adapter checkpoint."""
    if init_checkpoint is None:
        raise ValueError(f"stage {stage}: a LoRA pass adapts a baseline and none was given (train the stage in full mode first)")
    plain = load_model(init_checkpoint, allowed=(configured_class_path(config),))
    targets = tuple(lora_targets(plain, config.train.stages[stage].trainable))
    spec = LoraPass(config.train.lora, targets, base_digest(init_checkpoint))
    names = attach(plain, spec, seed=config.seed * 1_000_003 + stage_index(stage))
    model: torch.nn.Module = plain.to(context.device)  # type: ignore[arg-type]
    if config.train.gradient_checkpointing:
        plain.enable_denoiser_checkpointing()
    model = wrap_model(model, context, "ddp", bf16=config.train.precision == "bf16")  # the frozen base needs no sharding
    parameters, optimizer, ema = _optimizer(config, stage, model, names, lr=config.train.lora.lr)
    resume_from = newest_adapter(adapters)
    if resume_from is not None:
        restored = load_adapter(resume_from, model=unwrap(model), spec=spec, optimizer=optimizer, names=names)
        if ema is not None and restored is not None:
            ema = {n: restored[n].to(context.device) for n in names}
    start = checkpoint_step(resume_from) if resume_from is not None else 0
    return TrainingState(model, optimizer, names, parameters, ema, start, None, spec)

"""The optimizer and learning-rate schedule of a stage (`train.optimizer`, `train.lr_scheduler`).

AdamW is torch's; ``adamw8bit`` is bitsandbytes' 8-bit AdamW (IDM-VTON's choice: a quarter of the
moments' memory), imported only when chosen. It needs CUDA and bitsandbytes installed: without
either the stage fails before it starts, naming `train.optimizer`, never falling back silently.

The schedule is diffusers' `get_scheduler` over the stage's steps: warmup for `lr_warmup_steps`,
then constant, linear, cosine… decay. Every schedule offered is a `LambdaLR`, whose rate is
base_lr × lambda(step): a function of the step alone. A checkpoint carries its config and step,
so a resumed stage sets the schedule to that step (`lr_schedule`) and goes on at exactly the rate
an uninterrupted run has there, whether it resumes from a whole or a sharded (DCP) checkpoint.
Gradient accumulation needs no state either: it happens within an optimizer step
(`drape.training.loop.step`), and checkpoints fall between steps.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from diffusers.optimization import get_scheduler
from torch.optim.lr_scheduler import LambdaLR

from drape.config import TrainConfig


def check_optimizer(train: TrainConfig, device: torch.device) -> None:
    """Refuse a `train.optimizer` this process cannot run (adamw8bit: CUDA and bitsandbytes)."""
    if train.optimizer != "adamw8bit":
        return
    if device.type != "cuda":
        raise RuntimeError(f"train.optimizer adamw8bit runs on CUDA only (bitsandbytes); this stage trains on {device.type}")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as error:
        raise RuntimeError(
            f"train.optimizer adamw8bit needs bitsandbytes installed (pip install bitsandbytes): {error}"
        ) from None


def build_optimizer(train: TrainConfig, parameters: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """`train.optimizer` over `parameters` at peak rate `lr` with `train.weight_decay`."""
    if train.optimizer == "adamw8bit":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(list(parameters), lr=lr, weight_decay=train.weight_decay)
    return torch.optim.AdamW(list(parameters), lr=lr, weight_decay=train.weight_decay)


def lr_schedule(train: TrainConfig, optimizer: torch.optim.Optimizer, total: int, step: int = 0) -> LambdaLR:
    """`train.lr_scheduler` over `total` steps with `train.lr_warmup_steps` of warmup, set to `step`
    (the step a resumed stage goes on from): the optimizer's rate is the one step `step` trains at."""
    schedule = get_scheduler(train.lr_scheduler, optimizer, num_warmup_steps=train.lr_warmup_steps, num_training_steps=total)
    if step:
        rates = [base * rule(step) for base, rule in zip(schedule.base_lrs, schedule.lr_lambdas)]
        schedule.load_state_dict({**schedule.state_dict(), "last_epoch": step, "_step_count": step + 1, "_last_lr": rates})
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
    return schedule

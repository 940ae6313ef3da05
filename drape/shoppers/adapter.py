"""The shopper's LoRA adapter: fit on their photos, saved in peft's format, applied for rendering.

The base model is frozen; rank-r adapters go on the nn.Linear layers `shoppers.trainable`
selects (by default the image stream's attention and MLP, where the face is rendered). The fit is
the diffusion loss of the stage trainer on the shopper's photos, `shoppers.steps` AdamW steps
of `shoppers.batch_size`, seeded. The adapter's manifest holds the sha256 of the base
checkpoint's manifest: it is applied only to the base it was trained on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.nn import functional as F

from drape.config import LoraConfig, PipelineConfig
from drape.data.dataset import to_model_inputs
from drape.shoppers import ShopperError
from drape.training.checkpoints.checkpoint import CheckpointError, load_model, verify_checkpoint
from drape.training.checkpoints.lora import (
    ADAPTER_NAME,
    ADAPTER_WEIGHTS,
    LoraPass,
    attach,
    base_digest,
    lora_targets,
    merge,
    save_adapter,
)
from drape.training.recipes.model import TryOnModel, configured_class_path
from drape.training.recipes.objective import build_objective


@dataclass
class Fit:
    model: TryOnModel  # the base with the adapter attached
    spec: LoraPass
    names: list[str]
    seconds: float
    loss: float


def load_base(config: PipelineConfig, checkpoint: Path) -> TryOnModel:
    return load_model(checkpoint, prefer_ema=True, allowed=(configured_class_path(config),))


def lora_pass(config: PipelineConfig, model: TryOnModel, checkpoint: Path) -> LoraPass:
    shoppers = config.shoppers
    targets = tuple(lora_targets(model, shoppers.trainable))
    lora = LoraConfig(enabled=True, rank=shoppers.rank, alpha=shoppers.alpha)
    return LoraPass(lora, targets, base_digest(checkpoint))


def face_weights(photos: dict, weight: float) -> torch.Tensor:
    """(N, 1, H, W) loss weights: 1, and 1 + `weight` inside each photo's face box (meta ``face_box``,
    pixels [x0, y0, x1, y1]), so the adapter spends itself on the face rather than on the garments."""
    count, height, width = photos["target"].shape[:3]
    weights = torch.ones(count, 1, height, width)
    for row, meta in enumerate(photos["meta"]):
        x0, y0, x1, y1 = (int(round(v)) for v in meta["face_box"])
        weights[row, :, max(y0, 0) : max(y1, 0), max(x0, 0) : max(x1, 0)] += weight
    return weights


def _weighted_mse(prediction: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    weights = F.interpolate(weights, size=prediction.shape[-2:], mode="area")  # latent models predict at 1/8
    return ((prediction.float() - target) ** 2 * weights).mean() / weights.mean()


def fit(config: PipelineConfig, checkpoint: Path, photos: dict, *, progress: Callable[[int, int], None] | None = None) -> Fit:
    """Train an adapter on `photos` (stacked uint8 arrays) over the base `checkpoint`, on the config's device."""
    from drape.training.loop.trainer import resolve_device

    shoppers, device = config.shoppers, resolve_device(config.train.device)
    model = load_base(config, checkpoint)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    spec = lora_pass(config, model, checkpoint)
    names = attach(model, spec, seed=shoppers.seed)
    model.to(device).train()  # type: ignore[arg-type]
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=shoppers.lr, weight_decay=0.0)
    objective = build_objective(config.diffusion)
    inputs = {k: v.to(device) for k, v in to_model_inputs(photos).items()}
    inputs["face_weights"] = face_weights(photos, shoppers.face_weight).to(device)
    count, generator = len(photos["keys"]), torch.Generator().manual_seed(shoppers.seed)
    started, loss = time.perf_counter(), torch.tensor(float("nan"))
    for step in range(shoppers.steps):
        rows = torch.randint(0, count, (shoppers.batch_size,), generator=generator)
        batch = {k: v[rows.to(device)] for k, v in inputs.items()}
        weights = batch.pop("face_weights")
        with torch.no_grad():
            clean, condition = model.prepare(batch)
        noise = torch.randn(clean.shape, generator=generator).to(device)
        timesteps = objective.draw_timesteps(len(rows), generator).to(device)
        prediction = model(objective.add_noise(clean, noise, timesteps), timesteps, **condition)
        loss = _weighted_mse(prediction, objective.target(clean, noise, timesteps), weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, config.train.grad_clip)
        optimizer.step()
        if progress:
            progress(step + 1, shoppers.steps)
    model.eval()
    return Fit(model, spec, names, time.perf_counter() - started, float(loss.detach()))


def save(path: Path, fitted: Fit, manifest: dict) -> Path:
    """The adapter in peft's format with its manifest, atomically (`drape.training.checkpoints.lora.save_adapter`)."""
    return save_adapter(
        path, model=fitted.model, spec=fitted.spec, optimizer=None, names=fitted.names, ema=None, manifest=manifest
    )


def merged(fitted: Fit) -> TryOnModel:
    """The base with the adapter folded in (for rendering); the fit's model is that model afterwards."""
    merge(fitted.model)
    return fitted.model


def apply(config: PipelineConfig, checkpoint: Path, adapter: Path) -> TryOnModel:
    """The base `checkpoint` with the shopper's `adapter` merged in; refuses an adapter of another base."""
    from peft import set_peft_model_state_dict

    try:
        manifest = verify_checkpoint(adapter)
    except (CheckpointError, FileNotFoundError, ValueError) as error:
        raise ShopperError(f"adapter {adapter}: not a usable adapter ({error})") from None
    model = load_base(config, checkpoint)
    recorded = manifest.get("lora", {})
    if recorded.get("base_manifest_sha256") != base_digest(checkpoint):
        raise ShopperError(f"adapter {adapter}: trained on another base model than {checkpoint}")
    spec = LoraPass(LoraConfig(enabled=True, rank=recorded["rank"], alpha=recorded["alpha"]), tuple(recorded["targets"]), "")
    attach(model, spec, seed=0)
    result: Any = set_peft_model_state_dict(model, load_file(str(adapter / ADAPTER_WEIGHTS)), adapter_name=ADAPTER_NAME)
    if result.unexpected_keys:
        raise ShopperError(f"adapter {adapter}: tensors the model has no place for, e.g. {result.unexpected_keys[0]!r}")
    merge(model)
    return model.eval()

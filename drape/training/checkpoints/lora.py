"""LoRA fine-tune passes with peft: low-rank adapters on the layers a stage trains.

With `train.lora.enabled`, a `--mode finetune` pass starts from the stage's baseline, freezes all
of it, and trains a pair of rank-r matrices on each `nn.Linear` whose weight the stage's
`trainable` patterns select (peft's LoRA: ``W x + (alpha / r) B A x``, B starting at zero, so
step 0 is the baseline exactly). Full runs never use it. What the pass writes:

- every `checkpoint_every` steps, an adapter checkpoint ``adapters/step-N``: the adapter in peft's
  format (``adapter_model.safetensors`` + ``adapter_config.json``), its AdamW moments, its EMA
  when on, and a manifest holding the sha256 of the base checkpoint's manifest. A few MB where a
  full checkpoint is the model and two optimizer moments; a killed pass resumes from it, and only
  on the base it was trained on.
- at the end, that last adapter, then the merged model ``checkpoints/step-N`` (each adapted
  layer's weight becomes ``W + (alpha / r) B A``; with EMA, the same with the adapter's EMA): an
  ordinary checkpoint, which the gate, the snapshot and the next stage read like any other.
  Retention archives the adapters as kind ``adapter``, with their own lifetime.

Under torchrun a LoRA pass trains with DDP whatever `train.parallelism` says: the frozen base has no
gradients or optimizer moments, so the replicas are small, and rank 0 alone writes the adapter.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from drape import Mode, parse_mode
from drape.config import LoraConfig, PipelineConfig
from drape.layout import checkpoint_dirs, checkpoint_step
from drape.storage.checksum import sha256_file
from drape.training.checkpoints.checkpoint import (
    MANIFEST,
    CheckpointError,
    code_version,
    load_training_state,
    optimizer_tensors,
    publish,
    verify_checkpoint,
)
from drape.training.recipes.model import TryOnModel, trainable_parameter_names

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file names: the adapter loads in peft and diffusers as is
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_NAME = "default"


@dataclass(frozen=True)
class LoraPass:
    """What a LoRA pass adapts, and the base it adapts (the sha256 of the base checkpoint's manifest)."""

    config: LoraConfig
    targets: tuple[str, ...]  # the adapted nn.Linear modules
    base_digest: str

    def describe(self) -> dict:
        return {
            "rank": self.config.rank,
            "alpha": self.config.alpha or self.config.rank,
            "dropout": self.config.dropout,
            "targets": list(self.targets),
            "base_manifest_sha256": self.base_digest,
        }


def is_lora_pass(config: PipelineConfig, mode: str) -> bool:
    """Whether a stage run in `mode` trains adapters (a fine-tune pass with `train.lora.enabled`)."""
    return config.train.lora.enabled and parse_mode(mode) is Mode.FINETUNE


def lora_targets(model: TryOnModel, patterns: list[str]) -> list[str]:
    """The nn.Linear modules whose weight the `trainable` patterns select (a frozen VAE's never)."""
    chosen = set(trainable_parameter_names(patterns, [n for n, _ in model.named_parameters()], model.frozen_prefixes))
    return [n for n, module in model.named_modules() if isinstance(module, torch.nn.Linear) and f"{n}.weight" in chosen]


def _peft_config(lora: LoraConfig, targets: tuple[str, ...]) -> Any:
    from peft import LoraConfig as PeftLoraConfig  # peft imports transformers: only LoRA passes pay for it

    alpha: Any = lora.alpha or lora.rank  # peft annotates int; the scale alpha / r takes any positive number
    return PeftLoraConfig(r=lora.rank, lora_alpha=alpha, lora_dropout=lora.dropout, target_modules=list(targets))


def attach(model: TryOnModel, spec: LoraPass, *, seed: int) -> list[str]:
    """Put adapters on `spec.targets` and freeze everything else; returns the adapter parameters' names.
    The A matrices start from `seed` (B from zero), so a pass started again draws the same adapter."""
    from peft import inject_adapter_in_model

    if not spec.targets:
        raise ValueError(
            f"train.lora: the stage's trainable patterns select no nn.Linear layer of {type(model).__name__} "
            "(LoRA adapts linear layers; `drape model describe` lists what each stage trains)"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(_peft_config(spec.config, spec.targets), model, adapter_name=ADAPTER_NAME)
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def merge(model: torch.nn.Module, ema: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor] | None:
    """Fold every adapter into its layer (peft's merge: ``W += (alpha / r) B A``) and put the plain
    layer back, so the model is again the class its config builds and its state dict has a
    checkpoint's names. With `ema` (the adapter's EMA by parameter name), also returns the adapted
    layers' weights merged with the EMA adapter (what gates read with `prefer_ema`)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged_ema: dict[str, torch.Tensor] | None = {} if ema is not None else None
    for name, module in list(model.named_modules()):
        if not isinstance(module, BaseTunerLayer):
            continue
        layer: Any = module  # a peft lora.Linear (mypy sees only the BaseTunerLayer mixin)
        base = layer.get_base_layer()
        if merged_ema is not None and ema is not None:
            a, b = ema[f"{name}.lora_A.{ADAPTER_NAME}.weight"], ema[f"{name}.lora_B.{ADAPTER_NAME}.weight"]
            delta = layer.scaling[ADAPTER_NAME] * (b.float() @ a.float())
            merged_ema[f"{name}.weight"] = (base.weight.detach().float() + delta.to(base.weight.device)).to(base.weight.dtype)
        layer.merge(adapter_names=[ADAPTER_NAME])
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, base)
    return merged_ema


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's weights in peft's format (adapter names stripped)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME).items()}


def save_adapter(
    path: Path,
    *,
    model: torch.nn.Module,
    spec: LoraPass,
    optimizer: torch.optim.Optimizer | None,
    names: list[str],
    ema: dict[str, torch.Tensor] | None,
    manifest: dict,
) -> Path:
    """Write an adapter checkpoint at `path` atomically (temporary directory, sha256 manifest, rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    save_file(adapter_tensors(model), str(temporary / ADAPTER_WEIGHTS))
    peft_config = _peft_config(spec.config, spec.targets).to_dict()
    (temporary / ADAPTER_CONFIG).write_text(json.dumps(peft_config, indent=2, sort_keys=True, default=sorted))
    if optimizer is not None:
        save_file(optimizer_tensors(optimizer, names), str(temporary / "optimizer.safetensors"))
    if ema is not None:
        save_file({k: v.detach().contiguous() for k, v in ema.items()}, str(temporary / "ema.safetensors"))
    full = {**manifest, "lora": spec.describe(), "trainable": names, "code_version": code_version()}
    return publish(temporary, path, full)


def load_adapter(
    path: Path, *, model: torch.nn.Module, spec: LoraPass, optimizer: torch.optim.Optimizer, names: list[str]
) -> dict[str, torch.Tensor] | None:
    """Restore an adapter checkpoint into `model` (adapters attached) and `optimizer`; returns its EMA.
    Refuses an adapter trained on another base or with other targets."""
    from peft import set_peft_model_state_dict

    manifest = verify_checkpoint(path)
    recorded = manifest.get("lora", {})
    if recorded.get("base_manifest_sha256") != spec.base_digest:
        raise CheckpointError(f"adapter {path}: trained on another base checkpoint than this pass starts from")
    if tuple(recorded.get("targets", ())) != spec.targets:
        raise CheckpointError(f"adapter {path}: adapts other layers than this config's stage patterns select")
    result: Any = set_peft_model_state_dict(model, load_file(str(path / ADAPTER_WEIGHTS)), adapter_name=ADAPTER_NAME)
    if result.unexpected_keys:
        raise CheckpointError(f"adapter {path}: tensors the model has no place for, e.g. {result.unexpected_keys[0]!r}")
    return load_training_state(path, optimizer, names)


def newest_adapter(directory: Path) -> Path | None:
    """The newest complete adapter checkpoint under `directory` (None: none)."""
    done = [path for path in checkpoint_dirs(directory) if (path / MANIFEST).is_file()]
    return done[-1] if done else None


def adapter_step(directory: Path) -> int:
    newest = newest_adapter(directory)
    return checkpoint_step(newest) if newest is not None else 0


def base_digest(checkpoint: str | Path) -> str:
    """The sha256 of a checkpoint's manifest, which holds the sha256 of each of its files: the base's identity."""
    manifest = Path(checkpoint) / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"checkpoint {checkpoint}: no {MANIFEST} (a LoRA pass needs a complete base checkpoint)")
    return sha256_file(manifest)

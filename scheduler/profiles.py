"""Memory profiles: what a job needs on a GPU, estimated from the config and learned from runs.

Estimate (per GPU, GiB): parameters × bytes for fp32 weights, plus gradients (4 B), AdamW states
(8 B) and EMA (4 B) for the stage's trainable parameters, plus activations: tokens × hidden ×
layers × 34 bytes-per-element-equivalent × batch (Megatron's estimate, with flash attention so
no s² term; halved at bf16), plus 1.5 GiB of CUDA context and workspace. Evaluation jobs hold
weights and one batch of sampling activations. Duration: 6 × parameters × tokens × samples per
step at 35% MFU of an H100's 989 dense bf16 TFLOP/s.

Measured: every job run through the queue records its peak GPU memory
(`torch.cuda.max_memory_allocated`) and duration under its shape key; once a shape has
measurements, their p95 plus `queue.headroom` overrides the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from drape import JobKind

GIB = 2**30
CONTEXT_GIB = 1.5
H100_DENSE_BF16_FLOPS = 989e12
ASSUMED_MFU = 0.35


@dataclass(frozen=True)
class Profile:
    shape: str
    estimate_gib: float
    estimate_duration_s: float
    measured_p95_gib: float | None
    measured_p95_duration_s: float | None
    measurements: int
    mem_gib: float  # what the queue uses
    duration_s: float
    source: str  # estimate | measured


def shape_key(config, kind: str, stage: str | None, gpus: int = 1) -> str:
    return (
        f"{kind}/{config.name}/{stage or '-'}/{config.data.resolution}px/b{config.train.batch_size}/"
        f"{config.train.precision}/{gpus}gpu"
    )


def _meta_model(config):
    import torch

    from drape.training.model import build_model

    with torch.device("meta"):
        return build_model(config, pretrained=False)


def parameter_counts(config, stage: str | None) -> tuple[int, int]:
    """(all parameters, the stage's trainable ones), from the model built on the meta device."""
    from drape.training.model import trainable_parameter_names

    model = _meta_model(config)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    if stage is None:
        return sum(sizes.values()), 0
    trainable = trainable_parameter_names(config.train.stages[stage].trainable, list(sizes), model.frozen_prefixes)
    return sum(sizes.values()), sum(sizes[n] for n in trainable)


def workload(config):
    """The model's `Workload` (tokens per sample, hidden width, layers), from the meta-device model."""
    return _meta_model(config).workload()


def tokens_per_sample(config) -> int:
    return workload(config).tokens


def estimate(config, kind: str, stage: str | None, gpus: int = 1, counts: tuple[int, int] | None = None) -> tuple[float, float]:
    """(peak GiB per GPU, expected seconds) for a job of `kind` on `stage` (see the module docstring)."""
    total, trainable = counts or parameter_counts(config, stage)
    shape = workload(config)
    hidden, layers, tokens, batch = shape.hidden, shape.layers, shape.tokens, config.train.batch_size
    element = 2 if config.train.precision == "bf16" else 4
    training = kind in (JobKind.STAGE_TRAINING, JobKind.FINETUNE, JobKind.PERSONALIZATION)
    states = trainable * (4 + 8 + (4 if config.train.ema.enabled else 0)) if training else 0
    activations = tokens * hidden * layers * 34 * (element / 2) * batch
    if not training:
        activations /= 4  # no saved activations for backward: the live working set of one forward
    peak = (4 * total + states) / gpus + activations / gpus + CONTEXT_GIB * GIB
    steps = 0
    if stage is not None:
        stage_config = config.train.stages[stage]
        steps = stage_config.steps if kind == JobKind.STAGE_TRAINING else stage_config.finetune_steps
    flops = (
        6 * total * tokens * batch * max(steps, 1) if training else 2 * total * tokens * batch * config.diffusion.sampling_steps
    )
    return peak / GIB, flops / (H100_DENSE_BF16_FLOPS * ASSUMED_MFU * gpus)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(int(round(0.95 * (len(ordered) - 1))), len(ordered) - 1)]


def profile(config, store, kind: str, stage: str | None, gpus: int = 1, counts: tuple[int, int] | None = None) -> Profile:
    """The profile the queue uses: measured p95 + headroom when the shape has history, else the estimate."""
    shape = shape_key(config, kind, stage, gpus)
    estimate_gib, estimate_seconds = estimate(config, kind, stage, gpus, counts)
    history = store.measurements(shape) if store is not None else []
    if not history:
        return Profile(shape, estimate_gib, estimate_seconds, None, None, 0, estimate_gib, estimate_seconds, "estimate")
    peak = _p95([p for p, _ in history])
    seconds = _p95([d for _, d in history])
    return Profile(
        shape,
        estimate_gib,
        estimate_seconds,
        peak,
        seconds,
        len(history),
        peak * (1 + config.queue.headroom),
        seconds,
        "measured",
    )

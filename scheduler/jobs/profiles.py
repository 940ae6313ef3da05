"""Memory profiles: what a job needs on a GPU, estimated from the config and learned from runs.

Estimate (per GPU, GiB): parameters × bytes for fp32 weights, plus gradients (4 B), AdamW states
(8 B; 2 B with `train.optimizer` adamw8bit) and EMA (4 B) for the stage's trainable parameters,
plus activations: tokens × hidden × layers × 34 bytes-per-element-equivalent × the micro-batch
(the batch over `train.grad_accumulation_steps`; Megatron's estimate, with flash attention so
no s² term; halved at bf16), plus 1.5 GiB of CUDA context and workspace. Evaluation jobs hold
weights and one batch of sampling activations (two with classifier-free guidance). Duration:
6 × parameters × tokens × samples per step at 35% MFU of an H100's 989 dense bf16 TFLOP/s,
counting the denoiser's parameters only (a frozen VAE runs once per image, not per token, and has
no backward). A LoRA fine-tune pass (`train.lora.enabled`) trains rank × (in + out) parameters
per adapted layer, and replicates the frozen base on each GPU (DDP) instead of sharding it.

Measured: every job run through the queue records its peak GPU memory
(`torch.cuda.max_memory_allocated`) and duration under its shape key; once a shape has
measurements, their p95 plus `queue.headroom` overrides the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    data = config.data
    pixels = f"{data.height}px" if data.height == data.width else f"{data.height}x{data.width}px"
    train = config.train
    batch = f"b{train.batch_size}" + (f"x{train.grad_accumulation_steps}" if train.grad_accumulation_steps > 1 else "")
    optimizer = "" if train.optimizer == "adamw" else f"/{train.optimizer}"
    return f"{kind}/{config.name}/{stage or '-'}/{pixels}/{batch}/{train.precision}{optimizer}/{gpus}gpu"


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs of a config's model, read once from the meta-device build."""

    sizes: tuple[tuple[str, int], ...]  # (parameter name, elements)
    frozen_prefixes: tuple[str, ...]
    workload: Any  # drape.training.recipes.model.Workload
    linears: tuple[tuple[str, int, int], ...] = ()  # (nn.Linear module, in, out features): what LoRA can adapt

    @property
    def frozen(self) -> int:
        return sum(n for name, n in self.sizes if name.startswith(self.frozen_prefixes))


_FACTS: dict[tuple[str, int | tuple[int, int]], ModelFacts] = {}  # per (model config, resolution): the build is what costs


def model_facts(config) -> ModelFacts:
    """The config's model's parameter sizes, frozen parts and workload, from a meta-device build
    (no weights read), once per model config."""
    key = (config.model.model_dump_json(by_alias=True), config.data.resolution)
    if key not in _FACTS:
        import torch

        from drape.training.recipes.model import build_model

        with torch.device("meta"):
            model = build_model(config, pretrained=False)
        linears = tuple((n, m.in_features, m.out_features) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
        _FACTS[key] = ModelFacts(
            tuple((n, p.numel()) for n, p in model.named_parameters()), model.frozen_prefixes, model.workload(), linears
        )
    return _FACTS[key]


def parameter_counts(config, stage: str | None) -> tuple[int, int]:
    """(all parameters, the stage's trainable ones), from the model built on the meta device."""
    from drape.training.recipes.model import trainable_parameter_names

    facts = model_facts(config)
    sizes = dict(facts.sizes)
    if stage is None:
        return sum(sizes.values()), 0
    trainable = trainable_parameter_names(config.train.stages[stage].trainable, list(sizes), facts.frozen_prefixes)
    return sum(sizes.values()), sum(sizes[n] for n in trainable)


def lora_parameters(config, stage: str | None) -> int:
    """The adapter parameters of a LoRA pass on `stage` (None: a shopper's personalization, its
    `shoppers.trainable` patterns and rank): rank × (in + out) per nn.Linear whose weight the
    patterns select (what `drape.training.checkpoints.lora.lora_targets` adapts)."""
    from drape.training.recipes.model import trainable_parameter_names

    facts = model_facts(config)
    patterns = config.train.stages[stage].trainable if stage else config.shoppers.trainable
    chosen = set(trainable_parameter_names(patterns, [n for n, _ in facts.sizes], facts.frozen_prefixes))
    rank = config.train.lora.rank if stage else config.shoppers.rank
    return sum(rank * (fan_in + fan_out) for name, fan_in, fan_out in facts.linears if f"{name}.weight" in chosen)


def workload(config):
    """The model's `Workload` (tokens per sample, hidden width, layers), from the meta-device model."""
    return model_facts(config).workload


def tokens_per_sample(config) -> int:
    return workload(config).tokens


def estimate(config, kind: str, stage: str | None, gpus: int = 1, counts: tuple[int, int] | None = None) -> tuple[float, float]:
    """(peak GiB per GPU, expected seconds) for a job of `kind` on `stage` (see the module docstring)."""
    total, trainable = counts or parameter_counts(config, stage)
    facts = model_facts(config)
    shape, denoiser = facts.workload, total - facts.frozen  # a frozen VAE runs once per image, not per token
    hidden, layers, tokens, batch = shape.hidden, shape.layers, shape.tokens, config.train.batch_size
    element = 2 if config.train.precision == "bf16" else 4
    training = kind in (JobKind.STAGE_TRAINING, JobKind.FINETUNE, JobKind.PERSONALIZATION)
    personal = kind == JobKind.PERSONALIZATION  # a shopper's adapter: `shoppers` steps, batch and patterns
    lora = personal or (kind == JobKind.FINETUNE and config.train.lora.enabled)
    if personal:
        trainable, batch = lora_parameters(config, None), config.shoppers.batch_size
    elif lora and stage is not None:
        trainable = lora_parameters(config, stage)
    moments = 2 if config.train.optimizer == "adamw8bit" and not personal else 8  # a shopper's fit runs torch's AdamW
    states = trainable * (4 + moments + (4 if config.train.ema.enabled else 0)) if training else 0
    guided = 2 if config.diffusion.guidance_scale > 1 else 1  # sampling with guidance: two passes in one batch
    accumulated = config.train.grad_accumulation_steps if training and not personal else 1
    activations = tokens * hidden * layers * 34 * (element / 2) * batch / accumulated
    if not training:
        activations *= guided / 4  # no saved activations for backward: the live working set of one forward
    shards = 1 if lora else gpus  # a LoRA pass replicates its frozen base and the adapters' states (DDP)
    peak = (4 * total + states) / shards + activations / gpus + CONTEXT_GIB * GIB
    steps = config.shoppers.steps if personal else 0
    if stage is not None:
        stage_config = config.train.stages[stage]
        steps = stage_config.steps if kind == JobKind.STAGE_TRAINING else stage_config.finetune_steps
    flops = (
        (4 if lora else 6) * denoiser * tokens * batch * max(steps, 1)  # LoRA: no weight gradients of the base
        if training
        else 2 * denoiser * tokens * batch * config.diffusion.sampling_steps * guided
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
    peak = _p95([p for p, _, _ in history])
    alone = [d for _, d, shared in history if not shared]  # a run beside other jobs was slowed by them
    seconds = _p95(alone or [d for _, d, _ in history])
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

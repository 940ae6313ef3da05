"""Config of the inference measuring stick (`drape bench inference`) and of `drape tryon`.

A variant is one technique, or a stack of them, measured as an isolated run against one reference:
bf16 eager SDPA on a GPU, fp32 on the CPU. Fields a variant leaves unset are the reference's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape.config.base import StrictModel, mounted

Precision = Literal["fp32", "bf16", "fp16"]
SdpaBackend = Literal["default", "math", "efficient", "flash", "cudnn"]
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class VariantSpec(StrictModel):
    """One isolated experiment on the stick."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9+._-]{0,63}$", description="the variant's name in the report")
    precision: Precision | None = Field(default=None, description="weights and activations; unset: the reference's")
    sdpa: SdpaBackend = Field(default="default", description="torch.nn.attention.sdpa_kernel backend; default: torch picks")
    compile: CompileMode = Field(default="off", description="torch.compile mode of the denoiser (reduce-overhead: CUDA graphs)")
    fp8: bool = Field(default=False, description="torchao Float8DynamicActivationFloat8WeightConfig on the denoiser's linears")
    steps: int | None = Field(default=None, gt=0, description="sampling steps; unset: diffusion.sampling_steps")
    steps_fraction: float | None = Field(default=None, gt=0, le=1, description="sampling steps as a share of the reference's")
    cache: Literal["off", "first-block"] = Field(default="off", description="diffusers' first-block cache hook")
    cache_threshold: float = Field(
        default=0.05,
        gt=0,
        description="first-block cache: the relative change of the first block's output under which a step reuses the rest",
    )

    def sampling_steps(self, reference: int) -> int:
        if self.steps:
            return self.steps
        return max(1, round(reference * self.steps_fraction)) if self.steps_fraction else reference

    def describe(self) -> str:
        parts: list[str] = [self.precision or "reference precision"]
        parts += [f"SDPA {self.sdpa}"] if self.sdpa != "default" else []
        parts += [f"compile {self.compile}"] if self.compile != "off" else []
        parts += ["FP8 (torchao)"] if self.fp8 else []
        parts += [f"{self.steps} steps"] if self.steps else []
        parts += [f"{self.steps_fraction:g}× the steps"] if self.steps_fraction else []
        parts += [f"first-block cache {self.cache_threshold}"] if self.cache != "off" else []
        return ", ".join(parts)


def _variant(name: str, **fields) -> VariantSpec:
    return VariantSpec(name=name, **fields)


DEFAULT_VARIANTS = (
    _variant("bf16", precision="bf16"),
    _variant("fp16", precision="fp16"),
    _variant("sdpa-math", sdpa="math"),
    _variant("sdpa-flash", sdpa="flash"),
    _variant("sdpa-efficient", sdpa="efficient"),
    _variant("sdpa-cudnn", sdpa="cudnn"),
    _variant("compile", compile="default"),
    _variant("cuda-graphs", compile="reduce-overhead"),
    _variant("fp8", fp8=True),
    _variant("fp8+cudnn", fp8=True, sdpa="cudnn"),
    _variant("fp8+cudnn+compile", fp8=True, sdpa="cudnn", compile="max-autotune-no-cudagraphs"),
    _variant("half-steps", steps_fraction=0.5),
    _variant("first-block-cache", cache="first-block"),
)


class QualityConfig(StrictModel):
    """When a variant is approved: each quality figure within the noise floor (the control
    experiment's figure) less a tolerance. Both are reported."""

    attention_inputs: int = Field(default=4, gt=0, description="captured inputs whose attention outputs are compared")
    attention_timestep_fraction: float = Field(default=0.5, ge=0, le=1, description="where in the schedule they are taken")
    attention_cosine_tolerance: float = Field(
        default=2e-4, ge=0, description="how far a variant's worst attention-block cosine may fall under the floor's"
    )
    check_tolerance: float = Field(
        default=0.01, ge=0, description="how far a gate check's mean (vs the reference's outputs) may fall under the floor's"
    )


class InferenceConfig(StrictModel):
    model: str = Field(
        default="denoise-baseline",
        description="registry alias or checkpoint directory to measure",
        json_schema_extra=mounted("checkpoint"),
    )
    runs: int = Field(default=20, ge=10, description="timed requests per variant (median and p90 of these)")
    warmup: int = Field(default=3, ge=1, description="untimed requests first (compilation, allocator, caches)")
    memory_requests: int = Field(default=3, gt=0, description="requests of their own that measure peak memory")
    concurrency: list[int] = Field(default=[2, 4], description="concurrent requests measured beside one at a time")
    concurrency_runs: int = Field(default=3, gt=0, description="repeats of each concurrent batch (median)")
    seed: int = Field(default=1234, description="the fixed sampling seed of every request")
    interleave: bool = Field(
        default=True,
        description="the reference's process takes turns with each variant's (drift falls on both); off: one after another, "
        "for a device that cannot hold two copies of the model",
    )
    repeat_reference: bool = Field(default=True, description="measure the reference in two isolated runs (repeatability)")
    variants: list[VariantSpec] = Field(
        default_factory=lambda: list(DEFAULT_VARIANTS), description="the variants measured against the reference, each isolated"
    )
    control: VariantSpec = Field(
        default=_variant("control", compile="default"),
        description="the reference with a change that must not matter; its quality figures are the noise floor",
    )
    quality: QualityConfig = Field(default=QualityConfig(), description="when a variant's quality is approved")
    gpu_memory_gib: float = Field(default=80.0, gt=0, description="the whole GPU a queue job asks for (nothing beside it)")
    timeout_seconds: float = Field(default=1800.0, gt=0, description="bound on one variant's isolated run")

    @model_validator(mode="after")
    def _names_unique(self) -> InferenceConfig:
        names = [v.name for v in self.variants] + [self.control.name]
        taken = {"reference", "reference-repeat"} & set(names)
        if taken or len(set(names)) != len(names):
            raise ValueError(f"inference.variants: names must be unique and not 'reference' ({sorted(taken) or names})")
        if any(n < 2 for n in self.concurrency):
            raise ValueError(f"inference.concurrency: each entry is 2 or more concurrent requests, got {self.concurrency}")
        return self

"""Variants on the stick: what a device can run (else a reason), and a model set up as a variant says.

The reference is bf16 with torch's own SDPA choice, eager, on a GPU; fp32 on the CPU. A variant
changes some of: precision, the SDPA backend (`torch.nn.attention.sdpa_kernel`), `torch.compile`
(mode reduce-overhead: CUDA graphs), FP8 GEMMs through torchao (compute capability 8.9 and up),
sampling steps, diffusers' first-block cache hook. Whatever the device cannot run is skipped
with the reason, found by asking the device (a probe call), not by a table.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from drape.config import VariantSpec
from drape.training.recipes.model import TryOnModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
REFERENCE = "reference"
FP8_CAPABILITY = (8, 9)


def reference_spec(device: torch.device) -> VariantSpec:
    """bf16 eager SDPA on a GPU, fp32 on the CPU (the CPU's bf16 is emulated in places: not a fair base)."""
    return VariantSpec(name=REFERENCE, precision="bf16" if device.type == "cuda" else "fp32")


def resolved(spec: VariantSpec, reference: VariantSpec) -> VariantSpec:
    """`spec` with the fields it leaves unset taken from the reference."""
    return spec if spec.precision else spec.model_copy(update={"precision": reference.precision})


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "math": SDPBackend.MATH,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[name]


def sdpa_context(name: str) -> Callable[[], AbstractContextManager]:
    if name == "default":
        return contextlib.nullcontext
    from torch.nn.attention import sdpa_kernel

    backend = _backend(name)
    return lambda: sdpa_kernel([backend])


def _probe_sdpa(name: str, dtype: torch.dtype, device: torch.device) -> str | None:
    """None when the backend runs an attention call of this dtype here, else torch's reason."""
    query = torch.randn(1, 2, 64, 32, dtype=dtype, device=device)
    try:
        with warnings.catch_warnings(), sdpa_context(name)():
            warnings.simplefilter("ignore")
            torch.nn.functional.scaled_dot_product_attention(query, query, query)
    except RuntimeError as error:
        first = str(error).splitlines()[0].split(". ")[0]
        return f"SDPA backend {name} has no {str(dtype).removeprefix('torch.')} kernel on {device.type} ({first})"
    return None


def _fp8_reason(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "FP8 GEMMs need a CUDA GPU of compute capability 8.9 or higher (Ada, Hopper); this is a CPU"
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_CAPABILITY:
        return f"FP8 GEMMs need compute capability 8.9 or higher; this GPU is {capability[0]}.{capability[1]}"
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig  # noqa: F401
    except ImportError as error:
        return f"torchao with Float8DynamicActivationFloat8WeightConfig is not installed ({error}): pip install 'drape[gpu]'"
    return None


def unavailable(spec: VariantSpec, device: torch.device) -> str | None:
    """Why `spec` (resolved) cannot run on `device`; None when it can."""
    dtype = DTYPES[spec.precision or "fp32"]
    if device.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    if spec.compile == "reduce-overhead" and device.type != "cuda":
        return "CUDA graphs (torch.compile mode reduce-overhead) need a CUDA device"
    if spec.compile != "off" and device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
        return "torch.compile on the CPU needs a C++ compiler (g++) for inductor's kernels"
    if spec.fp8 and (reason := _fp8_reason(device)):
        return reason
    if spec.sdpa != "default":
        return _probe_sdpa(spec.sdpa, dtype, device)
    return None


def _block_owner(model: nn.Module, frozen: tuple[str, ...]) -> nn.Module | None:
    """The module holding the denoiser's transformer blocks as a ModuleList (what diffusers' cache hooks wrap)."""
    from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS

    for name, module in model.named_modules():
        if name.startswith(frozen) and name:
            continue
        if any(isinstance(getattr(module, ident, None), nn.ModuleList) for ident in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS):
            return module
    return None


@dataclass
class Prepared:
    """A model set up as one variant says, and what each request runs under."""

    model: TryOnModel
    spec: VariantSpec
    dtype: torch.dtype
    steps: int
    sdpa: Callable[[], AbstractContextManager]
    stateful: nn.Module | None = None  # the module a cache hook wraps: a cache context per request, reset after

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """One request: the SDPA backend, and a fresh cache state when a cache hook is on."""
        if self.stateful is None:
            with self.sdpa():
                yield
            return
        from diffusers.models.cache_utils import CacheMixin  # its context methods need only a module

        try:
            with CacheMixin.cache_context(self.stateful, "request"), self.sdpa():  # type: ignore[arg-type]
                yield
        finally:
            CacheMixin._reset_stateful_cache(self.stateful)  # type: ignore[arg-type]


def prepare(model: TryOnModel, spec: VariantSpec, device: torch.device, reference_steps: int) -> Prepared:
    """`model` (eval, on `device`) set up as `spec` (resolved): cast, FP8-quantised, cache-hooked, compiled."""
    dtype = DTYPES[spec.precision or "fp32"]
    torch.nn.Module.to(model, device=device, dtype=dtype)  # in place; not ModelMixin.to, whose fp32-module warning is moot here
    model.eval()
    prepared = Prepared(model, spec, dtype, spec.sampling_steps(reference_steps), sdpa_context(spec.sdpa))
    frozen = model.frozen_prefixes
    if spec.fp8:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, quantize_

        def denoiser_linear(module: nn.Module, name: str) -> bool:
            return isinstance(module, nn.Linear) and not name.startswith(frozen) and module.in_features % 16 == 0

        quantize_(model, Float8DynamicActivationFloat8WeightConfig(), filter_fn=denoiser_linear)
    if spec.cache == "first-block":
        from diffusers.hooks import FirstBlockCacheConfig, apply_first_block_cache

        owner = _block_owner(model, frozen)
        if owner is None:
            raise ValueError(
                "the first-block cache needs transformer blocks in a ModuleList diffusers knows; this model has none"
            )
        apply_first_block_cache(owner, FirstBlockCacheConfig(threshold=spec.cache_threshold))
        prepared.stateful = owner
    if spec.compile != "off":
        model.compile(mode=spec.compile, fullgraph=False)
    return prepared

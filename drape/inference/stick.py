"""The measuring stick: captured inputs, a fixed seed, a warm device, one request at a time.

A request is one captured input (batch 1) rendered end to end. Its denoise-only latency is the
sampling loop alone, between `drape.training.recipes.model.sample`'s "denoise" and "decode" phases; its
end-to-end latency adds conditioning, the VAE decode and the copy of the pixels to the host.
Every time is read after a device synchronisation. Peak memory is the request's, measured in
requests of its own after the timed ones: on a GPU `torch.cuda.max_memory_allocated` (the
resident model included, as the field quotes it); on the CPU the resident set's high-water mark
above what was resident as the request began, read from /proc after resetting the mark
(`/proc/self/clear_refs`), with glibc told to map every allocation over a page afresh and trim
on free (`mallopt`), so memory a freed tensor leaves in the heap neither hides the request's peak
nor counts as it. Those settings slow allocation, so the timed requests run without them.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch

from drape.config import DiffusionConfig
from drape.gates.run import to_uint8
from drape.inference.variants import Prepared
from drape.training.recipes.model import sample
from drape.training.recipes.objective import build_objective

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _status_kib(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def exact_heap() -> bool:
    """glibc: every allocation over a page its own mapping, freed memory returned at once; False elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, 4096) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 0) == 1
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return ok


class PeakMemory:
    """A request's peak memory in bytes (see the module docstring); None where it cannot be read."""

    def __init__(self, device: torch.device):
        self.device, self.base = device, 0
        self.cpu_ok = device.type == "cuda" or (STATUS.is_file() and CLEAR_REFS.exists())

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        if self.cpu_ok:
            try:
                CLEAR_REFS.write_text("5")  # reset VmHWM to the current RSS (Linux 4.0+)
                self.base = _status_kib("VmRSS") * 1024
            except OSError:
                self.cpu_ok = False

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return max(_status_kib("VmHWM") * 1024 - self.base, 0) if self.cpu_ok else None


def request(prepared: Prepared, diffusion: DiffusionConfig, inputs: dict, seed: int, memory: PeakMemory | None = None):
    """One request: (uint8 image, denoise seconds, end-to-end seconds, peak bytes or None)."""
    device = next(iter(inputs.values())).device
    marks: dict[str, float] = {}
    with prepared.request():
        if memory:
            memory.start()
        started = now(device)
        images = sample(
            prepared.model,
            diffusion,
            inputs,
            seed=seed,
            num_steps=prepared.steps,
            on_phase=lambda phase: marks.__setitem__(phase, now(device)),
        )
        pixels = to_uint8(images)
        ended = now(device)
    return pixels[0], marks["decode"] - marks["denoise"], ended - started, memory.peak() if memory else None


class Session:
    """Timed requests in turns: `timed(n)` runs the next `n` captured inputs (cycling) and keeps each
    input's first render (the variant's output for it)."""

    def __init__(self, prepared: Prepared, diffusion: DiffusionConfig, requests: list[dict], seed: int):
        self.prepared, self.diffusion, self.requests, self.seed = prepared, diffusion, requests, seed
        self.position = 0
        self.timings: dict[str, list[float]] = {"denoise_s": [], "total_s": []}
        self.rendered: dict[int, np.ndarray] = {}

    def warm(self, count: int) -> None:
        for index in range(count):
            request(self.prepared, self.diffusion, self.requests[index % len(self.requests)], self.seed)

    def timed(self, count: int) -> dict[str, list[float]]:
        part: dict[str, list[float]] = {"denoise_s": [], "total_s": []}
        for _ in range(count):
            index = self.position % len(self.requests)
            self.position += 1
            image, denoise_s, total_s, _ = request(self.prepared, self.diffusion, self.requests[index], self.seed)
            self.rendered.setdefault(index, image)
            part["denoise_s"].append(denoise_s)
            part["total_s"].append(total_s)
        for key, values in part.items():
            self.timings[key] += values
        return part

    def outputs(self) -> np.ndarray:
        """Every input's render (untimed for those the timed requests did not reach)."""
        for index, inputs in enumerate(self.requests):
            if index not in self.rendered:
                self.rendered[index] = request(self.prepared, self.diffusion, inputs, self.seed)[0]
        return np.stack([self.rendered[i] for i in range(len(self.requests))])


def peaks(prepared: Prepared, diffusion: DiffusionConfig, requests: list[dict], count: int, seed: int) -> list[int] | None:
    """Peak memory of `count` requests of their own (see the module docstring); None where unreadable.
    On the CPU this leaves the process's heap in exact mode: measure it last."""
    device = next(iter(requests[0].values())).device
    memory = PeakMemory(device)
    if device.type == "cpu" and not (memory.cpu_ok and exact_heap()):
        return None
    found = [request(prepared, diffusion, requests[index % len(requests)], seed, memory)[3] for index in range(count)]
    return None if None in found else [int(peak) for peak in found if peak is not None]


def together(prepared: Prepared, diffusion: DiffusionConfig, requests: list[dict], count: int, seed: int) -> float:
    """Seconds for `count` requests started together (one thread each, a CUDA stream each on a GPU)."""
    device = next(iter(requests[0].values())).device
    barrier, errors = threading.Barrier(count + 1), []

    def one(index: int) -> None:
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        barrier.wait()
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                sample(prepared.model, diffusion, requests[index % len(requests)], seed=seed, num_steps=prepared.steps)
        except Exception as error:  # noqa: BLE001 - reported by the caller, with the variant's name
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    with prepared.sdpa():
        barrier.wait()
        started = now(device)
        for thread in threads:
            thread.join()
        elapsed = now(device) - started
    if errors:
        raise RuntimeError(f"{count} concurrent requests: {type(errors[0]).__name__}: {errors[0]}")
    return elapsed


def concurrency(
    prepared: Prepared, diffusion: DiffusionConfig, requests: list[dict], counts: list[int], repeats: int, seed: int
) -> dict[int, float]:
    """Median seconds of `count` concurrent requests, per count."""
    return {
        count: statistics.median(together(prepared, diffusion, requests, count, seed) for _ in range(repeats)) for count in counts
    }


def _is_attention(module: torch.nn.Module) -> bool:
    return type(module).__name__ in ("Attention", "AttentionModuleMixin", "JointAttention") or (
        hasattr(module, "processor") and hasattr(module, "to_q")
    )


@torch.no_grad()
def attention_outputs(prepared: Prepared, diffusion: DiffusionConfig, requests: list[dict], seed: int, fraction: float) -> dict:
    """Each attention block's output (float32, host) on each of `requests`, at one noisy input per
    request: its target noised to timestep `fraction` of the schedule with seeded noise, so every
    variant sees the same input whatever its sampling steps."""
    model, captured = prepared.model, {}
    objective = build_objective(diffusion)
    names = {module: name for name, module in model.named_modules() if _is_attention(module)}
    current: list[str] = [""]

    def hook(module, _args, output):
        first = output[0] if isinstance(output, tuple) else output
        captured[f"{names[module]}/{current[0]}"] = first.detach().float().cpu().contiguous()

    handles = [module.register_forward_hook(hook) for module in names]
    try:
        for index, inputs in enumerate(requests):
            current[0] = str(index)
            generator = torch.Generator(device="cpu").manual_seed(seed + index)
            clean = model.encode(inputs["target"])
            noise = torch.randn(clean.shape, generator=generator).to(clean.device, clean.dtype)
            t = objective.timesteps_at(fraction, clean.shape[0]).to(clean.device)
            noisy = objective.add_noise(clean, noise, t)
            with prepared.request():
                model(noisy, t, **model.condition(inputs))
    finally:
        for handle in handles:
            handle.remove()
    return captured

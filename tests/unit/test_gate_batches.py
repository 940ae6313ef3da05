"""The gate renders its control set in chunks of `gates.batch_size`: the same images as one batch,
and a peak memory that does not grow with the control set."""

from __future__ import annotations

import gc
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from drape.data.dataset import synthesize_split
from drape.gates.run import generate_outputs, sample_control
from drape.training.checkpoints.checkpoint import save_checkpoint
from drape.training.recipes.model import build_model, initial_noise
from tests.conftest import tiny_config


def _batched(config, batch_size: int):
    return config.model_copy(update={"gates": config.gates.model_copy(update={"batch_size": batch_size})})


def test_a_samples_noise_does_not_depend_on_its_batch():
    whole = initial_noise((5, 3, 4, 4), seed=7)
    assert torch.equal(torch.cat([initial_noise((2, 3, 4, 4), 7), initial_noise((3, 3, 4, 4), 7, first_index=2)]), whole)
    assert not torch.equal(initial_noise((5, 3, 4, 4), seed=8), whole)
    assert not torch.equal(initial_noise((1, 3, 4, 4), 8)[0], whole[1])  # neighbouring seeds share no sample's noise


def test_outputs_are_those_of_one_batch_whatever_the_batch_size(config, tmp_path):
    model = build_model(config)
    checkpoint = save_checkpoint(tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[], ema=None, manifest={})
    control = synthesize_split(config, "control", 7)
    outputs, finals = {}, {}
    for batch_size in (1, 3, 7):  # 3: a short last chunk
        gate_dir = tmp_path / f"gate-{batch_size}"
        outputs[batch_size] = generate_outputs(_batched(config, batch_size), checkpoint, control, gate_dir)
        finals[batch_size] = load_file(str(gate_dir / "latents.safetensors"))["final"]
        assert sorted(p.stem for p in (gate_dir / "outputs").glob("*.png")) == sorted(control["keys"])
    for batch_size in (1, 3):
        torch.testing.assert_close(finals[batch_size], finals[7], atol=1e-5, rtol=1e-5)
        difference = np.abs(outputs[batch_size].astype(int) - outputs[7].astype(int))
        assert difference.max() <= 1, f"batch_size {batch_size}: a pixel moved by {difference.max()} levels"
    assert outputs[7].shape == (7, config.data.height, config.data.width, 3)


def _largest_batch(config, model, control) -> tuple[int, int]:
    """(the largest batch the denoiser saw, samples rendered) while the gate renders `control`."""
    seen: list[int] = []
    forward = model.forward

    def recording(sample, *args, **kwargs):
        seen.append(sample.shape[0])
        return forward(sample, *args, **kwargs)

    model.forward = recording
    try:
        rendered = sum(len(keys) for keys, _ in sample_control(config, model, control))
    finally:
        del model.forward
    return max(seen), rendered


def test_the_denoiser_never_sees_more_than_batch_size_samples(config):
    model, batched = build_model(config).eval(), _batched(config, 4)
    for size in (8, 32):
        assert _largest_batch(batched, model, synthesize_split(config, "control", size)) == (4, size)
    assert _largest_batch(_batched(config, 16), model, synthesize_split(config, "control", 8)) == (8, 8)


def _peaks(root: str) -> tuple[int, int, int]:
    """The resident high-water mark over three passes (8 samples in batches of 4, 32 in batches of 4,
    32 in one batch), in a fresh interpreter: in a long-lived test worker, other tests' threads free
    memory during a pass and hide its peak (CI once read 0.0 MiB for the 8-sample pass). glibc is told
    to map every allocation over a page afresh and trim on free (the inference stick's setting,
    `drape.inference.stick.exact_heap`)."""
    from drape.inference.stick import PeakMemory, exact_heap

    memory = PeakMemory(torch.device("cpu"))
    # Linux's /proc/self/clear_refs and glibc's mallopt, as on every machine the suite runs on
    assert memory.cpu_ok and exact_heap(), "the peak-memory measurement needs /proc/self/clear_refs and glibc"
    torch.set_num_threads(1)
    config = tiny_config(Path(root) / "drape", data={"resolution": 64})
    model = build_model(config).eval()
    controls = {size: synthesize_split(config, "control", size) for size in (8, 32)}

    def peak(size: int, batch_size: int) -> int:
        gc.collect()
        memory.start()
        for _ in sample_control(_batched(config, batch_size), model, controls[size]):
            pass
        return memory.peak() or 0

    peak(8, 4)  # warm: the first pass allocates what every later one reuses
    return peak(8, 4), peak(32, 4), peak(32, 32)


def test_the_gates_peak_memory_is_flat_in_the_control_sets_size(tmp_path):
    """Measured, not inferred: the process's resident high-water mark over each pass (64 px, where a
    sample's activations are large enough to see)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        small, large, one_batch = pool.submit(_peaks, str(tmp_path)).result(timeout=300)
    assert small > 2**20, f"a pass over 8 samples must be seen: {small / 2**20:.1f} MiB"
    assert large < 1.5 * small + 2**20, f"peak {large / 2**20:.1f} MiB on 32 samples vs {small / 2**20:.1f} MiB on 8"
    assert one_batch > 3 * large, "the measurement must see what one batch of 32 costs"

"""The production-shaped model on GPUs: step time, peak memory, MFU and checkpoint stall.

Trains configs/h100.yaml's transformer (depth reduced with --layers if needed) for --steps steps
on random images at the config's resolution, bf16, under torchrun when several GPUs are given,
with a sharded (async DCP) checkpoint every --every steps, and prints one table. MFU counts
6 × parameters × tokens × samples per second against --peak-tflops per GPU (H100/H200 SXM
dense bf16: 989). On a machine without CUDA it runs the same code at --resolution/--layers on the
CPU (a smoke test; the figures mean nothing there).

    torchrun --standalone --nproc-per-node=1 benchmarks/gpu_train.py --steps 300 --layers 12
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drape.config import deep_merge, parse_config  # noqa: E402
from drape.training.distributed import init_from_env  # noqa: E402
from drape.training.trainer import train_stage  # noqa: E402


def random_split(resolution: int, samples: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    image = lambda: rng.integers(0, 256, (samples, resolution, resolution, 3), dtype=np.uint8)  # noqa: E731
    return {
        "target": image(),
        "agnostic": image(),
        "pose": image(),
        "garment": image(),
        "mask": rng.integers(0, 2, (samples, resolution, resolution), dtype=np.uint8) * 255,
        "garment_mask": rng.integers(0, 2, (samples, resolution, resolution), dtype=np.uint8) * 255,
        "keys": [f"s{i}" for i in range(samples)],
        "meta": [{} for _ in range(samples)],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=100, help="steps between sharded checkpoints")
    parser.add_argument("--layers", type=int, default=None, help="transformer depth (default: the config's)")
    parser.add_argument("--batch", type=int, default=None, help="global batch (default: the config's)")
    parser.add_argument("--resolution", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    import yaml

    cuda = torch.cuda.is_available()
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "h100.yaml").read_text())
    overrides = {
        "queue": {"enabled": False},
        "train": {
            "checkpoint_every": args.every,
            "device": "cuda" if cuda else "cpu",
            "gradient_checkpointing": args.gradient_checkpointing,
            "precision": "bf16" if cuda else "fp32",
            "stages": {"identity": {"steps": args.steps}},
        },
    }
    if args.layers:
        overrides["model"] = {"num_layers": args.layers}
    if args.batch:
        overrides["train"]["batch_size"] = args.batch
    if args.resolution or not cuda:
        overrides["data"] = {"resolution": args.resolution or 64}
    config = parse_config(deep_merge(data, overrides), "configs/h100.yaml + benchmark overrides")
    context = init_from_env(config.train.device)
    split = random_split(config.data.resolution, max(config.train.batch_size * 4, 32))
    with tempfile.TemporaryDirectory(prefix="drape-gpu-bench-") as scratch:
        started = time.perf_counter()
        result = train_stage(config, stage="identity", data=split, out_dir=scratch, init_checkpoint=None, context=context)
        wall = time.perf_counter() - started
    if not context.is_main:
        return 0
    from scheduler.profiles import parameter_counts, tokens_per_sample

    parameters, _ = parameter_counts(config, "identity")
    step_seconds = result.train_seconds / args.steps
    flops = 6 * parameters * tokens_per_sample(config) * config.train.batch_size / step_seconds
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    row = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (smoke test)",
        "ranks": context.world_size,
        "parameters_m": parameters / 1e6,
        "resolution": config.data.resolution,
        "layers": config.model.num_layers,
        "global_batch": config.train.batch_size,
        "step_s": step_seconds,
        "samples_per_s": result.samples_per_second,
        "peak_gib_rank0": peak,
        "mfu": flops / (context.world_size * args.peak_tflops * 1e12) if cuda else float("nan"),
        "checkpoint_stall_share": result.checkpoint_stall_seconds / result.train_seconds,
        "wall_s": wall,
    }
    print("| " + " | ".join(row) + " |\n|" + "---|" * len(row))
    print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()) + " |")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

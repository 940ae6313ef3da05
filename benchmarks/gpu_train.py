"""The production-shaped model on GPUs: step time, peak memory, MFU and checkpoint stall.

Trains configs/fitdit.yaml's transformer (depth reduced with --layers if needed) for --steps steps
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))

from drape.config import EXAMPLE_SITE, load_config  # noqa: E402
from drape.data.partition import StageData  # noqa: E402
from drape.training.loop.distributed import init_from_env  # noqa: E402
from drape.training.loop.trainer import train_stage  # noqa: E402


def noise_stage(directory: Path, config, context) -> StageData:
    """A stage of noise images at the config's resolution as shards (rank 0 writes them), read
    through drape's reader like any stage: enough samples for 4 batches, a shard per partition."""
    from loader_shards import write_stage

    from drape.data.partition import resolve_partitions, split_data

    partitions = resolve_partitions(config.train.data_partitions, context.world_size, config.train.batch_size)
    samples = max(config.train.batch_size * 4, 32, partitions)
    if context.is_main:
        write_stage(
            directory,
            kind="noise",
            samples=samples,
            unique=4,
            resolution=config.data.resolution,
            per_shard=-(-samples // partitions),
        )
    context.barrier()
    return split_data(directory, json.loads((directory / "manifest.json").read_text()), "identity", partitions=partitions)


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
    cuda = torch.cuda.is_available()
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
    # its model and training choices, overridden; no site value matters here (the example's)
    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "fitdit.yaml", overrides, site=EXAMPLE_SITE)
    context = init_from_env(config.train.device)
    with tempfile.TemporaryDirectory(prefix="drape-gpu-bench-") as own:
        shared = [own]  # every rank reads the shards rank 0 writes, and checkpoints to one place
        if context.is_distributed:
            torch.distributed.broadcast_object_list(shared, src=0)
        scratch = Path(shared[0])
        split = noise_stage(scratch / "stage", config, context)
        started = time.perf_counter()
        result = train_stage(config, stage="identity", data=split, out_dir=scratch / "out", init_checkpoint=None, context=context)
        wall = time.perf_counter() - started
        context.barrier()  # rank 0's directory stays until every rank is done with it
    if not context.is_main:
        return 0
    from scheduler.jobs.profiles import parameter_counts, tokens_per_sample

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

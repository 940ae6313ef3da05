"""Checkpoint stall as a share of step time: async DCP vs blocking DCP saves, side by side.

Trains one stage under torchrun (gloo, 2 ranks on CPU; NCCL on GPUs with --nproc matching them)
with a sharded checkpoint every `--every` steps, once with `train.async_checkpoint: true` and once
with false, and prints the time the training loop blocked in checkpoint saves over train time.
The model is the demo's at `--layers` layers and `--resolution` px, so a save is big enough to see.

    .venv/bin/python benchmarks/checkpoint_stall.py            # ~3 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.config import deep_merge, load_config  # noqa: E402
from drape.config.reading.loading import read_yaml  # noqa: E402


def run(config_path: Path, out: Path, nproc: int) -> dict:
    command = [
        str(Path(sys.executable).with_name("torchrun")),
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "drape.train",
        "--config",
        str(config_path),
        "--stage",
        "identity",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=20, help="steps between sharded checkpoints")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    base = read_yaml(REPO / "configs" / "demo.yaml")  # bounded, as every config
    rows = []
    with tempfile.TemporaryDirectory(prefix="drape-stall-") as scratch:
        for mode in ("async", "blocking"):
            data = deep_merge(
                base,
                {
                    "paths": {"root": f"{scratch}/drape"},
                    "queue": {"enabled": False},
                    "data": {"resolution": args.resolution},
                    "model": {"num_layers": args.layers, "num_attention_heads": 4, "attention_head_dim": 32},
                    "train": {
                        "checkpoint_every": args.every,
                        "async_checkpoint": mode == "async",
                        "stages": {"identity": {"steps": args.steps}},
                    },
                },
            )
            path = Path(scratch) / f"{mode}.yaml"
            path.write_text(yaml.safe_dump(data))
            config = load_config(path)
            result = run(path, Path(scratch) / mode, args.nproc)
            saves = args.steps // args.every - (1 if args.steps % args.every == 0 else 0)
            size = sum(p.stat().st_size for p in (Path(scratch) / mode / "checkpoints").rglob("*") if p.is_file())
            rows.append((mode, result, saves, size, config))
            print(f"  {mode}: {result['train_seconds']:.1f} s, stall {result['checkpoint_stall_seconds']:.2f} s", file=sys.stderr)
    print(
        f"\nCheckpoint stall, {args.nproc} ranks ({'NCCL' if os.environ.get('CUDA_VISIBLE_DEVICES') else 'gloo, CPU'}), "
        f"{args.steps} steps, a sharded checkpoint every {args.every} steps\n"
    )
    print("| mode | train s | step s (mean) | saves | stall s | stall per save s | stall share of train time |")
    print("|---|---|---|---|---|---|---|")
    for mode, result, saves, _size, _ in rows:
        step = result["train_seconds"] / args.steps
        print(
            f"| {mode} DCP | {result['train_seconds']:.1f} | {step:.3f} | {saves} | {result['checkpoint_stall_seconds']:.2f} | "
            f"{result['checkpoint_stall_seconds'] / max(saves, 1):.3f} | "
            f"{100 * result['checkpoint_stall_seconds'] / result['train_seconds']:.2f}% |"
        )
    (_, fast, *_), (_, slow, *_) = rows
    print(
        f"\nasync stall / blocking stall = {fast['checkpoint_stall_seconds'] / max(slow['checkpoint_stall_seconds'], 1e-9):.2f}× "
        f"(goal: stall < 1% of step time)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

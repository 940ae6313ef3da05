"""Peak memory of a training process vs the size of its stage: samples decoded on demand from the
shard index (drape) vs every sample decoded into memory before step 1 (the reader drape had before).

For each stage size it writes the identity stage's shards once (the demo config's generator), then
trains 5 steps in a fresh process per reader and records the process's peak RSS. Goal (issue
"Stage data that streams"): at each resolution the largest stage's peak within 1.10× the
smallest's for drape.

    .venv/bin/python benchmarks/dataloader.py [--sizes 192,1536,6144] [--large-sizes 96,768]

Prints one table per resolution (peak RSS MiB per reader and stage size) and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.config import deep_merge, load_config  # noqa: E402

READERS = ("in-memory (before)", "on-demand index (drape)")


def _config_file(root: Path, samples: int, resolution: int) -> Path:
    base = load_config(REPO / "configs" / "demo.yaml").model_dump(mode="json")
    data = deep_merge(
        base,
        {
            "paths": {"root": str(root / "drape")},
            "queue": {"enabled": False},
            "data": {
                "resolution": resolution,
                "samples_per_stage": {"identity": samples, "texture": 16, "geometry": 16, "denoise": 16},
                "name": f"bench-{resolution}",
                "version": f"n{samples}",
            },
            "train": {"device": "cpu", "checkpoint_every": 1000, "stages": {"identity": {"steps": 5}}},
            # the same token count at every resolution: the model's memory stays out of the comparison
            "model": {"patch_size": resolution // 16, "garment_patch_size": resolution // 8},
        },
    )
    path = root / f"config-{resolution}-{samples}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def child(reader: str, config_path: str, out: str) -> None:
    """One training process: 5 steps of the identity stage; prints its peak RSS (MiB) as JSON."""
    from drape.data.dataset import load_split
    from drape.training.distributed import DistContext
    from drape.training.stage_job import StageJob
    from drape.training.trainer import peak_memory_gib, resolve_device, train_stage

    config = load_config(config_path)
    job = StageJob.manual(config, "identity", out_dir=out)
    if reader == READERS[1]:
        job.run()
    else:  # the reader before: the rank's shards decoded and stacked into arrays before step 1
        cache = job._cache(DistContext())
        cache.prestage("identity", keep=["control"])
        arrays = load_split(cache.dataset_dir, cache.manifest, "identity")
        train_stage(config, stage="identity", data=arrays, out_dir=out, init_checkpoint=None)
    print(json.dumps({"peak_rss_mib": peak_memory_gib(resolve_device("cpu")) * 1024}))


def _measure(reader: str, config_path: Path, out: Path) -> float:
    command = [sys.executable, __file__, "--child", reader, "--config", str(config_path), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{reader} at {config_path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def _table(resolution: int, sizes: list[int], scratch: Path) -> None:
    rows = {}
    for samples in sizes:
        config_path = _config_file(scratch, samples, resolution)
        _measure(READERS[1], config_path, scratch / "warm")  # writes the shards and warms the page cache
        rows[samples] = [_measure(reader, config_path, scratch / f"out-{i}-{samples}") for i, reader in enumerate(READERS)]
    print(f"\n{resolution} px: peak RSS of a 5-step training process (MiB)\n")
    print("| reader | " + " | ".join(f"{n:,} samples" for n in sizes) + " | largest / smallest |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for column, reader in enumerate(READERS):
        values = [rows[n][column] for n in sizes]
        print(f"| {reader} | " + " | ".join(f"{v:,.0f}" for v in values) + f" | {values[-1] / values[0]:.2f}× |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="192,1536,6144", help="identity-stage samples at 64 px")
    parser.add_argument("--large-sizes", default="96,768", help="identity-stage samples at 256 px ('' to skip)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.config, args.out)
        return 0
    with tempfile.TemporaryDirectory(prefix="drape-bench-loader-") as scratch:
        _table(64, [int(n) for n in args.sizes.split(",")], Path(scratch))
        if args.large_sizes:
            _table(256, [int(n) for n in args.large_sizes.split(",")], Path(scratch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

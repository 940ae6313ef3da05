"""drape's stage reader, measured four ways, each against its baseline in the same run.

1. memory: peak RSS of a 5-step training process vs its stage's size (192, 1,536, 6,144 samples
   at 64 px; 96 and 768 at 256 px), drape (samples decoded on demand by worker processes) vs
   every sample decoded into memory before step 1 (the reader before). Goal: largest ≤ 1.10×
   smallest.
2. throughput: decoded samples/s at 1024 px with 1 and 2 workers, against the per-rank demand of
   the configs/fitdit.yaml model at 40% MFU; then a loop that sleeps each step's GPU time at that
   demand measures the data-wait share. Goal: the decoding cores per rank for data-wait < 1% (≤ 4).
3. readers: drape vs the `webdataset` package and `litdata` on the same 1024 px samples, same
   worker count: samples/s and peak RSS (trainer; largest worker). Goal: drape ≥ 1.0× the best.
4. warm-up: the time of the first 10 batches vs batches 100-110 from the moment the reader is
   created, page cache dropped (the readers runs) and warm (every shard read once before); then as
   a stage job sees it (the reader made before the model is built, steps at the h100 demand, timed
   from the first step). Goal: ≥ 0.95.

    .venv/bin/python benchmarks/dataloader.py [--parts memory,throughput,readers,warmup] [--repeats 3]

1024 px shards come from benchmarks/loader_shards.py (generator images, and noise as PNG's worst
case). Every measurement runs in a fresh process; the page cache is dropped before each one when
the benchmark may (root), so shards are read from disk as after pre-staging. litdata is used when
importable (it pulls a CUDA torch: install it aside, `pip install --target DIR --no-deps litdata
lightning-utilities obstore tifffile`, and pass --litdata-path DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.append(str(REPO / "benchmarks"))

from drape.config import EXAMPLE_SITE, deep_merge, load_config  # noqa: E402

H100_BF16_DENSE = 989e12  # FLOP/s, H100 SXM dense bf16
MFU = 0.40


def _run_child(spec: dict, extra_path: str | None = None, *, cold: bool = True) -> dict:
    env_path = [extra_path] if extra_path else []
    if cold:
        _drop_page_cache()
    else:
        _read_through(Path(spec["dir"]))
    command = [sys.executable, str(Path(__file__).with_name("dataloader_child.py")), json.dumps(spec)]
    env = {**os.environ, "PYTHONPATH": ":".join([*env_path, str(REPO), str(REPO / "benchmarks")])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=REPO, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _read_through(directory: Path) -> None:
    """Every file under `directory` read once: in the page cache for a warm run."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def _drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


# 1. memory ----------------------------------------------------------------------------------


def _memory_config(root: Path, samples: int, resolution: int) -> Path:
    base = load_config(REPO / "configs" / "demo.yaml").model_dump(mode="json")
    data = deep_merge(
        base,
        {
            "paths": {"root": str(root / "drape")},
            "queue": {"enabled": False},
            "data": {
                "resolution": resolution,
                "synthetic": {"samples_per_stage": {"identity": samples, "texture": 16, "geometry": 16, "denoise": 16}},
                "name": f"bench-{resolution}",
                "version": f"n{samples}",
            },
            "train": {"device": "cpu", "checkpoint_every": 1000, "stages": {"identity": {"steps": 5}}},
            # the same token count at every resolution: the model's memory stays out of the comparison
            "model": {"patch_size": resolution // 16, "garment_patch_size": resolution // 8},
        },
    )
    path = root / f"config-{resolution}-{samples}.yaml"
    path.write_text(json.dumps(data))
    return path


def memory(scratch: Path, sizes: dict[int, list[int]]) -> None:
    for resolution, counts in sizes.items():
        rows = {}
        for samples in counts:
            config = str(_memory_config(scratch, samples, resolution))
            _run_child({"mode": "memory", "reader": "drape", "config": config, "out": str(scratch / "warm")})  # writes shards
            rows[samples] = {
                reader: _run_child(
                    {"mode": "memory", "reader": reader, "config": config, "out": str(scratch / f"o-{reader}-{samples}")}
                )
                for reader in ("before", "drape")
            }
        print(f"\n1. {resolution} px: peak RSS of a 5-step training process, MiB (trainer; its largest child process)\n")
        print("| reader | " + " | ".join(f"{n:,} samples" for n in counts) + " | largest / smallest |")
        print("|---|" + "---|" * (len(counts) + 1))
        for reader, label in (("before", "all decoded before step 1 (before)"), ("drape", "on demand, 2 workers (drape)")):
            main = [rows[n][reader]["peak_rss_mib"] for n in counts]
            child = [rows[n][reader]["worker_peak_rss_mib"] for n in counts]
            cells = [f"{m:,.0f}; {c:,.0f}" for m, c in zip(main, child)]
            print(f"| {label} | " + " | ".join(cells) + f" | {main[-1] / main[0]:.2f}×; {child[-1] / child[0]:.2f}× |")
    print(
        "\n   A forked child's RSS counts the pages it shares with the trainer (the imported libraries), so the"
        "\n   two columns overlap and are not to be added."
    )


# 2.-4. streaming at 1024 px -----------------------------------------------------------------


def h100_demand() -> tuple[float, list[str]]:
    """Samples/s one H100 rank consumes at 40% MFU, from the h100 config's FLOPs per sample."""
    from scheduler.jobs.profiles import parameter_counts, tokens_per_sample

    config = load_config(REPO / "configs" / "fitdit.yaml", site=EXAMPLE_SITE)  # its model: no site value matters
    parameters, _ = parameter_counts(config, None)
    tokens = tokens_per_sample(config)
    layers, width = config.model.num_layers, config.model.num_attention_heads * config.model.attention_head_dim
    dense = 6 * parameters * tokens
    attention = 12 * layers * width * tokens**2  # QKᵀ and AV over the joint sequence, forward + backward
    flops = dense + attention
    demand = MFU * H100_BF16_DENSE / flops
    lines = [
        f"FLOPs per training sample = 6·N·T + 12·L·d·T² = 6 × {parameters / 1e9:.3f} B × {tokens:,} "
        f"+ 12 × {layers} × {width} × {tokens:,}² = {dense:.3e} + {attention:.3e} = {flops:.3e}",
        f"per-rank demand = {MFU:.0%} × {H100_BF16_DENSE / 1e12:.0f} TFLOP/s / {flops:.3e} = {demand:.2f} samples/s "
        f"(6·N·T alone: {MFU * H100_BF16_DENSE / dense:.2f})",
    ]
    return demand, lines


def _stream(
    reader: str, stage: Path, workers: int, batches: int, repeats: int, extra: str | None, cold: bool = True, **spec
) -> dict:
    """The median run (by samples/s) of `repeats` fresh processes (page cache dropped first, or `cold` False: warm)."""
    runs = [
        _run_child(
            {"mode": "stream", "reader": reader, "dir": str(stage), "workers": workers, "batches": batches, **spec},
            extra,
            cold=cold,
        )
        for _ in range(repeats)
    ]
    return sorted(runs, key=lambda run: run["samples_per_second"])[len(runs) // 2]


def throughput(stages: dict[str, Path], repeats: int) -> None:
    demand, formula = h100_demand()
    print("\n2. decode throughput at 1024 px, one sample per step (the h100 config's per-rank batch: 8 / 8 ranks)\n")
    print("\n".join(f"    {line}" for line in formula) + "\n")
    print("| images | workers | samples/s | per worker | cores per rank for the demand (×1.25 headroom) |")
    print("|---|---|---|---|---|")
    per_worker = {}
    for kind, stage in stages.items():
        for workers in (1, 2):
            run = _stream("drape", stage, workers, 130, repeats, None, rows=1)
            rate = run["samples_per_second"]
            per_worker[kind] = min(per_worker.get(kind, rate), rate / workers)
            cores = -(-1.25 * demand // (rate / workers))
            print(f"| {kind} | {workers} | {rate:.1f} | {rate / workers:.1f} | {cores:.0f} |")
    print(
        f"\n   training loop sleeping {1 / demand * 1000:.0f} ms per step (the GPU step at the demand): data-wait share"
        "\n   after the first 10 steps (the first batch's wait is part 4's), and the first batch's wait\n"
    )
    print("| images | workers | supply / demand | data-wait share of step time | first batch's wait (s) |")
    print("|---|---|---|---|---|")
    for kind, stage in stages.items():
        for workers in (1, 2):
            run = _stream("drape", stage, workers, 130, repeats, None, rows=1, step_seconds=1 / demand)
            supply = workers * per_worker[kind] / demand
            print(f"| {kind} | {workers} | {supply:.2f} | {run['data_wait_fraction']:.2%} | {run['first_wait_seconds']:.2f} |")


def readers(stages: dict[str, Path], repeats: int, litdata: str | None, results: dict) -> None:
    names = ["drape", "webdataset"] + (["litdata"] if litdata is not None else [])
    print("\n3. readers on the same 1024 px samples, 2 workers, batch 4 (median of the runs)\n")
    print("| images | reader | samples/s | vs best other | peak RSS trainer / largest worker (MiB) |")
    print("|---|---|---|---|---|")
    for kind, stage in stages.items():
        runs = {name: _stream(name, stage, 2, 120, repeats, litdata, rows=4) for name in names}
        results[kind] = runs
        best = max(run["samples_per_second"] for name, run in runs.items() if name != "drape")
        for name, run in runs.items():
            ratio = f"{run['samples_per_second'] / best:.2f}×" if name == "drape" else ""
            memory = f"{run['peak_rss_mib']:,.0f} / {run['worker_peak_rss_mib']:,.0f}"
            print(f"| {kind} | {name} | {run['samples_per_second']:.1f} | {ratio} | {memory} |")


def warmup(stages: dict[str, Path], repeats: int, litdata: str | None, results: dict) -> None:
    """First 10 batches vs 100-110: from the readers runs (page cache dropped before each: the first
    batches read the disk while later ones partly hit what earlier draws cached, so every reader's
    ratio is lowered by the stage being small), and from runs with every shard in the page cache
    (both ends read memory: what is left is the reader's own start-up). Then as a stage job sees
    it: the reader created, the model built (configs/fitdit.yaml's, on this CPU), then steps at the
    h100 demand (one sample per rank, the GPU step slept), timed from the first step."""
    names = ["drape", "webdataset"] + (["litdata"] if litdata is not None else [])
    warm = {
        kind: {name: _stream(name, stage, 2, 120, repeats, litdata, cold=False, rows=4) for name in names}
        for kind, stage in stages.items()
    }
    print("\n4. first 10 batches vs batches 100-110, from the reader's creation (median runs)\n")
    print("| images | reader | page cache | first 10 (s) | 100-110 (s) | ratio (goal ≥ 0.95) |")
    print("|---|---|---|---|---|---|")
    for label, table in (("dropped", results), ("warm", warm)):
        for kind, runs in table.items():
            for name, run in runs.items():
                done = run["done_at"]
                first, steady = done[9], done[109] - done[99]
                print(f"| {kind} | {name} | {label} | {first:.2f} | {steady:.2f} | {steady / first:.2f} |")
    demand, _ = h100_demand()
    print(
        f"\n   as a stage job sees it: reader created, model built, then steps of {1 / demand * 1000:.0f} ms"
        " (the h100 demand), one sample each, page cache dropped; from the first step\n"
    )
    print(
        "| images | reader | model build (s) | first 10 steps (s) | steps 100-110 (s) | ratio | data-wait in the first 10 (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, stage in stages.items():
        for name in names:
            run = _stream(name, stage, 2, 120, repeats, litdata, rows=1, step_seconds=1 / demand, setup=True)
            done = run["done_at"]
            first, steady = done[9], done[109] - done[99]
            print(
                f"| {kind} | {name} | {run['setup_seconds']:.1f} | {first:.2f} | {steady:.2f} | {steady / first:.2f} "
                f"| {run['first_ten_wait_seconds']:.3f} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="memory,throughput,readers,warmup")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per streaming measurement (median)")
    parser.add_argument("--samples", type=int, default=256, help="samples in each 1024 px stage")
    parser.add_argument("--unique", type=int, default=6, help="distinct generated samples in the synth stage")
    parser.add_argument("--litdata-path", default=None, help="a directory litdata is installed in (--target)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    litdata = _litdata(args.litdata_path)
    with tempfile.TemporaryDirectory(
        prefix="drape-bench-loader-", dir=REPO / ".drape" if (REPO / ".drape").is_dir() else None
    ) as tmp:
        scratch = Path(tmp)
        if "memory" in parts:
            memory(scratch, {64: [192, 1536, 6144], 256: [96, 768]})
        if parts & {"throughput", "readers", "warmup"}:
            from loader_shards import write_stage

            stages = {}
            for kind in ("synth", "noise"):
                stages[kind] = scratch / f"stage-{kind}"
                write_stage(stages[kind], kind=kind, samples=args.samples, unique=args.unique)
                if litdata is not None:
                    _run_child({"mode": "convert-litdata", "dir": str(stages[kind])}, litdata)
            if "throughput" in parts:
                throughput(stages, args.repeats)
            results: dict = {}
            if parts & {"readers", "warmup"}:
                readers(stages, args.repeats, litdata, results)
            if "warmup" in parts:
                warmup(stages, args.repeats, litdata, results)
    return 0


def _litdata(path: str | None) -> str | None:
    """The extra import path under which litdata imports ('' when it is installed), or None."""
    probe = subprocess.run(
        [sys.executable, "-c", "import litdata"], env={"PYTHONPATH": path or ""}, capture_output=True, cwd=REPO
    )
    if probe.returncode:
        print("(litdata is not importable: its column is left out; see the module docstring)")
        return None
    return path or ""


if __name__ == "__main__":
    raise SystemExit(main())

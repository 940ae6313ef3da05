"""drape's training step against a bare PyTorch loop on the same tiny model: drape's overhead.

Both sides train the same model (`drape.training.recipes.model.build_model` of tests/configs/tiny.yaml,
32 px, batch 16, CPU) with the same torch AdamW at the same learning rate, on the same batches
in the same order, with the same DDPM noising and target and the same gradient clipping, so what
differs is drape around the step:

- drape: `drape.training.loop.trainer.train_stage` as a stage job calls it, batches read and decoded
  by its prefetcher (`BatchPrefetcher`, `data.loader` workers) from local shards, the step's
  seeded draws, condition dropout, the LR schedule, loss reduction, Prometheus step metrics and
  the checkpointer's cadence check. Per-step time is the gap between its `progress` callbacks
  (data-wait included); the stage's final checkpoint (once per stage) falls outside the timed
  steps, and no intermediate checkpoint is due.
- bare: a plain for-loop over the same steps' batches as decoded (uint8, drawn by drape's seeded
  indices beforehand and held in memory): to float, forward, loss, backward, clip, step, noise and
  timesteps drawn inline from a seeded generator. It never waits for data: its row is the floor.

Each run warms up for `--warmup` steps, then times `--steps` steps; the pair runs `--repeats`
times, alternating which goes first. The table shows the median per-step time of each side over
all timed steps, the ratio and the overhead (drape / bare - 1; the issue's goal: at most 5%).
Over 5%, or with `--profile`, a cProfile of one drape run prints where the time goes.

    .venv/bin/python benchmarks/train_overhead.py   # about 30 s on 2 CPU cores (OMP_NUM_THREADS=1)
    .venv/bin/python benchmarks/train_overhead.py --steps 60 --repeats 7 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.config import PipelineConfig, deep_merge, load_config, parse_config  # noqa: E402
from drape.data.dataset import build_dataset  # noqa: E402
from drape.data.partition import StageData, split_data  # noqa: E402
from drape.training.loop.batches import BatchPrefetcher  # noqa: E402
from drape.training.loop.distributed import DistContext  # noqa: E402
from drape.training.loop.trainer import train_stage  # noqa: E402
from drape.training.recipes.model import build_model  # noqa: E402
from drape.training.recipes.objective import build_noise_scheduler  # noqa: E402

STAGE = "identity"  # tiny.yaml trains every parameter in it: the bare loop's optimizer holds them all
GOAL = 0.05


def tiny_config(root: Path, total: int, resolution: int = 32) -> PipelineConfig:
    """tests/configs/tiny.yaml under `root` at `resolution` px, its identity stage `total` steps, no
    checkpoint due before the end."""
    path = REPO / "tests" / "configs" / "tiny.yaml"
    raw = load_config(path).model_dump(mode="json", by_alias=True)
    raw["data"]["resolution"] = resolution
    train = {"checkpoint_every": total + 1, "log_every": 1, "stages": {STAGE: {"steps": total}}}  # every step's data-wait
    patch = {"paths": {"root": str(root)}, "train": train}
    return parse_config(deep_merge(raw, patch), str(path))


def time_drape(config: PipelineConfig, data: StageData, out: Path, warmup: int) -> tuple[list[float], list[float]]:
    """Per-step seconds of one `train_stage` run and each step's data-wait (the time it blocked on
    the prefetcher, from the step metrics), warm-up and the final (checkpointing) step left out."""
    marks: list[float] = []
    waits: dict[int, float] = {}

    def sink(metrics: dict[str, float], step: int) -> None:
        if f"{STAGE}/data_wait_seconds" in metrics:  # the stage's end also reports per-rank fractions
            waits[step] = metrics[f"{STAGE}/data_wait_seconds"]

    progress = lambda *_: marks.append(time.perf_counter())  # noqa: E731
    train_stage(config, stage=STAGE, data=data, out_dir=out, init_checkpoint=None, log_metrics=sink, progress=progress)
    gaps = [later - earlier for earlier, later in zip(marks, marks[1:])]  # gaps[i]: step i + 2
    kept = range(max(warmup - 1, 0), len(gaps) - 1)
    return [gaps[i] for i in kept], [waits[i + 2] for i in kept]


def load_batches(config: PipelineConfig, data: StageData, total: int) -> list[dict[str, torch.Tensor]]:
    """The stage's first `total` batches (drape's seeded indices) as decoded: uint8 arrays, in memory."""
    prefetcher = BatchPrefetcher.for_rank(config, data, DistContext(device=torch.device("cpu")), stage=STAGE, start=0, stop=total)
    batches = []
    try:
        for _ in range(total):
            (_, batch, _), _ = prefetcher.next()
            batches.append({name: tensor.clone() for name, tensor in batch.items()})
    finally:
        prefetcher.close()
    return batches


def to_float(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What any loop does to a uint8 batch: images to [-1, 1] (N, C, H, W), the mask to [0, 1]."""
    images = {name: batch[name].permute(0, 3, 1, 2).float() / 127.5 - 1 for name in ("target", "agnostic", "pose", "garment")}
    condition = {name: images[name] for name in ("agnostic", "pose", "garment")}
    return images["target"], condition | {"mask": batch["mask"].float()[:, None] / 255.0}


def time_bare(config: PipelineConfig, batches: list[dict[str, torch.Tensor]], warmup: int) -> list[float]:
    """Per-step seconds of a plain loop over `batches`: to float, forward, MSE to the target,
    backward, clip, AdamW."""
    model = build_model(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay)
    scheduler = build_noise_scheduler(config.diffusion)  # diffusers' DDPMScheduler, nothing of drape's around it
    generator, steps = torch.Generator().manual_seed(config.seed), config.diffusion.num_train_timesteps
    times = []
    for batch in batches:
        started = time.perf_counter()
        clean, condition = to_float(batch)
        noise = torch.randn(clean.shape, generator=generator)
        timesteps = torch.randint(0, steps, (len(clean),), generator=generator)
        prediction = model(scheduler.add_noise(clean, noise, timesteps), timesteps, **condition)
        target = clean if config.diffusion.prediction_type == "sample" else noise
        loss = F.mse_loss(prediction.float(), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        optimizer.step()
        float(loss.detach())  # drape reads each step's loss too
        times.append(time.perf_counter() - started)
    return times[warmup:-1]  # the same steps drape's timing keeps


def profile_drape(config: PipelineConfig, data: StageData, out: Path, top: int = 25) -> str:
    """cProfile of one drape run: the `top` functions by own time, then by cumulative time."""
    profiler = cProfile.Profile()
    profiler.runcall(train_stage, config, stage=STAGE, data=data, out_dir=out, init_checkpoint=None)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"drape/(training|data)/", top)  # drape's own functions
    return text.getvalue()


def print_table(drape: list[float], bare: list[float], waits: list[float], repeats: int, steps: int) -> float:
    """The table: drape, drape less its data-wait, bare; returns the overhead drape / bare - 1 of the medians."""
    rows = {"drape (train_stage)": drape, "drape less data-wait": [t - w for t, w in zip(drape, waits)], "bare loop": bare}
    bare_ms = statistics.median(bare) * 1e3
    print(f"\nper-step time, medians over {len(bare)} steps each ({repeats} repeats × {steps} timed steps)")
    print(f"{'':24}{'median ms':>11}{'p10 ms':>9}{'p90 ms':>9}{'/ bare':>9}{'overhead':>10}")
    for name, values in rows.items():
        median, deciles = statistics.median(values) * 1e3, statistics.quantiles(values, n=10)
        spread = f"{deciles[0] * 1e3:9.2f}{deciles[-1] * 1e3:9.2f}"
        print(f"{name:24}{median:11.2f}{spread}{median / bare_ms:9.3f}{median / bare_ms - 1:+10.1%}")
    median_wait, mean_wait = statistics.median(waits) * 1e3, statistics.mean(waits) * 1e3
    print(f"drape's data-wait: median {median_wait:.2f} ms, mean {mean_wait:.2f} ms per step")
    overhead = statistics.median(drape) * 1e3 / bare_ms - 1
    verdict = "within" if overhead <= GOAL else "OVER"
    print(f"overhead drape / bare - 1: {overhead:+.1%} ({verdict} the {GOAL:.0%} goal)")
    return overhead


def measure(args: argparse.Namespace, root: Path, resolution: int) -> tuple[float, float, float]:
    """One size's table: the drape/bare pairs at `resolution` px; returns (drape ms, bare ms, overhead)."""
    total = args.warmup + args.steps + 1  # + the final step, whose checkpoint save is not timed
    config = tiny_config(root / "drape", total, resolution)
    manifest = build_dataset(config, root / "shards")
    data = split_data(root / "shards", manifest, STAGE)
    batches = load_batches(config, data, total)
    drape: list[float] = []
    bare: list[float] = []
    waits: list[float] = []
    print(f"\n{resolution}×{resolution} px, batch {config.train.batch_size}", flush=True)
    for repeat in range(args.repeats):
        order = ("drape", "bare") if repeat % 2 == 0 else ("bare", "drape")
        for side in order:
            if side == "drape":
                times, waited = time_drape(config, data, root / f"run-{repeat}", args.warmup)
                drape, waits = drape + times, waits + waited
            else:
                bare += time_bare(config, batches, args.warmup)
        so_far = f"drape {statistics.median(drape) * 1e3:.2f} ms, bare {statistics.median(bare) * 1e3:.2f} ms"
        print(f"repeat {repeat + 1}/{args.repeats}: {so_far}", flush=True)
    overhead = print_table(drape, bare, waits, args.repeats, args.steps)
    if overhead > GOAL or args.profile:
        print("\ncProfile of one drape run (model build and the final checkpoint included):")
        print(profile_drape(config, data, root / "profiled"))
    return statistics.median(drape) * 1e3, statistics.median(bare) * 1e3, overhead


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=7, help="drape/bare pairs, alternating which runs first")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps at the start of each run")
    parser.add_argument("--resolutions", default="32,64", help="sizes of the tiny model's images, comma-separated")
    parser.add_argument("--profile", action="store_true", help="profile a drape run even within the goal")
    args = parser.parse_args()
    rows = {}
    for resolution in (int(r) for r in args.resolutions.split(",")):
        with tempfile.TemporaryDirectory(prefix="drape-overhead-") as scratch:
            rows[resolution] = measure(args, Path(scratch), resolution)
    print("\nsummary: drape's cost per step is about constant; its share falls as the step grows")
    print(f"{'size':>8}{'bare ms':>10}{'drape ms':>10}{'+ ms/step':>11}{'overhead':>10}")
    for resolution, (drape_ms, bare_ms, overhead) in rows.items():
        print(f"{resolution:>6}px{bare_ms:10.2f}{drape_ms:10.2f}{drape_ms - bare_ms:11.2f}{overhead:+10.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

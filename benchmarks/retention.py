"""Live footprint and storage cost over ten pipeline cycles: drape's retention vs keeping everything.

Each cycle is one full run (four stages, one a week) that leaves, per stage, the artifacts of the
production shape scaled down by `--scale` (sizes below are at scale 1): full checkpoints
(0.9 B parameters: fp32 weights + AdamW moments ≈ 10.9 GB) every 1,000 steps of a 12,500-step
stage, the promoted weights (3.6 GB), validation outputs, latent snapshots, a gate report and the
stage's synthetic shards. Side by side in one run:

- drape: the real code path (classify → plan → verified archive to a file:// object store, the
  baseline swap, shards dropped after their stage, the weekly retention sweep), live bytes
  measured on disk;
- keep everything live: nothing leaves the nodes.

Retention policy and prices are those of configs/h100.yaml. Prints live bytes per cycle for both,
the ratio, and the modelled monthly cost of each.

    .venv/bin/python benchmarks/retention.py [--cycles 10] [--scale 0.001]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from drape import STAGES
from drape.config import EXAMPLE_SITE, load_config
from drape.storage.retention import classify_stage_dir, execute_plan, plan_retention, read_archive_manifest
from drape.storage.store import ObjectStore, tree_bytes
from drape.storage.sweep import sweep

GB = 1e9
# bytes at production scale, per stage of one cycle
FULL_CHECKPOINT, WEIGHTS, CHECKPOINTS_PER_STAGE = 10.9 * GB, 3.6 * GB, 12
VALIDATION, LATENTS, REPORT, SHARDS = 2.0 * GB, 1.5 * GB, 0.002 * GB, 40 * GB
H100 = load_config(Path(__file__).resolve().parents[1] / "configs" / "h100.yaml", site=EXAMPLE_SITE)  # its policy and prices
POLICY, PRICES = H100.retention, H100.storage.prices_per_gb_month  # drape's production policy and prices


def _file(path: Path, size: float, tag: str) -> None:
    """A file of `size` bytes whose content differs per artifact (so hashes and dedup are honest)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = tag.encode() * 8
    data = (seed * (int(size) // len(seed) + 1))[: int(size)]
    path.write_bytes(data)


def _stage_outputs(stage_dir: Path, scale: float, tag: str) -> None:
    for index in range(CHECKPOINTS_PER_STAGE):
        _file(
            stage_dir / "checkpoints" / f"step-{(index + 1) * 1000:07d}" / "model.safetensors",
            FULL_CHECKPOINT * scale,
            f"{tag}{index}",
        )
    _file(stage_dir / "gate" / "outputs" / "outputs.tar", VALIDATION * scale, tag + "v")
    _file(stage_dir / "gate" / "latents.safetensors", LATENTS * scale, tag + "l")
    _file(stage_dir / "gate" / "report.json", REPORT * scale, tag + "r")


def run_drape(root: Path, cycles: int, scale: float) -> list[dict]:
    live, store = root / "live", ObjectStore(f"file://{root / 'objects'}")
    baseline_runs: dict[str, str] = {}
    start, rows = datetime(2026, 1, 5, tzinfo=UTC), []
    for cycle in range(cycles):
        run = f"run{cycle:02d}"
        for stage in STAGES:
            _file(live / "shards" / stage / "shards.tar", SHARDS * scale, f"{run}{stage}s")  # pre-staged
            stage_dir = live / "runs" / run / stage
            _stage_outputs(stage_dir, scale, f"{run}{stage}")
            baseline = live / "baselines" / stage
            if baseline.exists():  # the snapshot swap: the old baseline is archived with the run
                shutil.move(str(baseline), stage_dir / "superseded-baseline")
            _file(baseline / "checkpoint" / "model.safetensors", WEIGHTS * scale, f"{run}{stage}w")
            plan = plan_retention(classify_stage_dir(stage_dir, "passed"), POLICY, key_root=f"runs/{run}/{stage}")
            now = start + timedelta(days=7 * cycle)
            execute_plan(plan, store, f"archive/manifests/{run}/{stage}", run_id=run, stage=stage, now=now)
            shutil.rmtree(live / "shards" / stage)
            baseline_runs[stage] = run
        sweep(store, POLICY, baseline_runs, now=now)
        archived = [r for r in read_archive_manifest(store)]
        rows.append({"live": tree_bytes(live) / scale, "archived": archived, "now": now})
    return rows


def run_keep_everything(cycles: int) -> list[float]:
    per_cycle = len(STAGES) * (CHECKPOINTS_PER_STAGE * FULL_CHECKPOINT + VALIDATION + LATENTS + REPORT + SHARDS + WEIGHTS)
    return [per_cycle * (cycle + 1) for cycle in range(cycles)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--scale", type=float, default=0.001, help="size factor for the files written (results scaled back)")
    args = parser.parse_args()
    prices = PRICES
    with tempfile.TemporaryDirectory(prefix="drape-retention-") as scratch:
        drape_rows = run_drape(Path(scratch), args.cycles, args.scale)
    keep = run_keep_everything(args.cycles)
    working_set = drape_rows[0]["live"]
    table = Table(title=f"retention over {args.cycles} weekly cycles (production-shape sizes, files at scale {args.scale})")
    for column in ("cycle", "drape live", "keep-everything live", "ratio", "drape archived", "drape $/month", "keep $/month"):
        table.add_column(column, justify="right")
    for cycle, (row, kept) in enumerate(zip(drape_rows, keep), start=1):
        archived_cost = sum(r["bytes"] / args.scale / GB * prices[r["storage_class"]] for r in row["archived"])
        archived = sum(r["bytes"] for r in row["archived"]) / args.scale
        drape_cost = row["live"] / GB * prices["live"] + archived_cost
        keep_cost = kept / GB * prices["live"]
        table.add_row(
            str(cycle),
            f"{row['live'] / GB:,.1f} GB",
            f"{kept / GB:,.1f} GB",
            f"{kept / row['live']:.1f}x",
            f"{archived / GB:,.1f} GB",
            f"${drape_cost:,.2f}",
            f"${keep_cost:,.2f}",
        )
    Console(width=150).print(table)
    last = drape_rows[-1]["live"]
    console = Console(width=150)
    console.print(f"live after {args.cycles} cycles / one cycle's working set: {last / working_set:.2f}x (goal <= 1.2x)")
    console.print(f"keep-everything / drape live after {args.cycles} cycles: {keep[-1] / last:.1f}x (goal >= 10x)")
    final_archived_cost = sum(r["bytes"] / args.scale / GB * prices[r["storage_class"]] for r in drape_rows[-1]["archived"])
    final_cost = last / GB * prices["live"] + final_archived_cost
    console.print(f"monthly cost, keep-everything / drape: {keep[-1] / GB * prices['live'] / final_cost:.1f}x (goal >= 30x)")


if __name__ == "__main__":
    main()

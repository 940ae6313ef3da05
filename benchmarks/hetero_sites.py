"""Wide gangs on heterogeneous sites with mixed priorities (issue 66): drape beside Slurm's default.

Issue 66 asks drape's wide gangs to wait less than under FIFO + EASY backfill on the same week. Its
weeks (`benchmarks/wide_gangs.py`) run on one GPU model in 8-GPU nodes, gangs at the top priority.
Sites differ: several GPU models, nodes of 3, 4 and 8 GPUs, memory that rules a model out, and
teams whose jobs of every width come at every priority. There FIFO + EASY is not the only
reference: Slurm's own default, with its priority plugin, orders the queue by priority and gives
EASY's reservation to the first job of the highest priority that cannot start (`priority-easy`).

Sites (`SITES`; node names as sites spell them, not as the other benchmarks do):
- "three models": 3 nodes x 8 H100 80 GB, 2 x 4 A100 80 GB, 3 x 3 L40S 48 GB (41 GPUs);
- "two generations": 6 x 8 H100 80 GB, 6 x 8 A100 40 GB (96 GPUs);
- "small nodes": 12 x 4 A100 80 GB, 4 x 8 H100 80 GB (80 GPUs).

The week (`week`): the wide-gang week's kinds and run times (lognormal, sigma 1.0, medians 0.3 h
for gate evaluations, 20 h for single-GPU services, 2 h for 2-4-GPU fine-tunes, 5, 6 and 8 h for
8-, 16- and 32-GPU stage gangs; capped at 4 days), GPU-hour shares 12 / 20 / 13 / 20 / 20 / 15 %,
0.85 of the site's week (`--load`) arriving over six days. A width no model of the site can hold
at all is replaced by the widest one it can (the three-model site holds no 32-GPU gang). Memory per
GPU: 8-40 GiB for single-GPU jobs, 20-75 GiB for the others, so some fit only the 80 GB models; a
quarter of the multi-GPU jobs may run only on H100s. Each job's priority is drawn, whatever its
width: 0 (research, 45%), 1 (product, 35%), 5 (production, 20%).

Policies: drape as it ships (`PolicyConfig()`, on an engine that spans nodes: Slurm), drape as the queue
overlay `configs/queue/gang-waits.yaml` sets it ("overlay", read from the file) and as
`benchmarks/wide_gangs.py`'s "searched" sets it (the gang bound on), `fifo-easy` and
`priority-easy` (`scheduler/policy/baselines.py`). drape orders its queue by priority with aging
(`aging_per_hour`, 1 by default: a job of priority 0 that has waited 5 h ranks with a new job of
priority 5), so it is neither reference's order.

Per site and seed: the offered load; per policy the share of the offered-load bound, the 1-GPU mean
wait, the max delay of the gangs of 8 GPUs or more (`SimResult.job_delays`: finish - submit -
duration) over all of them and per priority, and the work lost. Then, for each drape setting: the
issue's goal (the gangs' max delay below `fifo-easy`'s, all priorities together), and per priority
against `priority-easy`. `--replays K`: medians over the week and K - 1 copies with every submit
moved by up to a minute (`benchmarks/replays.py`); a comparison counts as won where more than half
the replays win it. The end has the summary over sites and seeds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hetero_sites.py [--sites all] [--seeds 1-3] [--replays 1] [--load 0.85]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import replays  # noqa: E402
from benchmarks.wide_gangs import policies as wide_policies  # noqa: E402
from scheduler.policy import GpuState, PolicyConfig  # noqa: E402
from scheduler.policy.gangs import never_fits  # noqa: E402
from scheduler.sim import SimResult, TraceJob, simulate  # noqa: E402
from scheduler.sim.model import request_of  # noqa: E402

WEEK_S = 7 * 24 * 3600.0
H100, A100, A100_40, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S"
# site → (node prefix, model, GiB, nodes, GPUs a node)
SITES: dict[str, list[tuple[str, str, float, int, int]]] = {
    "three models": [("dgx-h100.r07-n", H100, 80.0, 3, 8), ("a100_sxm4-", A100, 80.0, 2, 4), ("l40s-pcie.", L40S, 48.0, 3, 3)],
    "two generations": [("hgx-h100-", H100, 80.0, 6, 8), ("dgx-a100-40g-", A100_40, 40.0, 6, 8)],
    "small nodes": [("xe8545-a100-", A100, 80.0, 12, 4), ("hgx-h100-", H100, 80.0, 4, 8)],
}
# (kind, widths, share of the GPU-hours, median hours, GiB per GPU)
MIX = (
    ("gate-eval", (1,), 0.12, 0.3, (8.0, 40.0)),
    ("service", (1,), 0.20, 20.0, (10.0, 40.0)),
    ("finetune", (2, 3, 4), 0.13, 2.0, (20.0, 75.0)),
    ("stage-8", (8,), 0.20, 5.0, (20.0, 75.0)),
    ("stage-16", (16,), 0.20, 6.0, (20.0, 75.0)),
    ("stage-32", (32,), 0.15, 8.0, (20.0, 75.0)),
)
SIGMA, CAP_S = 1.0, 4 * 86400.0
PRIORITIES = ((0, 0.45), (1, 0.35), (5, 0.20))  # drawn per job, whatever its width
ONLY_H100 = 0.25  # the share of multi-GPU jobs that may run only on H100s
WIDE = 8  # "wide gangs": jobs of this many GPUs or more


def site(name: str) -> list[GpuState]:
    """The GPUs of site `name` (`SITES`)."""
    return [
        GpuState(f"{prefix}{node:02d}/gpu{i}", f"{prefix}{node:02d}", model, memory)
        for prefix, model, memory, nodes, per_node in SITES[name]
        for node in range(nodes)
        for i in range(per_node)
    ]


def _placeable(width: int, gpus: list[GpuState]) -> bool:
    job = TraceJob("probe", 0.0, 60.0, 1.0, width, 0, "probe")
    return never_fits(request_of(job), gpus, True) is None


def _job(rng: random.Random, index: int, kind: str, width: int, median_h: float, memory, gpus) -> TraceJob:
    """One job of `kind`: its run time, submit, priority, and memory and models the site can hold."""
    duration = max(min(rng.lognormvariate(math.log(median_h * 3600), SIGMA), CAP_S), 60.0)
    submit = rng.uniform(0, WEEK_S * 6 / 7)
    priority = rng.choices([p for p, _ in PRIORITIES], [w for _, w in PRIORITIES])[0]
    for _ in range(50):
        models = ("H100",) if width > 1 and rng.random() < ONLY_H100 else ()
        job = TraceJob(f"{kind}-{index:05d}", submit, duration, round(rng.uniform(*memory), 1), width, priority, kind, models)
        if never_fits(request_of(job), gpus, True) is None:
            return job
    raise RuntimeError(f"{kind}: no memory and models drawn in 50 tries that the site can hold {width} GPU(s) of")


def week(gpus: list[GpuState], load: float, seed: int) -> list[TraceJob]:
    """The week (module docstring) for the site `gpus`, drawn by `seed`."""
    rng, jobs = random.Random(seed), []
    placeable = [w for w in sorted({w for _, widths, *_ in MIX for w in widths}) if _placeable(w, gpus)]
    for kind, widths, share, median_h, memory in MIX:
        hours = load * len(gpus) * WEEK_S / 3600 * share
        while hours > 0:
            width = rng.choice(widths)
            width = width if width in placeable else placeable[-1]
            job = _job(rng, len(jobs), kind, width, median_h, memory, gpus)
            jobs.append(job)
            hours -= width * job.duration_s / 3600
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def settings(aging: tuple[float, ...] = ()) -> list[tuple[str, str, PolicyConfig]]:
    """(name, policy, config): drape, the queue overlay ("overlay"), "searched", `fifo-easy` and `priority-easy`,
    all on an engine that spans nodes; then drape and "searched" again at each rate of `aging` (`aging_per_hour`)."""
    spans = PolicyConfig(span_nodes=True)
    (_, _, shipped), (_, _, searched) = wide_policies(1.0, True, ("overlay", "searched"))
    found = [
        ("drape", "drape", spans),
        ("overlay", "drape", shipped),
        ("searched", "drape", searched),
        ("fifo-easy", "fifo-easy", spans),
        ("priority-easy", "priority-easy", spans),
    ]
    for rate in aging:
        found += [(f"drape, aging {rate:g}", "drape", replace(spans, aging_per_hour=rate))]
        found += [(f"searched, aging {rate:g}", "drape", replace(searched, aging_per_hour=rate))]
    return found


def gang_max(result: SimResult, trace: list[TraceJob], priority: int | None = None) -> float:
    """The max delay of the wide gangs of `trace` (of `priority`; None: all), from `result`."""
    return max((result.job_delays[j.job_id] for j in trace if j.gpus >= WIDE and priority in (None, j.priority)), default=0.0)


def figures(result: SimResult, trace: list[TraceJob]) -> dict[str, float]:
    """What the tables print of one run."""
    work_h = sum(j.gpus * j.duration_s for j in trace) / 3600
    found = {
        "of bound": result.of_bound,
        "1-GPU mean (min)": result.class_waits.get("1", {}).get("mean_s", 0.0) / 60,
        "gangs: max (h)": gang_max(result, trace) / 3600,
    }
    for priority, _ in sorted(PRIORITIES, reverse=True):
        found[f"p{priority} (h)"] = gang_max(result, trace, priority) / 3600
    found["lost (%)"] = 100 * result.lost_gpu_h / work_h if work_h else 0.0
    return found


def judge(runs: dict[str, list[dict[str, float]]], ours: str) -> list[str]:
    """`ours` against the references, replay by replay: the gangs' max delay below `fifo-easy`'s (the
    issue's goal), and per priority not above `priority-easy`'s; won where more than half win."""

    def won(key: str, theirs: str, strict: bool) -> tuple[bool, int]:
        wins = sum((a[key] < b[key]) if strict else (a[key] <= b[key]) for a, b in zip(runs[ours], runs[theirs], strict=True))
        return replays.most(wins, len(runs[ours])), wins

    said = []
    ok, wins = won("gangs: max (h)", "fifo-easy", True)
    said.append(f"below fifo-easy: {'yes' if ok else 'NO'} ({wins} of {len(runs[ours])})")
    for priority, _ in sorted(PRIORITIES, reverse=True):
        ok, wins = won(f"p{priority} (h)", "priority-easy", False)
        said.append(f"p{priority} <= priority-easy: {'yes' if ok else 'NO'} ({wins} of {len(runs[ours])})")
    return said


def run_site(name: str, seed: int, load: float, replays_each: int, aging: tuple[float, ...] = ()) -> list[list[str]]:
    """One site and seed: the table, the verdicts; returns the summary's rows."""
    gpus = site(name)
    trace = week(gpus, load, seed)
    draws = replays.draws(trace, f"hetero/{name}, seed {seed}", replays_each)
    offered = sum(j.gpus * j.duration_s for j in trace) / (len(gpus) * WEEK_S * 6 / 7)
    wide = sum(1 for j in trace if j.gpus >= WIDE)
    print(
        f"\n### {name}, seed {seed}: {len(trace)} jobs ({wide} gangs of {WIDE}+ GPUs) on {len(gpus)} GPUs, "
        f"offered load {offered:.2f} over the arrival window" + (f", medians over {len(draws)} replays" if len(draws) > 1 else "")
    )
    runs: dict[str, list[dict[str, float]]] = {}
    for label, policy, config in settings(aging):
        started = time.perf_counter()
        runs[label] = [figures(simulate(draw, gpus, policy, config), draw) for draw in draws]
        took = time.perf_counter() - started
        if label == "drape":
            print("\n| policy | " + " | ".join(runs[label][0]) + " |\n|---|" + "---|" * len(runs[label][0]))
        cells = [f"{statistics.median(r[key] for r in runs[label]):.3g}" for key in runs[label][0]]
        print(f"| {label} | " + " | ".join(cells) + f" |  <!-- {took:.0f} s -->")
    rows = []
    for ours in [label for label in runs if label.startswith(("drape", "overlay", "searched"))]:
        said = judge(runs, ours)
        print(f"\n{ours}: " + "; ".join(said))
        rows.append([name, str(seed), f"{offered:.2f}", ours, *[s.split(": ", 1)[1] for s in said]])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", default="all", help=f"'all' or some of: {', '.join(SITES)} (comma-separated)")
    parser.add_argument("--seeds", default="1-3", help="seeds: 1-3 or 1,4")
    parser.add_argument("--load", type=float, default=0.85, help="the week's GPU-hours over the site's week's, in (0, 2]")
    parser.add_argument("--aging", default="", help="also drape and searched at these aging_per_hour rates: 0,0.25")
    parser.add_argument("--replays", type=int, default=1, help=f"replays of each week, 1 to {replays.MAX_REPLAYS}")
    args = parser.parse_args(argv)
    names = list(SITES) if args.sites == "all" else [s.strip() for s in args.sites.split(",") if s.strip()]
    if unknown := [n for n in names if n not in SITES]:
        parser.error(f"--sites: unknown {unknown}; expected 'all' or some of {', '.join(SITES)}")
    if not (math.isfinite(args.load) and 0 < args.load <= 2):
        parser.error(f"--load: expected a number in (0, 2], got {args.load}")
    if not 1 <= args.replays <= replays.MAX_REPLAYS:
        parser.error(f"--replays: expected 1 to {replays.MAX_REPLAYS}, got {args.replays}")
    try:
        aging = tuple(float(rate) for rate in args.aging.split(",") if rate.strip())
    except ValueError:
        parser.error(f"--aging: expected rates such as 0,0.25, got {args.aging!r}")
    if any(not (math.isfinite(rate) and 0 <= rate <= 1000) for rate in aging):
        parser.error(f"--aging: expected rates in [0, 1000], got {args.aging!r}")
    low, _, high = args.seeds.partition("-")
    try:
        seeds = list(range(int(low), int(high) + 1)) if high else [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: expected a range (1-3) or a list (1,4), got {args.seeds!r}")
    load = os.getloadavg()
    print(f"machine load (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    started, rows = time.perf_counter(), []
    for name in names:
        for seed in seeds:
            rows += run_site(name, seed, args.load, args.replays, aging)
    print("\n## Summary: the gangs of 8+ GPUs, max delay against the references (replays won)\n")
    heads = ["below fifo-easy"] + [f"p{p} <= priority-easy" for p, _ in sorted(PRIORITIES, reverse=True)]
    print("| site | seed | offered load | drape setting | " + " | ".join(heads) + " |")
    print("|---|---|---|---|" + "---|" * len(heads))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    load = os.getloadavg()
    took = time.perf_counter() - started
    print(f"\n{took:.0f} s in all; machine load (1, 5, 15 min) at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()

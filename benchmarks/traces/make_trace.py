"""Writes field_week.csv: a week of drape's GPU workload shaped like the field's (seeded, reproducible).

    .venv/bin/python benchmarks/traces/make_trace.py [--load 0.72] [--out benchmarks/traces/field_week.csv]

Mix, by the field's numbers: unified stage runs on a whole 8-GPU node at 70-80 GiB per GPU
(6-20 h); fine-tune passes at 20-40 GiB (1-4 h); gate evaluations at 8-16 GiB (10-40 min);
inference benchmarks at 16-30 GiB (15-60 min); per-shopper personalization at ~10 GiB (5-25
min). Submissions follow a daily cycle (busier in working hours). `--load` scales the job counts
so the offered GPU-time is that share of fleet.yaml's capacity.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np

WEEK = 7 * 24 * 3600
HERE = Path(__file__).parent
# kind: (jobs per week at scale 1, gpus, memory GiB range, duration s range, priority)
MIX = {
    "stage-training": (10, 8, (70, 80), (6 * 3600, 20 * 3600), 5),
    "finetune": (260, 1, (20, 40), (3600, 4 * 3600), 4),
    "gate-eval": (1500, 1, (8, 16), (600, 2400), 6),
    "inference-benchmark": (450, 1, (16, 30), (900, 3600), 2),
    "personalization": (9000, 1, (9, 11), (300, 1500), 3),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load", type=float, default=0.72, help="offered GPU-time / fleet capacity")
    parser.add_argument("--gpus", type=int, default=48, help="fleet size the load refers to")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "field_week.csv")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    expected = sum(n * g * (lo + hi) / 2 for n, g, _, (lo, hi), _ in MIX.values())
    scale = args.load * args.gpus * WEEK / expected
    rows = []
    for kind, (count, gpus, (mem_lo, mem_hi), (dur_lo, dur_hi), priority) in MIX.items():
        for index in range(int(round(count * scale))):
            while True:  # daily cycle: thinning, twice as busy at 14:00 as at 02:00
                submit = rng.uniform(0, WEEK - (dur_hi if gpus > 1 else 0))
                if rng.uniform() < (2 + math.sin(2 * math.pi * (submit / 86400 - 0.33))) / 3:
                    break
            rows.append({"job_id": f"{kind}-{index:05d}", "submit_s": round(submit, 1),
                         "duration_s": round(rng.uniform(dur_lo, dur_hi), 1), "peak_mem_gib": round(rng.uniform(mem_lo, mem_hi), 1),
                         "gpus": gpus, "priority": priority, "kind": kind})
    rows.sort(key=lambda r: (r["submit_s"], r["job_id"]))
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    work = sum(r["duration_s"] * r["gpus"] for r in rows)
    print(f"{args.out}: {len(rows)} jobs, offered load {work / (args.gpus * WEEK):.2f} of {args.gpus} GPUs for a week")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

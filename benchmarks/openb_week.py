"""A GPU-sharing week built from Alibaba's production trace (issue 66's sharing trace), drape beside the references.

The trace: cluster-trace-gpu-v2023 ("openb": Weng et al., "Beware of Fragmentation", USENIX ATC
2023; github.com/alibaba/clusterdata, folder cluster-trace-gpu-v2023/csv). Its node list holds
a production cluster's GPU nodes (6,212 GPUs of 7 models, 1-8 per node); its pod lists hold
8,152 pods with what each asked: whole GPUs (1-8), or a share of one (`gpu_milli`), a QoS class,
and in the `gpuspec` files the GPU models a pod may run on (33% of GPU pods in
`openb_pod_list_gpuspec33.csv`, as in production). The files are not in this repository (data
stays out of git): point `--pods` and `--nodes` at a checkout's.

Why a week is built rather than the pods replayed as recorded: the pods are a snapshot of the
cluster, most created in its last month, and 81 pods alive for over a day hold 90% of the
GPU-hours. Replayed as recorded on the trace's fleet they offer 0.3% of its GPU-hours (59,612 over
149 days on 6,212 GPUs): nothing would ever wait. Stated assumptions:

- the fleet: of each GPU model's nodes, one in `--scale` (at least one per model), drawn by the
  seed and kept with their GPU counts and names, so the models' mix holds and the scarce models
  stay scarce. GPU memory per model: P100, T4 and V100M16 16 GiB, V100M32 32, A10 24; the
  trace's G1-G3 are undisclosed and taken as 32 GiB (`--memory MODEL=GiB` changes any).
  `--small`: every GPU 16 GiB (the issue's fleet of 16 GiB GPUs);
- the jobs: pods that ran (scheduled and deleted; a pending pod has no run time, a CPU-only pod
  no GPU), drawn with replacement, each keeping its GPUs, its share (`gpu_milli` / 1000), its
  GPU models and its QoS as a priority (Guaranteed and LS 3, Burstable 2, BE 1). Run time: as
  recorded (deletion - scheduled), at least 60 s, at most `--cap-days` (4). GPU memory: the
  trace gives none; a job takes its share of 16 GiB, the smallest GPU, so every job fits every
  model it names and a 16 GiB GPU holds shares up to a whole one, as the trace's cluster did;
- arrivals: uniform over six days (Poisson, given their number) until the jobs' GPU-hours reach
  `--load` (0.85) of the week's on the fleet, as `benchmarks/wide_gangs.py` builds its weeks.

Policies (`--policies`): "drape", as it ships (`PolicyConfig()`); "scarcity-off", drape without
scarcity-aware placement; "rescue-gangs", drape with `rescue_gangs` (a waiting constrained gang
job moves long unconstrained jobs off the node it needs: `scheduler/policy/scarcity.py`);
"backlog", drape with `benchmarks/wide_gangs.py`'s gang bound (2 h or 0.5 x the backlog, on the
whole wait, short jobs first, `gang_stops_longer` 2, 8 stops); "overlay", drape as the queue overlay
`configs/queue/gang-waits.yaml` sets it (read from the file);
"fifo-backfill" (whole-GPU FIFO + greedy backfill: the issue's reference) and "fifo-easy" (FIFO
+ EASY backfill, ~4 min a week). Each line gives the share of the offered-load bound and of the
shortest makespan, starved jobs (> 1 h to start), the waits of 1-GPU and multi-GPU jobs and of
model-constrained jobs, and placements on a model a job excludes (must be 0).

One replay of a week is one draw of a chaotic process: where a scarce model has a node or two,
which long job takes a freed GPU first decides the makespan, and moving every submit by under a
minute moves the share of the shortest makespan by up to 0.17 (over three replays: drape at one
node in 16, seed 1, 0.882-1.000; "rescue-gangs" on the cluster fleet, seed 2, 0.740-0.910), and
`fifo-backfill`'s too (0.931-1.000 on the cluster fleet, seed 1). `--replays K` replays each week
K times, the week as built and K - 1 copies with every submit moved by up to `JITTER_S` (60 s) either way, and the table gives
each policy's medians with their range; the verdict reads the medians.

The goals (issue 66): >= 0.93 of the bound, never behind `fifo-backfill`. Judged here on the
shortest makespan (`SimResult.of_shortest`), not on busy GPU-time, because a policy that packs
shared jobs onto fewer GPUs serves the same work on fewer busy GPU-hours, and the bound counts
that against it: on seed 1 drape ended at the shortest makespan possible with 0.90 of the busy
GPU-time (`scheduler/sim/model.py`). Both are printed. Never behind: neither a lower share nor
more starved jobs.

    .venv/bin/python benchmarks/openb_week.py --pods DIR/openb_pod_list_gpuspec33.csv \\
        --nodes DIR/openb_node_list_gpu_node.csv [--seeds 1-3] [--scale 32] [--write OUT]
        [--policies drape,backlog,fifo-backfill] [--replays 3]
        # ~2 min a week and replay (fifo-backfill ~70 s); --write OUT leaves each week's trace.csv and
        # fleet.yaml for `drape queue simulate --trace OUT/.../trace.csv --fleet OUT/.../fleet.yaml`
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import replays  # noqa: E402
from benchmarks.wide_gangs import policies, sharing_verdict  # noqa: E402
from drape.config.names import NODE_EXPECTED, NODE_NAME  # noqa: E402
from scheduler.policy import GpuState, PolicyConfig, allows  # noqa: E402
from scheduler.queue.inventory import has_control  # noqa: E402
from scheduler.sim import SimResult, TraceJob, simulate  # noqa: E402
from scheduler.sim.export import write_trace  # noqa: E402

WEEK_S = 7 * 24 * 3600.0
SMALLEST_GIB = 16.0  # the smallest GPU in the trace's cluster: a job's memory is its share of it
MEMORY_GIB = {"P100": 16.0, "T4": 16.0, "V100M16": 16.0, "V100M32": 32.0, "A10": 24.0, "G1": 32.0, "G2": 32.0, "G3": 32.0}
PRIORITY = {"Guaranteed": 3, "LS": 3, "Burstable": 2, "BE": 1}
POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")
NODE_COLUMNS = ("sn", "gpu", "model")
MAX_POD_GPUS = 8  # the trace's pods ask 0-8 GPUs: one node's
MAX_TIME_S = 10 * 366 * 86400.0
MAX_FILE_BYTES = 64 * 2**20
MAX_WEEK_JOBS = 2_000_000  # a week that would hold more (a large fleet of short jobs) is refused, not built
JITTER_S, MAX_REPLAYS = replays.JITTER_S, replays.MAX_REPLAYS  # `--replays` (`benchmarks/replays.py`)
POLICIES = {  # `--policies`: name → (policy, its config)
    "drape": ("drape", PolicyConfig()),
    "scarcity-off": ("drape", PolicyConfig(avoid_scarce=False)),
    "rescue-gangs": ("drape", PolicyConfig(rescue_gangs=True)),
    "backlog": policies(3.0, False, ("backlog",))[0][1:],
    "overlay": policies(3.0, False, ("overlay",))[0][1:],  # configs/queue/gang-waits.yaml
    "fifo-backfill": ("fifo-backfill", PolicyConfig()),
    "fifo-easy": ("fifo-easy", PolicyConfig()),
}


class OpenbError(ValueError):
    """An openb file that cannot be used; names the file, line and field."""


@dataclass(frozen=True)
class Pod:
    """One pod of the trace that ran on GPUs: what it asked and how long it ran."""

    name: str
    gpus: int
    share: float  # of one GPU (1.0: whole GPUs)
    models: tuple[str, ...]  # GPU models it may run on; empty: any
    priority: int
    qos: str
    run_s: float


@dataclass(frozen=True)
class Node:
    name: str
    model: str
    gpus: int


def _rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict]]:
    """The CSV's rows with their line numbers, after checking it exists, is bounded and has `columns`."""
    if not path.is_file():
        raise OpenbError(f"{path}: file not found")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise OpenbError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; expected an openb CSV (under 1 MiB)")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise OpenbError(f"{path}: missing columns {missing}; expected {','.join(columns)}")
            return list(enumerate(reader, 2))
    except (csv.Error, UnicodeDecodeError) as error:
        raise OpenbError(f"{path}: not a CSV ({error})") from None


def _count(row: dict, field: str, at: str, high: int) -> int:
    """`row[field]` as a whole number in [0, high]."""
    value = _number(row, field, at, 0, high)
    if not value.is_integer():
        raise OpenbError(f"{at}: {field} must be a whole number in [0, {high}], got {row[field].strip()[:40]!r}")
    return int(value)


def _number(row: dict, field: str, at: str, low: float, high: float, blank: float | None = None) -> float:
    """`row[field]` as a finite number in [low, high] (`blank` for an empty cell, if allowed)."""
    text = (row.get(field) or "").strip()
    if not text and blank is not None:
        return blank
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise OpenbError(f"{at}: {field} must be a number in [{low:g}, {high:g}], got {text[:40]!r}")
    return value


def _text(row: dict, field: str, at: str) -> str:
    value = (row.get(field) or "").strip()
    if has_control(value) or len(value) > 200:
        raise OpenbError(f"{at}: {field} must be printable and at most 200 characters, got {value[:40]!r}")
    return value


def read_pods(path: str | Path) -> tuple[list[Pod], dict[str, int]]:
    """The pods that ran on GPUs, and how many rows were left out and why (CPU-only, never ran)."""
    path, pods, skipped = Path(path), [], {"CPU-only": 0, "never ran": 0}
    for line, row in _rows(path, POD_COLUMNS):
        at = f"{path}:{line}"
        name, qos = _text(row, "name", at), _text(row, "qos", at)
        gpus = _count(row, "num_gpu", at, MAX_POD_GPUS)
        milli = _number(row, "gpu_milli", at, 0, 1000, blank=0.0)
        models = tuple(m for m in _text(row, "gpu_spec", at).split("|") if m and m.lower() != "nan")
        scheduled = _number(row, "scheduled_time", at, 0, MAX_TIME_S, blank=-1.0)
        deleted = _number(row, "deletion_time", at, 0, MAX_TIME_S, blank=-1.0)
        if qos not in PRIORITY:
            raise OpenbError(f"{at}: qos must be one of {', '.join(PRIORITY)}, got {qos[:40]!r}")
        if gpus == 0:
            skipped["CPU-only"] += 1
            continue
        if scheduled < 0 or deleted < scheduled:
            skipped["never ran"] += 1
            continue
        if gpus == 1 and not 0 < milli <= 1000:
            raise OpenbError(f"{at}: gpu_milli of a 1-GPU pod must be in (0, 1000], got {milli:g}")
        share = milli / 1000 if gpus == 1 else 1.0
        pods.append(Pod(name, gpus, share, models, PRIORITY[qos], qos, deleted - scheduled))
    if not pods:
        raise OpenbError(f"{path}: no GPU pod that ran (expected openb_pod_list_*.csv rows with num_gpu > 0)")
    return pods, skipped


def read_nodes(path: str | Path) -> list[Node]:
    """The GPU nodes (nodes without GPUs are left out); names checked as the fleet file checks them."""
    path, nodes, seen = Path(path), [], set()
    for line, row in _rows(path, NODE_COLUMNS):
        at = f"{path}:{line}"
        name, model = _text(row, "sn", at), _text(row, "model", at)
        gpus = _count(row, "gpu", at, 64)
        if gpus == 0:
            continue
        if not NODE_NAME.fullmatch(name):
            raise OpenbError(f"{at}: sn {name[:40]!r}: expected {NODE_EXPECTED}")
        if not model or model.lower() == "nan":
            raise OpenbError(f"{at}: model is empty for a node with {gpus} GPU(s)")
        if name in seen:
            raise OpenbError(f"{at}: node {name} is listed twice")
        seen.add(name)
        nodes.append(Node(name, model, gpus))
    if not nodes:
        raise OpenbError(f"{path}: no GPU node (expected openb_node_list_*.csv rows with gpu > 0)")
    return nodes


def build_fleet(nodes: list[Node], scale: int, rng: random.Random, memory: dict[str, float], small: bool) -> list[GpuState]:
    """One in `scale` of each model's nodes (at least one), with their GPUs (the module docstring)."""
    by_model: dict[str, list[Node]] = {}
    for node in nodes:
        by_model.setdefault(node.model, []).append(node)
    if unknown := sorted(m for m in by_model if m not in memory):
        raise OpenbError(f"GPU model {unknown[0]!r}: memory unknown; pass --memory {unknown[0]}=GiB")
    gpus = []
    for model in sorted(by_model):
        chosen = rng.sample(by_model[model], max(1, round(len(by_model[model]) / scale)))
        for node in sorted(chosen, key=lambda n: n.name):
            gib = SMALLEST_GIB if small else memory[model]
            gpus += [GpuState(f"{node.name}/gpu{i}", node.name, model, gib) for i in range(node.gpus)]
    return gpus


def build_week(pods: list[Pod], gpus: list[GpuState], rng: random.Random, load: float, cap_s: float) -> list[TraceJob]:
    """Pods drawn with replacement, arriving over six days, until their GPU-hours reach `load` of
    the week's on `gpus`. A pod naming only models the fleet lacks is never drawn."""
    models = {gpu.model for gpu in gpus}
    runnable = [p for p in pods if any(allows(p.models, model) for model in models)]
    if not runnable:
        raise OpenbError("no pod may run on the fleet's GPU models")
    hours, jobs = load * len(gpus) * WEEK_S / 3600, list[TraceJob]()
    while hours > 0:
        if len(jobs) >= MAX_WEEK_JOBS:
            raise OpenbError(f"the week would hold more than {MAX_WEEK_JOBS:,} jobs on {len(gpus)} GPUs; raise --scale")
        pod = rng.choice(runnable)
        run = min(max(pod.run_s, 60.0), cap_s)
        submit = rng.uniform(0, WEEK_S * 6 / 7)
        memory = round(pod.share * SMALLEST_GIB, 2)
        job_id = f"{pod.name}-{len(jobs):05d}"
        jobs.append(TraceJob(job_id, submit, run, memory, pod.gpus, pod.priority, pod.qos, pod.models, share=pod.share))
        hours -= pod.gpus * run / 3600
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def write_week(trace: list[TraceJob], gpus: list[GpuState], folder: Path) -> None:
    """`trace.csv` (`scheduler.sim.export.write_trace`) and `fleet.yaml` in `folder` for `drape queue
    simulate`, each written whole to a temporary name, then renamed (names from the trace are quoted by
    the CSV and YAML writers)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_trace(
        [
            {
                "job_id": j.job_id,
                "submit_s": f"{j.submit_s:.1f}",
                "duration_s": f"{j.duration_s:.1f}",
                "peak_mem_gib": str(j.peak_mem_gib),
                "gpus": str(j.gpus),
                "priority": str(j.priority),
                "kind": j.kind,
                "gpu_models": "|".join(j.models),
                "share": str(j.share),
            }
            for j in trace
        ],
        folder / "trace.csv",
    )
    groups: dict[tuple[str, float, int], list[str]] = {}
    per_node = Counter(gpu.node for gpu in gpus)
    for gpu in gpus:
        names = groups.setdefault((gpu.model, gpu.total_gib, per_node[gpu.node]), [])
        if gpu.node not in names:
            names.append(gpu.node)
    fleet = {
        "groups": [
            {"model": model, "memory_gib": gib, "nodes": len(names), "gpus_per_node": per, "node_names": names}
            for (model, gib, per), names in groups.items()
        ]
    }
    fleet_part = folder / ".fleet.yaml.partial"
    fleet_part.write_text(
        "# built by benchmarks/openb_week.py from the openb node list\n" + yaml.safe_dump(fleet, sort_keys=False)
    )
    os.replace(fleet_part, folder / "fleet.yaml")


def _wait(result: SimResult, cls: str) -> str:
    waits = result.class_waits.get(cls)
    return f"{waits['mean_s'] / 60:.1f} min / {waits['max_s'] / 3600:.1f} h" if waits else "-"


def jittered(trace: list[TraceJob], seed: int, replay: int) -> list[TraceJob]:
    """`trace` with each submit moved by up to `JITTER_S` either way, drawn by (`seed`, `replay`):
    an equally likely week, for `--replays` (`benchmarks/replays.py`)."""
    return replays.jittered(trace, f"openb-jitter/{seed}", replay)


@dataclass(frozen=True)
class Median:
    """What the sharing verdict reads, as the medians over a week's replays."""

    of_shortest: float
    of_bound: float
    starved: float


def replay(weeks: list[list[TraceJob]], gpus: list[GpuState], names: list[str]) -> dict[str, Median]:
    """Each policy in `names` replays each of `weeks` (the week, then its `jittered` copies), printed
    as a table row: medians (the range when there are several), the waits of the replay whose share
    of the shortest makespan is the median, placements off-model summed over the replays."""
    print(
        "| policy | of bound | of shortest makespan | starved (> 1 h) | 1-GPU mean / max wait "
        "| multi-GPU mean / max wait | constrained mean wait | off-model |"
    )
    print("|---|---|---|---|---|---|---|---|")
    found = {}
    for name in names:
        policy, config = POLICIES[name]
        results, pinned = [], []
        for week in weeks:
            record: list = []
            results.append(simulate(week, gpus, policy, config, record=record))
            first: dict[str, float] = {}
            for at, job, *_ in record:
                first.setdefault(job, at)
            waits = [first[j.job_id] - j.submit_s for j in week if j.models and j.job_id in first]
            pinned.append(sum(waits) / max(len(waits), 1))
        order = sorted(range(len(results)), key=lambda i: results[i].of_shortest)
        middle = order[len(order) // 2]
        shares, starved = [r.of_shortest for r in results], [r.starved for r in results]
        median = Median(statistics.median(shares), statistics.median(r.of_bound for r in results), statistics.median(starved))
        spread = len(results) > 1
        share = f"{median.of_shortest:.3f}" + (f" [{min(shares):.3f}-{max(shares):.3f}]" if spread else "")
        count = f"{median.starved:g}" + (f" [{min(starved)}-{max(starved)}]" if spread else "")
        chosen = results[middle]
        print(
            f"| {name} | {median.of_bound:.3f} | {share} | {count} | {_wait(chosen, '1')} | {_multi(chosen)} "
            f"| {pinned[middle] / 60:.1f} min | {sum(r.violations for r in results)} |"
        )
        found[name] = median
    return found


def _multi(result: SimResult) -> str:
    """The multi-GPU jobs' mean wait and the longest."""
    multi = [w for cls, w in result.class_waits.items() if cls != "1"]
    if not multi:
        return "-"
    mean = sum(w["mean_s"] * w["jobs"] for w in multi) / sum(w["jobs"] for w in multi)
    return f"{mean / 60:.1f} min / {max(w['max_s'] for w in multi) / 3600:.1f} h"


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def _memory(values: list[str]) -> dict[str, float]:
    memory = dict(MEMORY_GIB)
    for value in values:
        model, _, gib = value.partition("=")
        try:
            memory[model] = float(gib)
        except ValueError:
            raise SystemExit(f"--memory {value!r}: expected MODEL=GiB, e.g. G2=32") from None
        if not (model and 0 < memory[model] <= 1024):
            raise SystemExit(f"--memory {value!r}: expected MODEL=GiB with GiB in (0, 1024]")
    return memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=Path, required=True, help="openb_pod_list_*.csv (gpuspec33: with model constraints)")
    parser.add_argument("--nodes", type=Path, required=True, help="openb_node_list_gpu_node.csv")
    parser.add_argument("--seeds", default="1-3")
    parser.add_argument("--scale", type=int, default=32, help="keep one in SCALE of each model's nodes")
    parser.add_argument("--load", type=float, default=0.85, help="GPU-hours offered, as a share of the week's")
    parser.add_argument("--cap-days", type=float, default=4.0, help="longest run kept, days")
    parser.add_argument("--fleets", default="cluster,small", help="cluster (the models' memory), small (16 GiB GPUs)")
    parser.add_argument("--memory", action="append", default=[], metavar="MODEL=GiB", help="a GPU model's memory")
    parser.add_argument("--policies", default="drape,backlog,fifo-backfill", help=f"of {', '.join(POLICIES)}")
    parser.add_argument("--write", type=Path, help="leave each week's trace.csv and fleet.yaml under this folder")
    parser.add_argument(
        "--replays",
        type=int,
        default=1,
        help=f"replay each week this many times, each after the first with every submit moved by up to {JITTER_S:g} s; "
        "the table gives medians and ranges",
    )
    args = parser.parse_args(argv)
    if not (1 <= args.scale <= 10_000 and 0 < args.load <= 2 and 0 < args.cap_days <= 30):
        raise SystemExit("--scale must be in [1, 10000], --load in (0, 2], --cap-days in (0, 30]")
    if not 1 <= args.replays <= MAX_REPLAYS:
        raise SystemExit(f"--replays must be in [1, {MAX_REPLAYS}], got {args.replays}")
    names = [name for name in args.policies.split(",") if name]
    if any(name not in POLICIES for name in names) or not {"drape", "fifo-backfill"} <= set(names):
        raise SystemExit(
            f"--policies {args.policies!r}: expected some of {', '.join(POLICIES)}, drape and fifo-backfill among them"
        )
    try:
        pods, skipped = read_pods(args.pods)
        nodes = read_nodes(args.nodes)
    except OpenbError as error:
        raise SystemExit(f"openb_week: {error}") from None
    constrained = sum(1 for p in pods if p.models)
    print(f"# openb: {len(pods)} GPU pods that ran ({constrained} naming GPU models); left out: {skipped}")
    print(
        f"# {len(nodes)} GPU nodes, {sum(n.gpus for n in nodes)} GPUs; load {args.load}, "
        f"1 in {args.scale} nodes, runs <= {args.cap_days} d"
    )
    memory, met, weeks, started = _memory(args.memory), 0, 0, time.time()
    for fleet_name in args.fleets.split(","):
        for seed in _seeds(args.seeds):
            rng = random.Random(seed)
            gpus = build_fleet(nodes, args.scale, rng, memory, small=fleet_name == "small")
            trace = build_week(pods, gpus, rng, args.load, args.cap_days * 86400)
            models = sorted({(g.model, g.total_gib) for g in gpus})
            kinds = ", ".join(f"{sum(g.model == m for g in gpus)} {m} ({gib:g} GiB)" for m, gib in models)
            print(f"\n### {fleet_name} fleet, seed {seed}: {len(trace)} jobs on {len(gpus)} GPUs: {kinds}\n")
            if args.write:
                write_week(trace, gpus, args.write / f"{fleet_name}-seed{seed}")
            met += sharing_verdict(replay(replays.draws(trace, f"openb-jitter/{seed}", args.replays), gpus, names))
            weeks += 1
    print(
        f"\n# drape met the goals on {met} of {weeks} weeks; {time.time() - started:.0f} s, load average {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU queue: drape's policy vs the field's fifo-exclusive, and the cost of one dispatch cycle.

1. Replays benchmarks/traces/field_week.csv (a week shaped like the field's workload; regenerate
   with benchmarks/traces/make_trace.py) on benchmarks/traces/fleet.yaml (32 H100 80 GB + 16 L40S
   48 GB) under both policies with the live policy code, and prints utilization, its ratio to the
   offered-load bound, memory utilization, waits, starved jobs (waiting > 1 h) and makespan.
2. Replays a week of 8-GPU stage jobs beside long-lived single-GPU services and short jobs
   (`gang_week`) at offered loads 0.70 and 0.85 on 64 H100s (8 nodes × 8), a variant on a
   mixed fleet where a third of the jobs name the GPU models they may run on, and one with a
   fifth of the GPU-hours in 2- and 4-GPU fine-tunes (`FINETUNE_MIX`). Side by side: drape
   (preempting for an 8-GPU job waiting 20 min only jobs that can restart at once on idle GPUs
   elsewhere; moving jobs crowded onto a GPU to idle ones, while a gang job waits only off its
   reservation; co-locating on the GPU that clears soonest), drape spreading only, drape with
   neither, drape fragmentation-aware (`scheduler/policy/fragmentation.py`), a Kueue-like requests-quota
   BestEffortFIFO, and fifo-exclusive; waits per job class (1, 2-4, 8 GPUs), violations,
   preemptions and the work they lost. Then the 8-GPU jobs alone on the same fleet (the capacity
   floor), and beside single-GPU jobs that start on arrival, packed one or two to a GPU at no cost
   (`benchmarks/floors/gang_floor.py`): the waits no policy that starts them on arrival unslowed can avoid.
   Then the same weeks over ten seeds: medians and the worst seed (one week's makespan hangs on
   its tail), with those floors (whole-node jobs only: none for the fine-tune week).
3. Times dispatch cycles with 10,000 queued jobs on 1,024 GPUs (128 nodes × 8), in a fresh
   process: the policy alone, and a whole `Dispatcher.cycle` against the SQLite queue (a launcher
   that starts nothing), the first cycle three times from the same queue.

    .venv/bin/python benchmarks/scheduler.py          # 8-9 minutes on 2 cores
    .venv/bin/python benchmarks/scheduler.py --gang-bound   # only gang waits bounded by checkpoint
        # preemption, per seed (benchmarks/gang_bound.py; --bound-hours, --seeds, --fleets, --frontier)
"""

from __future__ import annotations

import gc
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from benchmarks.floors.gang_floor import gang_floor  # noqa: E402
from drape.config import parse_config  # noqa: E402
from scheduler.dispatch.dispatcher import Dispatcher  # noqa: E402
from scheduler.engines.local.launcher import NullLauncher  # noqa: E402
from scheduler.policy import GpuState, JobRequest, PolicyConfig, plan_drape  # noqa: E402
from scheduler.policy.baselines import plan_fifo_exclusive, plan_kueue_like  # noqa: E402
from scheduler.queue.inventory import load_fleet  # noqa: E402
from scheduler.queue.store import JobSpec, JobStore  # noqa: E402
from scheduler.sim import TraceJob, load_trace, simulate  # noqa: E402
from scheduler.sim.tables import render  # noqa: E402

HERE = Path(__file__).parent / "traces"


def policies() -> None:
    trace, fleet = load_trace(HERE / "field_week.csv"), load_fleet(HERE / "fleet.yaml")
    results = []
    for name in ("fifo-exclusive", "drape"):
        started = time.perf_counter()
        results.append(simulate(trace, fleet, name))
        print(f"  simulated {name} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print(f"## A week of the field's workload on {len(fleet)} GPUs ({len(trace)} jobs)\n")
    print(render(results))
    fifo, drape = results
    print(
        f"\ndrape: utilization {100 * drape.utilization:.1f}% (goal >= 65%), {drape.of_bound:.2f} of the bound (goal >= 0.9); "
        f"starved jobs {fifo.starved} → {drape.starved} ({100 * (drape.starved - fifo.starved) / max(fifo.starved, 1):+.1f}%, "
        f"goal -90%); utilization ratio drape / fifo-exclusive {drape.utilization / fifo.utilization:.2f}×; "
        f"p95 wait {fifo.p95_wait_s / 60:.0f} → {drape.p95_wait_s / 60:.1f} min"
    )


WEEK_S = 7 * 24 * 3600.0
# (kind, GPUs, share of the GPU-hours, mean hours, GiB per GPU, priority)
GANG_MIX = (
    ("stage-training", 8, 0.50, 8.0, 70.0, 5),  # FSDP stage jobs: whole nodes
    ("service", 1, 0.35, 24.0, 30.0, 3),  # long-lived single-GPU services (inference, evaluation)
    ("gate-eval", 1, 0.15, 0.5, 20.0, 3),  # short single-GPU jobs
)
# the same with a fifth of the GPU-hours in 2- and 4-GPU jobs (a width drawn per job)
FINETUNE_MIX = (
    ("stage-training", 8, 0.40, 8.0, 70.0, 5),
    ("finetune", (2, 4), 0.20, 3.0, 40.0, 4),  # LoRA fine-tunes, multi-GPU evaluations
    ("service", 1, 0.28, 24.0, 30.0, 3),
    ("gate-eval", 1, 0.12, 0.5, 20.0, 3),
)


def gang_week(load: float, gpus: int, rng: random.Random, constrained: bool = False, mix: tuple = GANG_MIX) -> list[TraceJob]:
    """A week whose GPU-hours are `load` × the fleet's, split by `mix`; Poisson arrivals over
    the first six days, exponential durations. `constrained`: a third of the jobs may run on H100s
    only (the 8-GPU jobs always: they need the 80 GB), the rest anywhere."""
    jobs = []
    for kind, widths, share, mean_h, mem, priority in mix:
        hours, count = load * gpus * WEEK_S / 3600 * share, 0
        while hours > 0:
            width = rng.choice(widths) if isinstance(widths, tuple) else widths
            duration = min(rng.expovariate(1 / (mean_h * 3600)), 4 * mean_h * 3600)
            submit = rng.uniform(0, WEEK_S * 6 / 7)
            models = ("H100",) if constrained and (width > 1 or rng.random() < 1 / 3) else ()
            jobs.append(TraceJob(f"{kind}-{count:05d}", submit, max(duration, 60.0), mem, width, priority, kind, models))
            hours -= width * duration / 3600
            count += 1
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def gang_fleet(mixed: bool) -> list[GpuState]:
    groups = [("H100-80GB", 80.0, 6 if mixed else 8), *([("L40S-48GB", 48.0, 2)] if mixed else [])]
    return [
        GpuState(f"{model[:4].lower()}-{node:02d}/gpu{i}", f"{model[:4].lower()}-{node:02d}", model, memory)
        for model, memory, nodes in groups
        for node in range(nodes)
        for i in range(8)
    ]


GANG_POLICIES = (
    ("drape", "drape", PolicyConfig()),
    ("drape, spreading only", "drape", PolicyConfig(preempt_after_s=None)),
    ("drape, neither", "drape", PolicyConfig(preempt_after_s=None, spread_after_s=None)),
    ("drape, fragmentation-aware", "drape", PolicyConfig(fragmentation=True)),
    ("kueue-like", "kueue-like", PolicyConfig()),
    ("fifo-exclusive", "fifo-exclusive", PolicyConfig()),
)
# (load, fleet and mix): "64 H100", "mixed" (48 H100 + 16 L40S, a third of the jobs H100-only), or
# "fine-tunes" (64 H100, FINETUNE_MIX)
GANG_WORKLOADS = ((0.70, "64 H100"), (0.85, "64 H100"), (0.85, "mixed"), (0.85, "fine-tunes"))
WORKLOAD_NAMES = {
    "64 H100": "8-GPU stage jobs beside long-lived services: load {load:.2f}, 64 H100",
    "mixed": "8-GPU stage jobs beside long-lived services: load {load:.2f}, 48 H100 + 16 L40S, a third of the jobs H100-only",
    "fine-tunes": "8-GPU stage jobs and 2-4-GPU fine-tunes beside long-lived services: load {load:.2f}, 64 H100",
}


def workload(load: float, kind: str, seed: int) -> tuple[list[TraceJob], list[GpuState]]:
    """The trace and fleet of one gang week (`GANG_WORKLOADS`)."""
    fleet = gang_fleet(kind == "mixed")
    mix = FINETUNE_MIX if kind == "fine-tunes" else GANG_MIX
    return gang_week(load, len(fleet), random.Random(seed), constrained=kind == "mixed", mix=mix), fleet


FLOOR_LABELS = {1: "one per GPU", 2: "two per GPU at no cost"}
SEEDS = tuple(range(1, 11))


def gangs() -> None:
    for load, kind in GANG_WORKLOADS:
        trace, fleet = workload(load, kind, 7)
        results = []
        for label, name, config in GANG_POLICIES:
            started = time.perf_counter()
            result = simulate(trace, fleet, name, config)
            result.policy = label
            results.append(result)
            print(f"  simulated {label} at {load}, {kind} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        print(f"\n## {WORKLOAD_NAMES[kind].format(load=load)} ({len(trace)} jobs)\n")
        print(render(results))
        alone = simulate([j for j in trace if j.gpus > 1], fleet, "drape", PolicyConfig(preempt_after_s=None)).class_waits
        floor = alone.get("5-8", {"mean_s": 0.0, "max_s": 0.0})
        print(
            f"\nthe multi-GPU jobs alone on this fleet (the capacity floor): 8-GPU wait mean {floor['mean_s'] / 60:.1f} min, "
            f"max {floor['max_s'] / 60:.1f} min"
        )
        if any(1 < j.gpus < 8 for j in trace):
            continue  # the floor below holds whole-node jobs only
        for per_gpu, packing in FLOOR_LABELS.items():
            bound = gang_floor(trace, fleet, per_gpu)
            print(
                f"the 8-GPU jobs beside single-GPU jobs started on arrival, {packing} (benchmarks/floors/gang_floor.py): "
                f"wait mean {bound.mean_s / 60:.1f} min, max {bound.max_s / 60:.1f} min, "
                f"{bound.over(3600)} of {len(bound.waits_s)} over 1 h"
            )


def _seeded(args: tuple[float, str, int, int]) -> tuple:
    load, kind, seed, index = args
    label, name, config = GANG_POLICIES[index]
    result = simulate(*workload(load, kind, seed), name, config)
    waits = {name: result.class_waits.get(name, {}) for name in ("1", "2-4", "5-8")}
    stretch = result.class_stretch.get("1", {}).get("mean", 1.0)
    return (
        load,
        kind,
        label,
        result.of_bound,
        waits["5-8"].get("mean_s", 0.0),
        waits["5-8"].get("max_s", 0.0),
        waits["2-4"].get("max_s", float("nan")),
        waits["1"].get("max_s", 0.0),
        stretch,
    )


def _minutes(values: list[float]) -> str:
    """Median (worst) of `values` in minutes; "-" where the class is absent (NaN)."""
    if any(v != v for v in values):
        return "-"
    return f"{statistics.median(values) / 60:.0f} min ({max(values) / 60:.0f})"


def seeded() -> None:
    """The gang weeks again over ten seeds (one week is one draw: its tail decides its makespan):
    medians, and the worst seed, per policy."""
    from concurrent.futures import ProcessPoolExecutor

    chosen = [i for i, (label, *_) in enumerate(GANG_POLICIES) if label != "fifo-exclusive"]
    runs = [(load, kind, seed, i) for load, kind in GANG_WORKLOADS for seed in SEEDS for i in chosen]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(_seeded, runs))
    print(f"  simulated {len(runs)} seeded weeks in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(f"\n## The gang weeks over seeds {', '.join(map(str, SEEDS))}: median (worst seed)\n")
    print(
        "| load, fleet | policy | of bound | 8-GPU mean wait | 8-GPU max wait | 2-4-GPU max wait | 1-GPU max wait "
        "| 1-GPU run time / duration |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for load, kind in GANG_WORKLOADS:
        for i in chosen:
            label = GANG_POLICIES[i][0]
            mine = [r for r in rows if r[:3] == (load, kind, label)]
            bound, mean, worst, middle, single, stretch = ([r[k] for r in mine] for k in (3, 4, 5, 6, 7, 8))
            print(
                f"| {load:.2f}, {kind} | {label} | {statistics.median(bound):.3f} ({min(bound):.3f}) | {_minutes(mean)} "
                f"| {_minutes(worst)} | {_minutes(middle)} | {_minutes(single)} "
                f"| {statistics.median(stretch):.2f} ({max(stretch):.2f}) |"
            )
        if kind == "fine-tunes":
            continue  # the floor holds whole-node jobs only
        for per_gpu, label in FLOOR_LABELS.items():
            floors = [gang_floor(*workload(load, kind, seed), per_gpu) for seed in SEEDS]
            mean, worst = [f.mean_s for f in floors], [f.max_s for f in floors]
            print(
                f"| {load:.2f}, {kind} | floor: singles on arrival, {label} | - | {_minutes(mean)} | {_minutes(worst)} "
                "| - | 0 min (0) | 1.00 (1.00) |"
            )


def big_state(rng: random.Random) -> tuple[list[GpuState], list[JobRequest]]:
    gpus = []
    for node in range(128):
        model, memory = ("H100-80GB", 80.0) if node < 96 else ("L40S-48GB", 48.0)
        gpus += [GpuState(f"n{node:03d}/gpu{i}", f"n{node:03d}", model, memory) for i in range(8)]
    for gpu in gpus:  # a busy fleet: most GPUs carry one or two jobs
        if rng.random() < 0.85:
            gpu.jobs = rng.choice((1, 1, 2))
            gpu.allocated_gib = min(gpu.total_gib - 4, rng.uniform(10, 40) * gpu.jobs)
    pending = [
        JobRequest(
            f"q{i:05d}",
            rng.randint(1, 6),
            rng.uniform(0, 3600),
            8 if i % 200 == 0 else 1,
            rng.choice((10.0, 12.0, 24.0, 36.0, 75.0)),
            rng.uniform(300, 20000),
        )
        for i in range(10_000)
    ]
    return gpus, pending


FIRST_CYCLES = 3


def _snapshot(store: JobStore, scratch: Path) -> Path:
    """A copy of the SQLite queue as it stands (its write-ahead log folded in)."""
    store.engine.dispose()
    database, copy = scratch / "queue.db", scratch / "queued.db"
    with closing(sqlite3.connect(database)) as source, closing(sqlite3.connect(copy)) as target:
        source.backup(target)
    return copy


def _restore(copy: Path, scratch: Path) -> str:
    """The queue put back as `_snapshot` found it; its URL."""
    database = scratch / "queue.db"
    for leftover in (database, scratch / "queue.db-wal", scratch / "queue.db-shm"):
        leftover.unlink(missing_ok=True)
    with closing(sqlite3.connect(copy)) as source, closing(sqlite3.connect(database)) as target:
        source.backup(target)
    return f"sqlite:///{database}"


def cycle_cost() -> None:
    rng = random.Random(1)
    gpus, pending = big_state(rng)
    rows = []
    for name, plan in (("fifo-exclusive", plan_fifo_exclusive), ("kueue-like", plan_kueue_like), ("drape", plan_drape)):
        times = []
        for _ in range(5):
            state = [GpuState(**vars(g)) for g in gpus]
            started = time.perf_counter()
            placed = plan(pending, state, [], 4000.0)
            times.append(time.perf_counter() - started)
        rows.append((f"policy only: {name}", statistics.median(times), len(placed)))
    with tempfile.TemporaryDirectory(prefix="drape-queue-bench-") as scratch:
        fleet_file = Path(scratch) / "fleet.yaml"
        fleet_file.write_text(
            yaml.safe_dump(
                {
                    "groups": [
                        {"model": "H100-80GB", "memory_gib": 80, "nodes": 96, "gpus_per_node": 8, "node_prefix": "h"},
                        {"model": "L40S-48GB", "memory_gib": 48, "nodes": 32, "gpus_per_node": 8, "node_prefix": "l"},
                    ]
                }
            )
        )
        config = parse_config(
            {
                "paths": {"root": scratch},
                "queue": {"fleet": "static", "inventory": str(fleet_file)},
                "train": {
                    "stages": {s: {"steps": 1, "trainable": ["*"]} for s in ("identity", "texture", "geometry", "denoise")}
                },
            }
        )
        store = JobStore(config.queue_url)
        started, base = time.perf_counter(), time.time() - 3600  # submitted within the last hour: none timed out
        for job in pending:
            store.submit(
                JobSpec(
                    kind="gate-eval",
                    command=["true"],
                    mem_gib=job.mem_gib,
                    duration_s=job.duration_s,
                    gpus=job.gpus,
                    priority=job.priority,
                    id=job.id,
                ),
                now=base + job.submit_s,
            )
        print(f"  queued 10,000 jobs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        queued = _snapshot(store, Path(scratch))
        firsts = []
        for _ in range(FIRST_CYCLES):  # the first cycle from the same 10,000 queued jobs each time
            store = JobStore(_restore(queued, Path(scratch)))
            dispatcher = Dispatcher(config, store, launcher=NullLauncher())
            gc.collect()
            gc.freeze()  # as `Dispatcher.run` does before its first cycle
            first = dispatcher.cycle()
            firsts.append(first.seconds)
            gc.unfreeze()
        rows.append(("dispatcher cycle, fleet empty (claims + launches)", statistics.median(firsts), len(first.started)))
        gc.freeze()
        steady = [dispatcher.cycle() for _ in range(5)]
        rows.append(
            (
                "dispatcher cycle, fleet full (10,000 - placed still queued)",
                statistics.median(r.seconds for r in steady),
                sum(len(r.started) for r in steady),
            )
        )
    print(
        "\n## One dispatch cycle: 10,000 queued jobs, 1,024 GPUs (the whole cycle, its metrics included;"
        " medians: the empty fleet's of 3 first cycles, the full fleet's of 5; goal < 0.5 s)\n"
    )
    print("| what | seconds | jobs started |\n|---|---|---|")
    for what, seconds, started in rows:
        print(f"| {what} | {seconds:.3f} | {started} |")


def in_fresh_process(function) -> None:
    """Run `function` in a new interpreter, as a dispatcher runs in its own process (nothing of the
    simulations before it in memory)."""
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(target=function)
    process.start()
    process.join()
    if process.exitcode:
        raise SystemExit(f"{function.__name__} failed (exit code {process.exitcode})")


if __name__ == "__main__":
    if "--gang-bound" in sys.argv:  # gang waits bounded by checkpoint preemption, per seed (benchmarks/gang_bound.py)
        sys.path.insert(0, str(Path(__file__).parent))
        from gang_bound import main

        main([a for a in sys.argv[1:] if a != "--gang-bound"])
        raise SystemExit(0)
    policies()
    gangs()
    seeded()
    in_fresh_process(cycle_cost)

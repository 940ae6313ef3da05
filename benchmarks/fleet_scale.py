"""The drape policy at fleet scale: decisions per second on 64 to 100,000 GPUs, before and after.

Fleets of 8-GPU nodes, H100 80 GB and A100 80 GB alternating, and the gang week of
`benchmarks/scheduler.py` (8-GPU stage jobs beside long-lived single-GPU services and short
jobs) at offered load 0.85 scaled to each fleet: the same job mix, arrivals in proportion to the
GPUs. A replay of a week on 100,000 GPUs is 4.7 million jobs, so every fleet replays the first
`--hours` hours of arrivals (the same arrival rate per GPU; every job that arrived runs to its
end):

- before: `simulate(reference=True)`: `plan_drape`, which copies and indexes every GPU and sorts
  every waiting job at every event, in the loop that recomputes every running job's pace; in a
  process of its own, stopped at `--before-cap` seconds (then "-": it did not finish);
- after: `simulate()`: the `Planner` (`scheduler/policy/planner.py`), indexes kept by take/leave, in the
  incremental replay (`scheduler/sim/replay.py`).

A decision is one job started (a restart after preemption counts). Decisions/s: jobs started
per second of policy time (the planning passes, and for the planner the index upkeep as jobs
start and end). p50/p99: the time of one planning pass (one event: an arrival, an end, or a time
a waiting gang job may preempt; most passes start zero or one job). Peak memory: the process's
maximum resident set. Utilization and starvation (jobs waiting over 1 h) must be the same before
and after (`tests/unit/test_planner.py` checks the placements themselves are).

    .venv/bin/python benchmarks/fleet_scale.py                      # all sizes, 36 h: ~15 min on 2 cores
    .venv/bin/python benchmarks/fleet_scale.py --sizes 64,1000,6000 --hours 168 --before-cap 900
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.scheduler import GANG_MIX, WEEK_S, gang_week  # noqa: E402
from scheduler.policy import GpuState, JobRequest, Placement, PolicyConfig, RunningJob, baselines, plan_drape, planner  # noqa: E402  # noqa: E402
from scheduler.sim import TraceJob, simulate  # noqa: E402

SIZES = (64, 1_000, 6_000, 25_000, 100_000)
ARRIVALS_S = WEEK_S * 6 / 7  # gang_week's jobs arrive over its first six days


def fleet(gpus: int) -> list[GpuState]:
    """`gpus` GPUs (rounded down to whole nodes of 8), H100 and A100 nodes alternating."""
    out = []
    for node in range(gpus // 8):
        model = "H100-80GB" if node % 2 == 0 else "A100-80GB"
        out += [GpuState(f"n{node:05d}/gpu{i}", f"n{node:05d}", model, 80.0) for i in range(8)]
    return out


def window(gpus: int, hours: float, seed: int = 1) -> list[TraceJob]:
    """The first `hours` of `gang_week`'s arrivals on `gpus` GPUs at load 0.85, made directly: the
    week for the fleet's share that arrives in the window, its arrivals squeezed into the window
    (the same rate per GPU, the same mix and durations)."""
    share = min(hours * 3600 / ARRIVALS_S, 1.0)
    jobs = gang_week(0.85, max(round(gpus * share), 1), random.Random(seed), mix=GANG_MIX)
    return sorted(
        (TraceJob(j.job_id, j.submit_s * share, j.duration_s, j.peak_mem_gib, j.gpus, j.priority, j.kind) for j in jobs),
        key=lambda j: (j.submit_s, j.job_id),
    )


def _timed(function, passes: list[float], spent: list[float]):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        result = function(*args, **kwargs)
        passes.append(time.perf_counter() - started)
        spent[0] += passes[-1]
        return result

    return wrapper


def _upkeep(function, spent: list[float]):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        result = function(*args, **kwargs)
        spent[0] += time.perf_counter() - started
        return result

    return wrapper


def run(gpus: int, hours: float, reference: bool, out) -> None:
    """One replay, in its own process; its figures go to `out` (a queue)."""
    trace, gpu_list = window(gpus, hours), fleet(gpus)
    passes: list[float] = []
    spent = [0.0]
    if reference:
        baselines.POLICIES["drape"] = _timed(baselines.POLICIES["drape"], passes, spent)
    else:
        planner.Planner.plan = _timed(planner.Planner.plan, passes, spent)  # type: ignore[method-assign]
        planner.Planner.start = _upkeep(planner.Planner.start, spent)  # type: ignore[method-assign]
        planner.Planner.finish = _upkeep(planner.Planner.finish, spent)  # type: ignore[method-assign]
    record: list = []
    started = time.perf_counter()
    result = simulate(trace, gpu_list, "drape", PolicyConfig(), reference=reference, record=record)
    wall = time.perf_counter() - started
    ordered = sorted(passes)
    out.put(
        {
            "jobs": len(trace),
            "decisions": len(record),
            "passes": len(passes),
            "per_s": len(record) / spent[0],
            "p50_ms": 1e3 * statistics.median(ordered),
            "p99_ms": 1e3 * ordered[int(0.99 * (len(ordered) - 1))],
            "wall_s": wall,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "utilization": result.utilization,
            "starved": result.starved,
        }
    )


def measure(gpus: int, hours: float, reference: bool, cap: float) -> dict | None:
    """`run` in a fresh process (its own peak memory), None if it passed `cap` seconds."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=run, args=(gpus, hours, reference, queue))
    process.start()
    try:
        return queue.get(timeout=cap)
    except Exception:  # noqa: BLE001  (queue.Empty: past the cap)
        return None
    finally:
        process.terminate()
        process.join()


def busy_fleet(gpus: int, queued: int, rng: random.Random) -> tuple[list[GpuState], list[RunningJob], list[JobRequest]]:
    """A busy fleet (as benchmarks/scheduler.py's `big_state`: most GPUs hold one or two jobs) with
    `queued` jobs waiting, one in 200 an 8-GPU job."""
    gpu_list, running = fleet(gpus), []
    for gpu in gpu_list:
        if rng.random() < 0.85:
            for _ in range(rng.choice((1, 1, 2))):
                mem = rng.uniform(10, 35)
                running.append(RunningJob(f"r{len(running):07d}", (gpu.uuid,), mem, rng.uniform(0, 20000), 3, True))
    pending = [
        JobRequest(
            f"q{i:06d}",
            rng.randint(1, 6),
            rng.uniform(-3600, 0),
            8 if i % 200 == 0 else 1,
            rng.choice((10.0, 12.0, 24.0, 36.0, 75.0)),
            rng.uniform(300, 20000),
        )
        for i in range(queued)
    ]
    return gpu_list, running, pending


def _state(gpu_list: list[GpuState], running: list[RunningJob]) -> list[GpuState]:
    """Fresh copies of `gpu_list` holding `running` (single-GPU, shareable jobs)."""
    state = {g.uuid: GpuState(g.uuid, g.node, g.model, g.total_gib) for g in gpu_list}
    for job in running:
        for uuid in job.gpus:
            gpu = state[uuid]
            gpu.jobs, gpu.allocated_gib, gpu.shares = gpu.jobs + 1, gpu.allocated_gib + job.mem_gib, gpu.shares + 1.0
            gpu.exclusive = gpu.exclusive or len(job.gpus) > 1
    return list(state.values())


def queue_depth(gpus: int, queued: int, repeats: int = 3) -> dict[str, float]:
    """Seconds of a planning pass with `queued` jobs waiting on a busy fleet of `gpus`, `plan_drape`
    and the `Planner` (its state built beforehand, as a live one keeps it), medians: the first pass
    (it places what fits), and the next once those started (the fleet full, the rest waiting)."""
    gpu_list, running, pending = busy_fleet(gpus, queued, random.Random(2))
    kept = planner.Planner(_state(gpu_list, []))
    for job in running:
        kept.submit(JobRequest(job.id, 3, -1.0, 1, job.mem_gib, job.expected_end_s))
        kept.start(Placement(job.id, job.gpus, job.mem_gib), 0.0)
    for job in pending:
        kept.submit(job)
    figures: dict[str, float] = {}
    for name in ("first", "next"):
        state = _state(gpu_list, running)
        figures[f"{name} before"] = _median(lambda p=pending, s=state: plan_drape(p, s, running, 0.0), repeats)
        figures[f"{name} after"] = _median(lambda: kept.plan(0.0), repeats)
        placed = kept.plan(0.0)
        assert placed == plan_drape(pending, state, running, 0.0)  # the same decisions
        figures[f"{name} placed"] = len(placed)
        durations = {job.id: job for job in pending}
        for placement in placed:
            kept.start(placement, 0.0)
            job = durations[placement.job_id]
            running.append(RunningJob(job.id, placement.gpus, job.mem_gib, job.duration_s, job.priority, job.gpus == 1))
        pending = [job for job in pending if job.id not in {p.job_id for p in placed}]
    return figures


def _median(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _cell(row: dict | None, key: str, fmt: str) -> str:
    return format(row[key], fmt) if row else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="fleet sizes in GPUs, comma-separated")
    parser.add_argument("--hours", type=float, default=36.0, help="hours of arrivals replayed (168: the whole week)")
    parser.add_argument("--cap", type=float, default=900.0, help="seconds before the planner's replay is stopped")
    parser.add_argument("--before-cap", type=float, default=300.0, help="seconds before the reference's replay is stopped")
    parser.add_argument("--before-up-to", type=int, default=6_000, help="run the reference only on fleets up to this size")
    parser.add_argument("--queued", default="1000,10000,100000", help="queue depths for one planning pass ('': none)")
    parser.add_argument("--queue-fleet", type=int, default=6_000, help="the busy fleet those passes plan on (GPUs)")
    args = parser.parse_args()
    if args.queued:
        print(f"## A planning pass on a busy fleet of {args.queue_fleet:,} GPUs (medians of 3; the same placements)\n")
        print(
            "| queued jobs | first pass: plan_drape s | Planner s | × | placed | next pass (fleet full): plan_drape s "
            "| Planner s | × | placed |\n|---|---|---|---|---|---|---|---|---|"
        )
        for queued in (int(depth) for depth in args.queued.split(",")):
            f = queue_depth(args.queue_fleet, queued)
            print(
                f"| {queued:,} | {f['first before']:.3f} | {f['first after']:.4f} | {f['first before'] / f['first after']:.0f}× "
                f"| {f['first placed']:.0f} | {f['next before']:.3f} | {f['next after']:.4f} "
                f"| {f['next before'] / f['next after']:.0f}× | {f['next placed']:.0f} |",
                flush=True,
            )
        print()
    print(
        f"## The drape policy at fleet scale: gang week at load 0.85, the first {args.hours:g} h of arrivals "
        f"(replays capped at {args.before_cap:.0f} s before, {args.cap:.0f} s after; '-': not run or past the cap)\n"
    )
    print(
        "| GPUs | jobs | decisions | decisions/s before | after | × | p50 ms before | after | p99 ms before | after "
        "| peak MiB before | after | utilization before | after | starved before | after | replay s before | after |"
    )
    print("|" + "---|" * 18)
    for gpus in (int(size) for size in args.sizes.split(",") if size):
        after = measure(gpus, args.hours, False, args.cap)
        before = measure(gpus, args.hours, True, args.before_cap) if gpus <= args.before_up_to else None
        ratio = f"{after['per_s'] / before['per_s']:.0f}×" if before and after else "-"
        print(
            f"| {gpus:,} | {_cell(after, 'jobs', ',')} | {_cell(after, 'decisions', ',')} "
            f"| {_cell(before, 'per_s', ',.0f')} | {_cell(after, 'per_s', ',.0f')} | {ratio} "
            f"| {_cell(before, 'p50_ms', '.3f')} | {_cell(after, 'p50_ms', '.3f')} "
            f"| {_cell(before, 'p99_ms', '.3f')} | {_cell(after, 'p99_ms', '.3f')} "
            f"| {_cell(before, 'peak_mib', ',.0f')} | {_cell(after, 'peak_mib', ',.0f')} "
            f"| {_cell(before, 'utilization', '.4f')} | {_cell(after, 'utilization', '.4f')} "
            f"| {_cell(before, 'starved', 'd')} | {_cell(after, 'starved', 'd')} "
            f"| {_cell(before, 'wall_s', '.1f')} | {_cell(after, 'wall_s', '.1f')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

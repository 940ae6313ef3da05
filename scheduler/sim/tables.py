"""Simulation results as Markdown tables: the fleet's figures, waits per job class, preemption, and
per priority where the trace has more than one."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from scheduler.sim import CONTENTION_OVERLAP, SimResult, TraceJob
from scheduler.sim.model import CLASSES


def _stretch(result: SimResult) -> str:
    """The single-GPU jobs' run time over their duration: 1.00 when nothing slowed them."""
    found = result.class_stretch.get("1")
    return f"{found['mean']:.2f} / {found['max']:.2f}" if found else "-"


MAX_PRIORITY_ROWS = 16  # distinct priorities past this: no per-priority table (one line says so)


def by_priority(results: list[SimResult], trace: Sequence[TraceJob]) -> list[str]:
    """Per policy and priority (highest first): the jobs' mean and max delay (finish − submit −
    duration: the wait, and the time a stopped job spent off its GPUs), and the multi-GPU jobs' max
    delay; no lines where the trace has a single priority, one line where it has more than
    `MAX_PRIORITY_ROWS`. A job the result has no delay for (one that never finished) is left out."""
    priorities = sorted({job.priority for job in trace}, reverse=True)
    if len(priorities) < 2:
        return []
    if len(priorities) > MAX_PRIORITY_ROWS:
        return ["", f"{len(priorities)} priorities in the trace: no table per priority (at most {MAX_PRIORITY_ROWS})"]
    lines = [
        "",
        "| policy | priority | jobs | mean delay | max delay | multi-GPU jobs: max delay |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        grouped: dict[int, list[tuple[int, float]]] = {}
        for job in trace:
            if job.job_id in r.job_delays:
                grouped.setdefault(job.priority, []).append((job.gpus, r.job_delays[job.job_id]))
        for priority in [p for p in priorities if p in grouped]:
            delays = grouped[priority]
            wide = max((d for gpus, d in delays if gpus > 1), default=None)
            lines.append(
                f"| {r.policy} | {priority} | {len(delays)} | {statistics.fmean(d for _, d in delays) / 60:.1f} min "
                f"| {max(d for _, d in delays) / 3600:.1f} h | {'-' if wide is None else f'{wide / 3600:.1f} h'} |"
            )
    return lines


def render(results: list[SimResult], trace: Sequence[TraceJob] = ()) -> str:
    """A Markdown table of simulation results, plus the contention model in one line; with the
    `trace` replayed, the delays per priority (`by_priority`)."""
    lines = [
        "| policy | jobs | GPUs | GPU util | of bound | of shortest makespan | mem util | mean wait | p95 wait "
        "| starved (>1 h) | makespan | placements by GPU model |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        models = ", ".join(f"{m}: {n}" for m, n in sorted(r.placements_by_model.items()))
        lines.append(
            f"| {r.policy} | {r.jobs} | {r.gpus} | {100 * r.utilization:.1f}% | {r.of_bound:.2f} | {r.of_shortest:.2f} | "
            f"{100 * r.memory_utilization:.1f}% | {r.mean_wait_s / 60:.1f} min | {r.p95_wait_s / 60:.1f} min | "
            f"{r.starved} | {r.makespan_s / 3600:.1f} h | {models} |"
        )
    shown = [name for name in CLASSES if name in ("1", "2-4", "5-8") or any(name in r.class_waits for r in results)]
    lines += [
        "",
        "| policy | waits: 1 GPU (mean / p95 / max) | "
        + " | ".join(f"{name} GPUs" for name in shown[1:])
        + " | constraint violations | preempted | work lost | longest wait to restart "
        "| run time / duration: 1 GPU (mean / max) |",
        "|---|" + "---|" * (len(shown) + 5),
    ]
    for r in results:
        cells = [
            f"{w['mean_s'] / 60:.1f} / {w['p95_s'] / 60:.1f} / {w['max_s'] / 60:.1f} min ({w['jobs']:.0f} jobs)"
            if (w := r.class_waits.get(name))
            else "-"
            for name in shown
        ]
        lines.append(
            f"| {r.policy} | {' | '.join(cells)} | {r.violations} | {r.preemptions} | {r.lost_gpu_h:.1f} GPU-h "
            f"| {r.max_requeue_wait_s / 60:.1f} min | {_stretch(r)} |"
        )
    lines += by_priority(results, trace)
    if results:
        lines.append(
            f"\noffered-load bound {100 * results[0].bound:.1f}%; contention: n jobs on one GPU progress at "
            f"(1 + {CONTENTION_OVERLAP} × (n − 1)) / n each (compute-bound); utilization = busy GPU-time / capacity; "
            "of shortest makespan = the soonest the trace could end (without co-locating past a GPU's compute) "
            "over this one's end (jobs that share a GPU serve the same work on fewer busy GPU-hours, which the "
            "bound counts against packing them)"
        )
    return "\n".join(lines)

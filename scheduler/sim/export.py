"""A trace of the queue's history, in the columns the simulator reads (`scheduler/sim/reference.py`).

`export_trace` writes each job that ran to success: its submit time (seconds from the first job
exported), its run time (finish less its last start, plus what it ran before each time it was
stopped: `ran_s`, the work since a stopped run's last checkpoint counted as often as it ran), its
measured peak memory per GPU (the profile it was placed with when none was measured), GPUs,
priority, kind, and its scheduling fields: the GPU models it allows, whether it runs alone or
declares a share, whether it may be stopped and how often it checkpoints, and whether its run
time was measured `alone` or `shared` (another job held one of its GPUs while it ran: the
simulator then keeps its own pace instead of slowing it a second time). So a week of the live
queue replays under another policy with `drape queue simulate --trace`.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from sqlalchemy import select

from scheduler.queue.schema import jobs_table, ran_seconds, scheduling_of
from scheduler.sim import TRACE_COLUMNS

COLUMNS = (*TRACE_COLUMNS, "gpu_models", "measured", "sharing", "share", "preemptible", "checkpoint_every_s")


def trace_rows(store, since_s: float | None = None) -> list[dict[str, str]]:
    """The succeeded jobs (submitted at or after `since_s`, when given) as trace rows, by submit time."""
    names = ("id", "submit_s", "start_s", "finish_s", "mem_gib", "gpus", "priority", "kind", "labels")
    query = select(*(jobs_table.c[name] for name in names)).where(  # not commands or environments
        jobs_table.c.state == "succeeded", jobs_table.c.start_s.is_not(None)
    )
    if since_s is not None:
        query = query.where(jobs_table.c.submit_s >= since_s)
    with store.engine.connect() as connection:
        jobs = connection.execute(query.order_by(jobs_table.c.submit_s, jobs_table.c.id)).mappings().all()
    first = jobs[0]["submit_s"] if jobs else 0.0
    rows = []
    for job in jobs:
        labels, how = json.loads(job["labels"] or "{}"), scheduling_of(job["labels"])
        try:
            peak = float(labels.get("peak_gib") or job["mem_gib"])
        except (TypeError, ValueError):  # labels are input: a bad value falls back to the profile it ran with
            peak = float(job["mem_gib"])
        rows.append(
            {
                "job_id": job["id"],
                "submit_s": f"{job['submit_s'] - first:.3f}",
                "duration_s": f"{max(ran_seconds(labels) + job['finish_s'] - job['start_s'], 1e-3):.3f}",
                "peak_mem_gib": f"{max(peak, 1e-3):.3f}",
                "gpus": str(job["gpus"]),
                "priority": str(job["priority"]),
                "kind": job["kind"],
                "gpu_models": "|".join(how.models),
                "measured": "shared" if labels.get("measured") == "shared" else "alone",
                "sharing": "exclusive" if how.exclusive else "shareable",
                "share": f"{how.share:g}",
                "preemptible": "true" if how.preemptible else "false",
                "checkpoint_every_s": f"{how.checkpoint_every_s:g}",
            }
        )
    return rows


def export_trace(store, path: str | Path, since_s: float | None = None) -> int:
    """Write `trace_rows` to `path` as CSV (a temporary name first, then renamed); the number of jobs."""
    rows = trace_rows(store, since_s)
    write_trace(rows, path)
    return len(rows)


def write_trace(rows: list[dict[str, str]], path: str | Path) -> None:
    """Trace `rows` (columns `COLUMNS`; one left out takes the simulator's default) to `path` as CSV,
    a temporary name first, then renamed."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, path)

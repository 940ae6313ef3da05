"""A trace (CSV), the simulator's input, read without trusting it.

A user points `drape queue simulate` at it, so it is input: every number must be finite and
within any real machine or fleet (`MAX_*`), names hold no control character, and every refusal
is a TraceError naming the file, the line and the field, never a traceback. (The fleet file
beside it is `scheduler.queue.inventory.py`'s: the dispatcher's static inventory reads it too.)

Trace columns: `job_id, submit_s, duration_s, peak_mem_gib, gpus, priority, kind`, and optional
`gpu_models` (the models a job may run on, `|`-separated parts of a model name; empty: any),
`measured` (alone | shared), `sharing` (shareable | exclusive), `share`, `preemptible`
(true | false: whether a waiting gang job may stop it; default true, an exclusive job never)
and `checkpoint_every_s` (how often it checkpoints, s of progress; default 600).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from scheduler.policy.state import CHECKPOINT_EVERY_S
from scheduler.queue.inventory import MAX_GPU_MEMORY_GIB, has_control

TRACE_COLUMNS = ("job_id", "submit_s", "duration_s", "peak_mem_gib", "gpus", "priority", "kind")
MAX_JOB_GPUS = 1024
MAX_TRACE_SECONDS = 10 * 366 * 86400.0  # a submit time or a duration: ten years


class TraceError(ValueError):
    """A trace file that cannot be used; names the file, line and field."""


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit_s: float
    duration_s: float
    peak_mem_gib: float
    gpus: int
    priority: int
    kind: str
    models: tuple[str, ...] = ()
    measured: str = "alone"
    exclusive: bool = False
    share: float = 1.0
    preemptible: bool = True  # a waiting gang job may stop it; it resumes from its last checkpoint
    checkpoint_every_s: float = CHECKPOINT_EVERY_S


def load_trace(path: str | Path) -> list[TraceJob]:
    """The trace's jobs by submit time; TraceError naming the file and line of the first bad row."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: trace file not found")
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing columns {missing}; expected {','.join(TRACE_COLUMNS)}")
            jobs = [_trace_job(row, f"{path}:{line}") for line, row in enumerate(reader, 2)]
    except (csv.Error, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a CSV trace ({error})") from None
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def _trace_job(row: dict, at: str) -> TraceJob:
    try:
        job = TraceJob(
            row["job_id"],
            float(row["submit_s"]),
            float(row["duration_s"]),
            float(row["peak_mem_gib"]),
            int(row["gpus"]),
            int(row["priority"]),
            row["kind"],
            tuple(m for m in (row.get("gpu_models") or "").split("|") if m),
            row.get("measured") or "alone",
            (row.get("sharing") or "shareable") == "exclusive",
            float(row.get("share") or 1.0),
            (row.get("preemptible") or "true").lower() == "true",
            float(row.get("checkpoint_every_s") or CHECKPOINT_EVERY_S),
        )
    except (ValueError, TypeError) as error:  # TypeError: a short row (None for its last fields)
        raise TraceError(f"{at}: {error}") from None
    numbers = {"submit_s": job.submit_s, "duration_s": job.duration_s, "peak_mem_gib": job.peak_mem_gib, "share": job.share}
    if bad := [name for name, value in numbers.items() if not math.isfinite(value)]:
        raise TraceError(f"{at}: {', '.join(bad)} must be finite")
    if job.duration_s <= 0 or job.gpus <= 0 or job.peak_mem_gib <= 0:
        raise TraceError(f"{at}: duration_s, gpus and peak_mem_gib must be positive")
    if not 0 <= job.submit_s <= MAX_TRACE_SECONDS or job.duration_s > MAX_TRACE_SECONDS:
        raise TraceError(f"{at}: submit_s must be in [0, {MAX_TRACE_SECONDS:g}] and duration_s at most that (ten years)")
    if job.gpus > MAX_JOB_GPUS or job.peak_mem_gib > MAX_GPU_MEMORY_GIB:
        raise TraceError(f"{at}: gpus must be at most {MAX_JOB_GPUS} and peak_mem_gib at most {MAX_GPU_MEMORY_GIB:g}")
    if any(has_control(value) for value in (job.job_id, job.kind, *job.models)):
        raise TraceError(f"{at}: job_id, kind and gpu_models may not hold control characters")
    if job.measured not in ("alone", "shared"):
        raise TraceError(f"{at}: measured must be alone or shared, got {job.measured!r}")
    if (row.get("sharing") or "shareable") not in ("shareable", "exclusive") or not 0 < job.share <= 1:
        raise TraceError(f"{at}: sharing must be shareable or exclusive and share in (0, 1]")
    if (row.get("preemptible") or "true").lower() not in ("true", "false"):
        raise TraceError(f"{at}: preemptible must be true or false, got {row['preemptible']!r}")
    if not (math.isfinite(job.checkpoint_every_s) and 1 <= job.checkpoint_every_s <= 7 * 24 * 3600):
        raise TraceError(f"{at}: checkpoint_every_s must be in [1, 604800] s, got {job.checkpoint_every_s}")
    return job

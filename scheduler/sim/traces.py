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

from scheduler.policy.state import CHECKPOINT_EVERY_S, MAX_PRIORITY
from scheduler.queue.inventory import MAX_GPU_MEMORY_GIB, MAX_JOB_GPUS, has_control
from scheduler.queue.schema import MAX_JOB_SECONDS

TRACE_COLUMNS = ("job_id", "submit_s", "duration_s", "peak_mem_gib", "gpus", "priority", "kind")


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
    """The trace's jobs by submit time; TraceError naming the file and line of the first bad row, a
    job id given twice (both lines) or a trace with no job. A spreadsheet's byte-order mark is read as
    one, not as part of the first column's name."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: trace file not found")
    jobs: list[TraceJob] = []
    lines: dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing columns {missing}; expected {','.join(TRACE_COLUMNS)}")
            for row in reader:
                job = _trace_job(row, f"{path}:{reader.line_num}")
                if (first := lines.setdefault(job.job_id, reader.line_num)) != reader.line_num:
                    raise TraceError(f"{path}:{reader.line_num}: job_id {job.job_id!r} is already the job of line {first}")
                jobs.append(job)
    except (csv.Error, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a CSV trace ({error})") from None
    if not jobs:
        raise TraceError(f"{path}: no jobs, only a header (expected rows of {','.join(TRACE_COLUMNS)})")
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def _parse(row: dict, name: str, kind: type, default: float | None = None) -> float:
    """Field `name` of `row` as `kind` (a blank optional field: `default`); ValueError naming it."""
    text = row.get(name)
    if text is None and default is None:
        raise ValueError(f"{name} is missing (a short row)")
    if not (text or "").strip() and default is not None:
        return default
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        shown = text if len(text or "") <= 40 else f"{(text or '')[:40]}…"
        raise ValueError(f"{name} must be {expected}, got {shown!r}") from None


def _text(row: dict, name: str) -> str:
    if (text := row.get(name)) is None:
        raise ValueError(f"{name} is missing (a short row)")
    return text


def _trace_job(row: dict, at: str) -> TraceJob:
    try:
        job = TraceJob(
            row["job_id"],
            _parse(row, "submit_s", float),
            _parse(row, "duration_s", float),
            _parse(row, "peak_mem_gib", float),
            int(_parse(row, "gpus", int)),
            int(_parse(row, "priority", int)),
            _text(row, "kind"),
            tuple(m for m in (row.get("gpu_models") or "").split("|") if m),
            row.get("measured") or "alone",
            (row.get("sharing") or "shareable") == "exclusive",
            _parse(row, "share", float, 1.0),
            (row.get("preemptible") or "true").lower() == "true",
            _parse(row, "checkpoint_every_s", float, CHECKPOINT_EVERY_S),
        )
    except ValueError as error:
        raise TraceError(f"{at}: {error}") from None
    if not job.job_id.strip():
        raise TraceError(f"{at}: job_id is empty")
    if None in row:  # csv.DictReader's key for the fields past the header's
        raise TraceError(f"{at}: {len(row[None])} more field(s) than the header's {len(row) - 1}")
    numbers = {"submit_s": job.submit_s, "duration_s": job.duration_s, "peak_mem_gib": job.peak_mem_gib, "share": job.share}
    if bad := [name for name, value in numbers.items() if not math.isfinite(value)]:
        raise TraceError(f"{at}: {', '.join(bad)} must be finite")
    if job.duration_s <= 0 or job.gpus <= 0 or job.peak_mem_gib <= 0:
        raise TraceError(f"{at}: duration_s, gpus and peak_mem_gib must be positive")
    if not 0 <= job.submit_s <= MAX_JOB_SECONDS or job.duration_s > MAX_JOB_SECONDS:
        raise TraceError(f"{at}: submit_s must be in [0, {MAX_JOB_SECONDS:g}] and duration_s at most that (ten years)")
    if job.gpus > MAX_JOB_GPUS or job.peak_mem_gib > MAX_GPU_MEMORY_GIB:
        raise TraceError(f"{at}: gpus must be at most {MAX_JOB_GPUS} and peak_mem_gib at most {MAX_GPU_MEMORY_GIB:g}")
    if abs(job.priority) > MAX_PRIORITY:
        raise TraceError(f"{at}: priority must be in [-{MAX_PRIORITY}, {MAX_PRIORITY}], got {job.priority}")
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

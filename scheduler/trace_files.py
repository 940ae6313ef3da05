"""Trace and fleet files for the simulator (`scheduler/simulator.py`): a CSV of jobs and a fleet YAML.

Trace columns: `job_id, submit_s, duration_s, peak_mem_gib, gpus, priority, kind`, and optional
`gpu_models` (the models a job may run on, `|`-separated parts of a model name; empty: any),
`measured` (alone | shared), `sharing` (shareable | exclusive), `share`, `preemptible`
(true | false: whether a waiting gang job may stop it; default true, an exclusive job never)
and `checkpoint_every_s` (how often it checkpoints, s of progress; default 600). Every value is
checked: a bad one names the file, line and field.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from scheduler.state import CHECKPOINT_EVERY_S, GpuState

TRACE_COLUMNS = ("job_id", "submit_s", "duration_s", "peak_mem_gib", "gpus", "priority", "kind")


class TraceError(ValueError):
    """A trace or fleet file that cannot be used; names the file, line and field."""


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
    """The jobs of a trace CSV (the module docstring has its columns), by submit time."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: trace file not found")
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing columns {missing}; expected {','.join(TRACE_COLUMNS)}")
        jobs = []
        for line, row in enumerate(reader, 2):
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
            except ValueError as error:
                raise TraceError(f"{path}:{line}: {error}") from None
            if job.duration_s <= 0 or job.gpus <= 0 or job.peak_mem_gib <= 0:
                raise TraceError(f"{path}:{line}: duration_s, gpus and peak_mem_gib must be positive")
            if job.measured not in ("alone", "shared"):
                raise TraceError(f"{path}:{line}: measured must be alone or shared, got {job.measured!r}")
            if (row.get("sharing") or "shareable") not in ("shareable", "exclusive") or not 0 < job.share <= 1:
                raise TraceError(f"{path}:{line}: sharing must be shareable or exclusive and share in (0, 1]")
            if (row.get("preemptible") or "true").lower() not in ("true", "false"):
                raise TraceError(f"{path}:{line}: preemptible must be true or false, got {row['preemptible']!r}")
            if not (math.isfinite(job.checkpoint_every_s) and 1 <= job.checkpoint_every_s <= 7 * 24 * 3600):
                raise TraceError(f"{path}:{line}: checkpoint_every_s must be in [1, 604800] s, got {job.checkpoint_every_s}")
            jobs.append(job)
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def load_fleet(path: str | Path) -> list[GpuState]:
    """A fleet YAML: ``groups: [{model, memory_gib, nodes, gpus_per_node}]``."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: fleet file not found")
    data = yaml.safe_load(path.read_text()) or {}
    gpus = []
    for number, group in enumerate(data.get("groups", [])):
        try:
            model, memory, nodes, per_node = (
                group["model"],
                float(group["memory_gib"]),
                int(group["nodes"]),
                int(group["gpus_per_node"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise TraceError(f"{path}: groups[{number}]: expected model, memory_gib, nodes, gpus_per_node ({error})") from None
        for node in range(nodes):
            name = f"{group.get('node_prefix', model.lower().replace(' ', '-'))}-{node:02d}"
            gpus += [GpuState(f"{name}/gpu{index}", name, model, memory) for index in range(per_node)]
    if not gpus:
        raise TraceError(f"{path}: no GPUs (expected groups: [{{model, memory_gib, nodes, gpus_per_node}}])")
    return gpus

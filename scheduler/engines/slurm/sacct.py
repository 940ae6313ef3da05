"""Slurm's accounting of drape's jobs, parsed: ``sacct -X -P`` lines into runs (a requeued job has
several), their GPUs from AllocTRES or the job's request, and the GPU-hours of each run."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass


def _seconds(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _gpus_of(tres: str) -> int | None:
    match = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", tres or "")
    return int(match.group(1)) if match else None


def _requested_gpus(shown: dict[str, str]) -> int | None:
    """The job's GPUs from `scontrol show job`: its per-node gres (TresPerNode) × its nodes."""
    match = re.search(r"gres[:/]gpu(?::[^:,]+)?:(\d+)", shown.get("TresPerNode", ""))
    nodes = shown.get("NumNodes", "1").split("-")[0]
    return int(match.group(1)) * int(nodes) if match and nodes.isdigit() else None


@dataclass(frozen=True)
class SlurmRun:
    """One run of a Slurm job as sacct accounts it (a requeued job has several)."""

    slurm_id: str
    name: str
    state: str
    start: float | None
    end: float | None
    gpus: int | None  # None: the accounting does not record GPUs (jobcomp without gres TRES)

    @property
    def queue_job_id(self) -> str | None:
        match = re.fullmatch(r"drape-(.+)-a\d+", self.name)
        return match.group(1) if match else None


def parse_runs(text: str) -> list[SlurmRun]:
    """drape's runs of ``sacct -X -P -n -o JobID,JobName,State,Start,End,AllocTRES`` output."""
    runs = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) >= 6 and fields[1].startswith("drape-") and fields[2].strip():
            slurm_id, name, state, start, end, tres = fields[:6]
            runs.append(SlurmRun(slurm_id, name, state.split()[0], _seconds(start), _seconds(end), _gpus_of(tres)))
    return runs


def run_gpu_hours(run: SlurmRun, gpus: int | None = None) -> float:
    """GPU-hours of one run: its time (start to end) × its GPUs (sacct's, else `gpus`, else 0)."""
    count = run.gpus if run.gpus is not None else gpus
    if run.start is None or run.end is None or not count:
        return 0.0
    return max(run.end - run.start, 0.0) * count / 3600

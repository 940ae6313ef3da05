"""The queue's side of a run's cost: which GPUs the run's jobs held and when (the allocation log),
as `drape.cost.account.Attempt`s, and the fleet's inventory and log for the idle-capacity view.

With the Slurm engine the engine's own accounting wins: a job's attempts are its runs as sacct
records them (each run of a requeued job, from its start to its end, on its GPUs), not the
queue's claim-to-release window, which also holds the time the job waited in Slurm's queue."""

from __future__ import annotations

import json

from drape.cost.account import Attempt
from scheduler.queue.store import JobStore


def run_attempts(store: JobStore, run_id: str, config=None) -> list[Attempt]:
    """Every claim of GPUs by a job labelled `run_id`: one Attempt per claim (a requeued job has
    several), its GPUs' model from the inventory, its end at the matching release (None: held).
    With `config` naming the Slurm engine, a job sacct knows has its Slurm runs instead."""
    jobs = {job["id"]: job for job in store.jobs() if json.loads(job["labels"] or "{}").get("run") == run_id}
    if not jobs:
        return []
    models = {gpu.uuid: gpu.model for gpu in store.inventory()}
    attempts: list[Attempt] = []
    claims: dict[tuple[str, float], list[str]] = {}
    releases: dict[str, list[float]] = {}
    for row in store.allocation_events(list(jobs)):
        if row["event"] == "claim":
            claims.setdefault((row["job_id"], row["at_s"]), []).append(row["gpu_uuid"])
        else:
            releases.setdefault(row["job_id"], []).append(row["at_s"])
    for (job_id, claimed), gpus in sorted(claims.items(), key=lambda item: item[0][1]):
        ended = min((t for t in releases.get(job_id, []) if t >= claimed), default=None)
        model = models.get(gpus[0], "unknown")
        attempts.append(Attempt(job_id, jobs[job_id]["stage"], len(gpus), model, claimed, ended))
    if config is not None and config.queue.launcher == "slurm":
        return slurm_attempts(config, jobs, attempts)
    return attempts


def slurm_attempts(config, jobs: dict[str, dict], attempts: list[Attempt]) -> list[Attempt]:
    """`attempts` with each job sacct knows replaced by its Slurm runs (GPUs: sacct's, else the job's)."""
    from pathlib import Path

    from scheduler.engines.slurm.launcher import build

    runs = build(config, Path(config.paths.root).resolve() / "queue" / "logs").usage()
    by_job: dict[str, list] = {}
    for run in runs:
        if run.queue_job_id in jobs and run.start is not None:
            by_job.setdefault(run.queue_job_id, []).append(run)
    models = {attempt.job_id: attempt.model for attempt in attempts}
    kept = [attempt for attempt in attempts if attempt.job_id not in by_job]
    for job_id, found in by_job.items():
        for run in found:
            gpus = run.gpus if run.gpus is not None else int(jobs[job_id]["gpus"])
            kept.append(Attempt(job_id, jobs[job_id]["stage"], gpus, models.get(job_id, "unknown"), run.start, run.end))
    return sorted(kept, key=lambda attempt: attempt.start)


def fleet_log(store: JobStore) -> tuple[list[tuple[str, str]], list[dict]]:
    """(uuid, model) of every GPU the queue knows, and its whole allocation log."""
    return [(gpu.uuid, gpu.model) for gpu in store.inventory()], store.allocation_events()

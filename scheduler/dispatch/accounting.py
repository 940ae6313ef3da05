"""The queue's side of a run's cost: which GPUs the run's jobs held and when (the allocation log),
as `drape.cost.account.Attempt`s, and the fleet's inventory and log for the idle-capacity view.

With the Slurm engine the engine's own accounting wins: a job's attempts are its runs as sacct
records them (each run of a requeued job, from its start to its end, on its GPUs), not the
queue's claim-to-release window, which also holds the time the job waited in Slurm's queue.
Where sacct reads them is `queue.slurm.accounting`: slurmdbd, or the jobcomp/filetxt log
(``sacct -c``) on a cluster without slurmdbd. When sacct cannot answer (accounting off: no
slurmdbd and no jobcomp) or the config says ``queue``, the queue's own times are used, and the
returned `Attempts` say so and why: the cost report prints its source, never silently."""

from __future__ import annotations

import json

from drape.cost.account import Attempt, Attempts
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
    return Attempts(attempts, source="queue", why=QUEUE_TIMES)


QUEUE_TIMES = "the queue's allocation log: each job's GPUs from claim to release"
SACCT = {"slurmdbd": "sacct (slurmdbd)", "jobcomp": "sacct -c (jobcomp)"}


def slurm_attempts(config, jobs: dict[str, dict], attempts: list[Attempt]) -> Attempts:
    """`attempts` with each job sacct knows replaced by its Slurm runs (GPUs: sacct's, else the job's);
    the queue's own when sacct cannot answer or `queue.slurm.accounting` is ``queue`` (with why)."""
    from pathlib import Path

    from scheduler.engines.slurm.launcher import SlurmError, build

    accounting = config.queue.slurm.accounting
    if accounting == "queue":
        why = f"queue.slurm.accounting is 'queue' (no Slurm accounting): {QUEUE_TIMES}, which includes the wait in Slurm's queue"
        return Attempts(attempts, source="queue", why=why)
    try:
        runs = build(config, Path(config.paths.root).resolve() / "queue" / "logs").usage(check=True)
    except SlurmError as error:
        why = (
            f"{SACCT[accounting]} could not answer ({str(error)[:300]}): Slurm accounting is off on this cluster; "
            f"{QUEUE_TIMES}, which includes the wait in Slurm's queue (set queue.slurm.accounting: jobcomp with "
            "JobCompType=jobcomp/filetxt, or queue)"
        )
        return Attempts(attempts, source="queue", why=why)
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
    why = "Slurm's accounting: each run of a job (a requeued job has several) from its start to its end, without its wait"
    return Attempts(sorted(kept, key=lambda attempt: attempt.start), source=SACCT[accounting], why=why)


def fleet_log(store: JobStore) -> tuple[list[tuple[str, str]], list[dict]]:
    """(uuid, model) of every GPU the queue knows, and its whole allocation log."""
    return [(gpu.uuid, gpu.model) for gpu in store.inventory()], store.allocation_events()

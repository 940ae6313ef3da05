"""The queue's side of a run's cost: which GPUs the run's jobs held and when (the allocation log),
as `drape.cost.account.Attempt`s, and the fleet's inventory and log for the idle-capacity view."""

from __future__ import annotations

import json

from drape.cost.account import Attempt
from scheduler.store import JobStore


def run_attempts(store: JobStore, run_id: str) -> list[Attempt]:
    """Every claim of GPUs by a job labelled `run_id`: one Attempt per claim (a requeued job has
    several), its GPUs' model from the inventory, its end at the matching release (None: held)."""
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
    return attempts


def fleet_log(store: JobStore) -> tuple[list[tuple[str, str]], list[dict]]:
    """(uuid, model) of every GPU the queue knows, and its whole allocation log."""
    return [(gpu.uuid, gpu.model) for gpu in store.inventory()], store.allocation_events()

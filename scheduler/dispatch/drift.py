"""Placement drift: a job that runs elsewhere than the queue placed it, found and written into the books.

An engine may run a job on another node than planned (node affinity ignored: `node_label` unset or
wrong, a pod recreated elsewhere) or on other GPUs (the device plugin picks devices; a DRA
allocation reports the ones it chose). An engine that can tell where a job's pods landed answers
`landed(handle)` with one `Landing` per pod (None until every pod is bound). The dispatcher asks
once per job it watches, after binding (`check_landings`); when the landing differs from the
job's recorded GPUs, the books are corrected (the job's allocations and `assigned` move to where
it runs, logged as a release and a claim, so GPU-hours are charged where they were spent) and
`drape_queue_placement_drift_total{engine,kind}` counts it: kind `node` (another node) or `gpu`
(the planned node, other devices).

Under the Kubernetes device plugin the devices come from the DCGM exporter's pod labels in Prometheus
where the queue reads its fleet there (`scheduler/engines/kubernetes/dcgm.py`, which waits a bounded time for them).
Where the engine reports the node but not the devices, the job's GPUs on an unplanned node are that
node's least-allocated ones by the ledger (what the device plugin gives: devices no pod holds).
"""

from __future__ import annotations

import json

from sqlalchemy import delete, insert, update

from drape.ops import metrics
from scheduler.engines import Landing, gpu_index
from scheduler.policy import GpuState
from scheduler.queue.schema import allocation_log, allocations_table, jobs_table

DRIFT_KINDS = ("node", "gpu")
RECHECK_S = 5.0  # how soon a job whose pods are not all bound is asked again


def _by_node(uuids: list[str], inventory: dict[str, GpuState]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for uuid in uuids:
        found.setdefault(inventory[uuid].node if uuid in inventory else uuid.split("/")[0], []).append(uuid)
    return found


def _on_node(landing: Landing, count: int, inventory: dict[str, GpuState], ledger: dict) -> list[str] | None:
    """`count` GPUs of the landing's node: those with the reported device indices (or UUIDs; None unless `count`
    of them match), else its least allocated; None if unknown."""
    node, devices = landing.node, landing.devices
    gpus = sorted((g for g in inventory.values() if g.node == node), key=lambda g: g.uuid)
    if devices is not None:
        named = set(landing.uuids or ())
        chosen = [g.uuid for g in gpus if g.uuid in named or gpu_index(g.uuid) in set(devices)]
        return chosen if len(chosen) == len(devices) == count else None  # a partial report never resizes a job
    ranked = sorted(gpus, key=lambda g: (ledger.get(g.uuid, (0.0, 0))[0], g.uuid))
    return [g.uuid for g in ranked[:count]] if len(ranked) >= count else None


def placement_drift(
    assigned: list[str], landings: list[Landing], inventory: dict[str, GpuState], ledger: dict
) -> tuple[list[str], list[str]] | None:
    """(the job's GPUs where it actually runs, the kinds of drift: 'node', 'gpu'), or None when it runs as
    planned or not every pod is bound yet. `assigned`: its recorded GPUs; `inventory`: uuid → GPU; `ledger`:
    uuid → (allocated GiB, jobs)."""
    planned = _by_node(assigned, inventory)
    if len(landings) < len(planned):
        return None
    matched = [landing for landing in landings if landing.node in planned]
    unmatched = [landing for landing in landings if landing.node not in planned]
    spare = [node for node in sorted(planned) if node not in {landing.node for landing in matched}]
    actual, kinds = [], []
    for landing in matched:
        gpus = planned[landing.node]
        moved = _on_node(landing, len(gpus), inventory, ledger) if landing.devices is not None else None
        if moved is not None and sorted(moved) != sorted(gpus):
            actual.extend(moved)
            kinds.append("gpu")
        else:
            actual.extend(gpus)
    for landing, node in zip(unmatched, spare, strict=False):
        kinds.append("node")
        found = _on_node(landing, len(planned[node]), inventory, ledger)
        if found is None and landing.devices is not None:  # devices the fleet cannot match: its least allocated
            found = _on_node(Landing(landing.node), len(planned[node]), inventory, ledger)
        actual.extend(found if found is not None else planned[node])  # a node the fleet does not know: books as planned
    return (actual, kinds) if kinds else None


def relocate(store, job_id: str, gpus: list[str], dispatcher: str, now: float) -> None:
    """Move running job `job_id`'s allocations to `gpus` (same GiB per GPU), logged as a release and a claim."""
    with store.engine.begin() as connection:
        rows = connection.execute(allocations_table.select().where(allocations_table.c.job_id == job_id)).mappings().all()
        if not rows:
            return
        mem_gib = rows[0]["mem_gib"]
        log = [{"job_id": job_id, "gpu_uuid": r["gpu_uuid"], "mem_gib": r["mem_gib"], "event": "release"} for r in rows]
        log += [{"job_id": job_id, "gpu_uuid": g, "mem_gib": mem_gib, "event": "claim"} for g in gpus]
        connection.execute(insert(allocation_log), [{**row, "dispatcher": dispatcher, "at_s": now} for row in log])
        connection.execute(delete(allocations_table).where(allocations_table.c.job_id == job_id))
        connection.execute(insert(allocations_table), [{"job_id": job_id, "gpu_uuid": g, "mem_gib": mem_gib} for g in gpus])
        connection.execute(update(jobs_table).where(jobs_table.c.id == job_id).values(assigned=json.dumps(sorted(gpus))))


def check_landings(
    store, launcher, watched: dict[str, str], asked: dict[str, float], engine: str, dispatcher: str, now: float
) -> list[str]:
    """Ask `launcher` where each watched job landed, once all its pods are bound; correct the books of
    those that drifted (returned) and count them. `asked`: job id → when to ask next (inf: checked),
    kept by the caller; a job not bound yet is asked again `RECHECK_S` later, so jobs waiting in the
    engine's own queue (Kueue) cost one API call each that often, not every cycle."""
    for kind in DRIFT_KINDS:  # known from the start, at 0: a rate over it is 0, not absent
        metrics.QUEUE_PLACEMENT_DRIFT.labels(engine=engine, kind=kind)
    landed = getattr(launcher, "landed", None)
    for gone in set(asked) - set(watched):
        del asked[gone]
    due = sorted(job_id for job_id in watched if asked.get(job_id, 0.0) <= now)
    if landed is None or not due:
        return []
    rows, inventory, drifted = store.get_many(due), None, []
    for job_id in due:
        row = rows.get(job_id)
        landings = landed(watched[job_id]) if row and row["state"] == "running" else None
        asked[job_id] = now + RECHECK_S if landings is None else float("inf")
        if landings is None:
            continue
        inventory = inventory or {g.uuid: g for g in store.inventory()}
        assigned = json.loads(row["assigned"] or "[]")
        found = placement_drift(assigned, landings, inventory, store.ledger())
        if found is None:
            continue
        gpus, kinds = found
        relocate(store, job_id, gpus, dispatcher, now)
        for kind in kinds:
            metrics.QUEUE_PLACEMENT_DRIFT.labels(engine=engine, kind=kind).inc()
        print(f"queue: {job_id} runs on {sorted(gpus)}, not {sorted(assigned)} as placed ({', '.join(kinds)}); books corrected")
        drifted.append(job_id)
    return drifted

"""A claim's view of the ledger: what one claim transaction re-reads, under its locks, before it
allocates GPUs to jobs, so that dispatchers racing each other never over-allocate a GPU nor put
a job beside one that runs alone (a multi-GPU or exclusive job), whatever each one planned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlalchemy import select

from scheduler.policy import Placement
from scheduler.queue.schema import allocation_log, allocations_table, marks, scheduling_of


@dataclass
class ClaimLedger:
    """One claim transaction's view of the GPUs it touches: capacity, GiB allocated, jobs on each,
    which hold a job that runs alone, and the placed jobs' states and whether they run alone."""

    totals: dict[str, float]
    states: dict[str, str]
    alone_jobs: set[str] = field(default_factory=set)  # placed jobs that run alone
    used: dict[str, float] = field(default_factory=dict)
    jobs_on: dict[str, int] = field(default_factory=dict)
    held_alone: set[str] = field(default_factory=set)  # GPUs a job that runs alone holds
    rows: dict[str, dict] = field(default_factory=dict)  # the placed jobs' rows as read

    def admits(self, placement: Placement, max_jobs_per_gpu: int) -> bool:
        if self.states.get(placement.job_id) != "queued" or not all(g in self.totals for g in placement.gpus):
            return False
        alone = len(placement.gpus) > 1 or placement.job_id in self.alone_jobs
        return not any(
            self.used.get(g, 0.0) + placement.mem_gib > self.totals[g] + 1e-9
            or self.jobs_on.get(g, 0) >= max_jobs_per_gpu
            or (alone and self.jobs_on.get(g, 0))
            or g in self.held_alone
            for g in placement.gpus
        )

    def claimed(self, placement: Placement, version: int) -> dict:
        """What a claim changes in a job's row besides its state, lease and start."""
        attempts = self.rows[placement.job_id]["attempts"] + 1
        return {"assigned": json.dumps(list(placement.gpus)), "attempts": attempts, "version": version}

    def take(self, placement: Placement) -> None:
        for g in placement.gpus:
            self.used[g], self.jobs_on[g] = self.used.get(g, 0.0) + placement.mem_gib, self.jobs_on.get(g, 0) + 1
        if len(placement.gpus) > 1 or placement.job_id in self.alone_jobs:
            self.held_alone.update(placement.gpus)
        self.states[placement.job_id] = "running"


def locked_ledger(connection, placements: list[Placement], is_sqlite: bool) -> ClaimLedger:
    """The wanted GPUs' capacity, allocations and lone holders, and the jobs' states, read under the
    claim's locks (PostgreSQL: the GPU rows, then the job rows, in key order: no deadlock cycles).
    Raw SQL: SQLAlchemy renders each IN list anew, which costs more than the reads at the first
    cycle's thousands of claims."""
    wanted = sorted({g for p in placements for g in p.gpus})
    ids = sorted(p.job_id for p in placements)
    gpus_in, jobs_in = marks(connection, len(wanted)), marks(connection, len(ids))
    lock = "" if is_sqlite else " FOR UPDATE"  # a rival claim waits on the locks, then re-reads
    read = connection.exec_driver_sql
    totals = dict(read(f"SELECT uuid, total_gib FROM gpus WHERE uuid IN ({gpus_in}) ORDER BY uuid{lock}", tuple(wanted)).all())
    found = read(f"SELECT * FROM jobs WHERE id IN ({jobs_in}) ORDER BY id{lock}", tuple(ids))  # whole: the launcher's
    keys = tuple(found.keys())
    jobs = [dict(zip(keys, row)) for row in found.all()]
    ledger = ClaimLedger(
        totals,
        {job["id"]: job["state"] for job in jobs},
        {job["id"] for job in jobs if job["gpus"] > 1 or scheduling_of(job["labels"]).exclusive},
        rows={job["id"]: job for job in jobs},
    )
    for gpu, total, count in read(
        f"SELECT gpu_uuid, SUM(mem_gib), COUNT(*) FROM allocations WHERE gpu_uuid IN ({gpus_in}) GROUP BY gpu_uuid",
        tuple(wanted),
    ):
        ledger.used[gpu], ledger.jobs_on[gpu] = float(total), int(count)
    lone = read(
        "SELECT a.gpu_uuid FROM allocations a JOIN jobs j ON j.id = a.job_id "
        f"WHERE a.gpu_uuid IN ({gpus_in}) AND (j.gpus > 1 OR j.labels LIKE {marks(connection, 1)})",
        (*wanted, '%"exclusive": "true"%'),
    )
    ledger.held_alone.update(row[0] for row in lone)
    return ledger


def shared_since(connection, job_id: str, start_s: float) -> bool:
    """Whether another job held one of `job_id`'s GPUs at any moment since `start_s` (while it ran):
    one that holds one now, or one that released one after `start_s`. Read before `job_id`'s own
    release, in the transaction that records its end."""
    mine = select(allocations_table.c.gpu_uuid).where(allocations_table.c.job_id == job_id)
    beside = select(allocations_table.c.job_id).where(
        allocations_table.c.gpu_uuid.in_(mine), allocations_table.c.job_id != job_id
    )
    left = select(allocation_log.c.job_id).where(
        allocation_log.c.gpu_uuid.in_(mine),
        allocation_log.c.job_id != job_id,
        allocation_log.c.event == "release",
        allocation_log.c.at_s > start_s,
    )
    return connection.execute(beside.limit(1)).first() is not None or connection.execute(left.limit(1)).first() is not None


def versions_of(connection, job_ids: list[str]) -> dict[str, int]:
    """job id → `jobs.version` of the claimed jobs, read in the claim's transaction after its update."""
    found = connection.exec_driver_sql(
        f"SELECT id, version FROM jobs WHERE id IN ({marks(connection, len(job_ids))})", tuple(job_ids)
    )
    return dict(found.all())

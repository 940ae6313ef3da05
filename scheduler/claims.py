"""A claim's view of the ledger: what one claim transaction re-reads, under its locks, before it
allocates GPUs to jobs, so that dispatchers racing each other never over-allocate a GPU nor put
a job beside one that runs alone (a multi-GPU or exclusive job), whatever each one planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, or_, select

from scheduler.policy import Placement
from scheduler.schema import allocations_table, gpus_table, jobs_table, scheduling_of


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

    def take(self, placement: Placement) -> None:
        for g in placement.gpus:
            self.used[g], self.jobs_on[g] = self.used.get(g, 0.0) + placement.mem_gib, self.jobs_on.get(g, 0) + 1
        if len(placement.gpus) > 1 or placement.job_id in self.alone_jobs:
            self.held_alone.update(placement.gpus)
        self.states[placement.job_id] = "running"


def locked_ledger(connection, placements: list[Placement], is_sqlite: bool) -> ClaimLedger:
    """The wanted GPUs' capacity, allocations and lone holders, and the jobs' states, read under the
    claim's locks (PostgreSQL: the GPU rows, then the job rows, in key order: no deadlock cycles)."""
    wanted = sorted({g for p in placements for g in p.gpus})
    gpu_rows = select(gpus_table).where(gpus_table.c.uuid.in_(wanted)).order_by(gpus_table.c.uuid)
    job_rows = (
        select(jobs_table.c.id, jobs_table.c.state, jobs_table.c.gpus, jobs_table.c.labels)
        .where(jobs_table.c.id.in_(sorted(p.job_id for p in placements)))
        .order_by(jobs_table.c.id)
    )
    if not is_sqlite:  # a rival claim waits on the locks, then re-reads
        gpu_rows, job_rows = gpu_rows.with_for_update(), job_rows.with_for_update()
    totals = {r.uuid: r.total_gib for r in connection.execute(gpu_rows)}
    jobs = connection.execute(job_rows).all()
    ledger = ClaimLedger(
        totals,
        {r.id: r.state for r in jobs},
        {r.id for r in jobs if r.gpus > 1 or scheduling_of(r.labels).exclusive},
    )
    for gpu, total, count in connection.execute(
        select(allocations_table.c.gpu_uuid, func.sum(allocations_table.c.mem_gib), func.count())
        .where(allocations_table.c.gpu_uuid.in_(wanted))
        .group_by(allocations_table.c.gpu_uuid)
    ):
        ledger.used[gpu], ledger.jobs_on[gpu] = float(total), int(count)
    lone = (
        select(allocations_table.c.gpu_uuid)
        .join(jobs_table, jobs_table.c.id == allocations_table.c.job_id)
        .where(
            allocations_table.c.gpu_uuid.in_(wanted),
            or_(jobs_table.c.gpus > 1, jobs_table.c.labels.like('%"exclusive": "true"%')),
        )
    )
    ledger.held_alone.update(row[0] for row in connection.execute(lone))
    return ledger

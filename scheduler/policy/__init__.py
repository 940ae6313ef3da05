"""Pure placement decisions: which waiting job goes on which GPUs now, from what the queue and the
fleet say. Nothing here reads a database, a clock or a cluster; the dispatcher and the simulator
hand it the same inputs, so what the simulator measures is what runs.

    state.py         the vocabulary: GPUs, waiting and running jobs, placements, PolicyConfig
    planner.py       the Planner: the drape policy kept as long as the fleet, O(log n) per decision
    plan.py          `plan_drape`: the same decisions recomputed from scratch (the reference)
    pool.py          the fleet indexed for best-fit lookups
    reservation.py   EASY backfill's reservation; clearing.py: when each node clears
    preemption.py    preemption to defragment and spread; victims.py: where a gang job may preempt
    checkpoints.py   checkpoint preemption for gang jobs waiting past their bound
    fragmentation.py what a placement does to wider jobs
    gangs.py         gangs across nodes (k nodes × g GPUs of one model) where the engine spans nodes
    scarcity.py      jobs that may run anywhere keep off the GPU models constrained jobs need
    baselines.py     the policies drape is measured against (FIFO + EASY backfill among them), by name

The package re-exports the vocabulary and `plan_drape`, the names other rooms import.
"""

from scheduler.policy.plan import plan_drape
from scheduler.policy.state import (
    COLOCATION_WINDOW,
    STARVED_AFTER_S,
    GpuState,
    JobRequest,
    Placement,
    PolicyConfig,
    RunningJob,
    allowed,
    allows,
    effective_priority,
    queued_at,
    static_priority,
)

__all__ = [
    "COLOCATION_WINDOW",
    "STARVED_AFTER_S",
    "GpuState",
    "JobRequest",
    "Placement",
    "PolicyConfig",
    "RunningJob",
    "allowed",
    "allows",
    "effective_priority",
    "plan_drape",
    "queued_at",
    "static_priority",
]

"""The GPU queue: memory profiles, fleet view, placement policy, durable queue, dispatcher,
launchers and the trace simulator. Imports run `tasks → scheduler → drape`.

    policy.py      placement policies (drape, fifo-exclusive), shared by dispatcher and simulator
    store.py       the durable queue (SQLite / PostgreSQL): jobs, ledger, leases, measurements
    profiles.py    memory profiles: estimated from the config, learned from measured peaks
    fleet.py       GPUs from DCGM via Prometheus, a static inventory, or this machine
    dispatcher.py  claim and launch; `submit_and_wait` for the pipeline's train task
    launchers.py   local process, Kubernetes Job, Prefect flow run
    simulator.py   trace replay with the contention model
"""

from __future__ import annotations

from drape import JobKind, job_kind_for
from scheduler.store import JobSpec


def train_job_spec(config, *, stage: str, mode: str, run_id: str, command: list[str]) -> JobSpec:
    """A stage-training (or fine-tune) job for the queue, sized by the stage's memory profile."""
    from scheduler.profiles import profile
    from scheduler.store import JobStore

    kind = job_kind_for(mode)
    sized = profile(config, JobStore(config.queue_url), kind, stage)
    return JobSpec(
        kind=kind,
        command=command,
        mem_gib=sized.mem_gib,
        duration_s=sized.duration_s,
        stage=stage,
        shape=sized.shape,
        priority=5 if kind is JobKind.STAGE_TRAINING else 4,
        labels={"run": run_id},
    )

"""The GPU queue: memory profiles, fleet view, placement policy, durable queue, dispatcher,
launchers and the trace simulator. Imports run `tasks → scheduler → drape`.

    policy.py      placement policies (drape, fifo-exclusive), shared by dispatcher and simulator
    store.py       the durable queue (SQLite / PostgreSQL): jobs, ledger, measurements
    leases.py      dispatcher leases: renewal, adoption and requeue of expired ones (compare-and-set)
    profiles.py    memory profiles: estimated from the config, learned from measured peaks
    fleet.py       GPUs from DCGM via Prometheus, a static inventory, or this machine
    dispatcher.py  claim and launch; `submit_and_wait` for the pipeline's train task
    launchers.py   local process (torchrun for multi-GPU stage jobs), Prefect flow run
    kubernetes.py  Kubernetes Jobs, indexed Jobs, PyTorchJobs: objects and launcher
    simulator.py   trace replay with the contention model
"""

from __future__ import annotations

import json

from drape import JobKind, job_kind_for
from drape.layout import job_paths, model_paths
from scheduler.store import JobSpec


def train_job_spec(config, *, stage: str, mode: str, run_id: str, command: list[str]) -> JobSpec:
    """A stage-training (or fine-tune) job for the queue: `train.gpus` (or the stage's own) GPUs, each
    sized by the stage's memory profile; the launcher runs more than one under torchrun."""
    from scheduler.profiles import profile
    from scheduler.store import JobStore

    kind = job_kind_for(mode)
    gpus = config.train.gpus_for(stage)
    sized = profile(config, JobStore(config.queue_url), kind, stage, gpus)
    return JobSpec(
        kind=kind,
        command=command,
        gpus=gpus,
        mem_gib=sized.mem_gib,
        duration_s=sized.duration_s,
        stage=stage,
        shape=sized.shape,
        priority=5 if kind is JobKind.STAGE_TRAINING else 4,
        # ranks under torchrun, one per GPU; pods mount the paths the job's config writes to
        labels={
            "run": run_id,
            "launch": "torchrun",
            "mounts": json.dumps(job_paths(config)),
            "models": json.dumps(model_paths(config)),  # read-only: the VAE, the identity embedder
        },
    )

"""A stage-training (or fine-tune) job as the queue sees it: how many GPUs, how much memory on
each (the stage's memory profile, `scheduler/jobs/profiles.py`), what it mounts. The queue knows
shapes and memory profiles; it never builds a model."""

from __future__ import annotations

import json

from drape import JobKind, job_kind_for
from drape.mounts import job_paths, model_paths
from scheduler.queue.store import JobSpec


def train_job_spec(config, *, stage: str, mode: str, run_id: str, command: list[str]) -> JobSpec:
    """A stage-training (or fine-tune) job for the queue: `train.gpus` (or the stage's own) GPUs, each
    sized by the stage's memory profile; the launcher runs more than one under torchrun."""
    from scheduler.jobs.profiles import profile
    from scheduler.queue.store import JobStore

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
            "models": json.dumps(model_paths(config)),  # read-only: the denoiser, the VAE, the gates' and eval's weights
        },
    )

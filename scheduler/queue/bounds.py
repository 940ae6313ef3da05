"""The bounds a job must keep to be queued (`JobStore.submit`): every field read back from the
queue is one the policy, the fleet and the database can hold, whatever called submit."""

from __future__ import annotations

import math

from scheduler.policy.state import MAX_PRIORITY
from scheduler.queue.inventory import MAX_GPU_MEMORY_GIB, MAX_JOB_GPUS
from scheduler.queue.schema import KINDS, MAX_JOB_SECONDS, JobSpec, QueueError


def check_spec(spec: JobSpec) -> None:
    """QueueError naming the field of `spec` no queue row or fleet holds: an unknown kind, GPUs,
    memory per GPU, run time or priority out of bounds (what `JobStore.submit` refuses)."""
    if spec.kind not in KINDS:
        raise QueueError(f"job kind {spec.kind!r} unknown; expected one of {KINDS}")
    if spec.gpus < 1 or not math.isfinite(spec.mem_gib) or spec.mem_gib <= 0:
        raise QueueError(f"job needs gpus >= 1 and a finite mem_gib > 0, got {spec.gpus} and {spec.mem_gib}")
    if spec.gpus > MAX_JOB_GPUS or spec.mem_gib > MAX_GPU_MEMORY_GIB:
        raise QueueError(
            f"job needs gpus <= {MAX_JOB_GPUS} and mem_gib <= {MAX_GPU_MEMORY_GIB:g} (per GPU), "
            f"got {spec.gpus} and {spec.mem_gib}"
        )
    if not math.isfinite(spec.duration_s) or not 0 <= spec.duration_s <= MAX_JOB_SECONDS:
        raise QueueError(f"job duration_s must be a finite number in [0, {MAX_JOB_SECONDS:g}] (ten years), got {spec.duration_s}")
    if not isinstance(spec.priority, int) or abs(spec.priority) > MAX_PRIORITY:
        raise QueueError(f"job priority must be an integer in [-{MAX_PRIORITY}, {MAX_PRIORITY}], got {spec.priority!r}")

"""The GPU queue's vocabulary: what the policy knows about GPUs, waiting and running jobs, and
the placements it decides (`scheduler/policy/plan.py` re-exports all of it, the name others import)."""

from __future__ import annotations

import math
from dataclasses import dataclass

STARVED_AFTER_S = 3600.0  # a job waiting longer than this is starved (metrics, simulator, alerts)
COLOCATION_WINDOW = 32  # co-location weighs this many of the tightest memory fits
CHECKPOINT_EVERY_S = 600.0  # a job that declares no cadence is taken to checkpoint every 10 min of progress
MAX_GANG_WAIT_S = 7 * 24 * 3600.0  # the longest bound on a gang job's wait that makes sense (a week)
MAX_PRIORITY = 1_000_000  # a job's priority, either way (the queue's column is a 32-bit integer)


@dataclass(frozen=True)
class PolicyConfig:
    aging_per_hour: float = 1.0
    max_jobs_per_gpu: int = 4
    idle_mem_gib: float = 1.0
    idle_util_percent: float = 5.0
    backfill: bool = True
    preempt_after_s: float | None = 1200.0  # a multi-GPU job waiting this long may preempt (None: never)
    max_preemptions: int = 2  # a job is preempted at most this many times
    spread_after_s: float | None = 3600.0  # move a crowded GPU's job expected to run this much longer to an idle GPU
    fragmentation: bool = False  # score nodes by what a placement does to wider jobs (False: fullest node first)
    # a multi-GPU job waiting this long may stop preemptible running jobs of lower priority, which
    # resume from their checkpoints (`scheduler/policy/checkpoints.py`; None: never)
    gang_max_wait_s: float | None = None
    gang_max_preemptions: int = 4  # a job is stopped for an overdue gang job only while preempted fewer times
    # single-GPU jobs expected to run at most `short_job_s` rank this much higher: when the fleet is
    # full, short jobs start before long ones (their waits set the class's mean)
    short_job_bonus: float = 0.0
    short_job_s: float = 3600.0
    # a multi-GPU job may run as k nodes × g GPUs of one model when no node holds it now (engines that
    # start a job across nodes: Slurm; `scheduler/policy/gangs.py`). False: one node each
    span_nodes: bool = False
    # a job that may run on any GPU model keeps off the models waiting constrained jobs need, and
    # long unconstrained jobs move off them while such a job waits (`scheduler/policy/scarcity.py`)
    avoid_scarce: bool = True
    # with `avoid_scarce`, a constrained multi-GPU job waiting `preempt_after_s` also moves long
    # unconstrained jobs off the node of its kinds that then clears within `spread_after_s`
    # (`scheduler/policy/scarcity.py`; off: on `benchmarks/openb_week.py` it ends a week with two G3
    # nodes sooner and one with a single 4-GPU V100 node later)
    rescue_gangs: bool = False
    # a gang job past `gang_max_wait_s` stops only jobs that can all start again at once off its
    # nodes (`scheduler/policy/checkpoints.py`): single-GPU jobs keep their room, so the bound does
    # not make them wait (False: the cheapest node, whether or not they can)
    gang_stops_rehome: bool = False
    # a gang job past `gang_max_wait_s` may also stop a running multi-GPU job of its own priority whose
    # work left is at least this many times its own run (shortest work first among equals:
    # `scheduler/policy/checkpoints.py`; None: jobs of one priority never stop each other)
    gang_stops_longer: float | None = None
    # `gang_max_wait_s` bounds a multi-GPU job's whole wait: its waits before each requeue count too
    # (`JobRequest.waited_s`), so a stopped gang job that had waited its bound is overdue again at
    # once (False: its bound counts from its last requeue; `scheduler/policy/checkpoints.py`)
    gang_bound_whole_wait: bool = False
    # with `gang_max_wait_s`, a gang job's bound rises to this many times the queue's backlog (the
    # GPU-seconds of work waiting over the fleet's GPUs: how long the whole fleet needs to run what
    # waits; `scheduler/policy/checkpoints.py`: `gang_bound`). While the queue is long, gang jobs
    # wait longer before they stop others, and the jobs they would stop keep moving (0: the bound as set)
    gang_bound_backlog: float = 0.0
    # a multi-GPU job that has waited this long (s) may stop a running multi-GPU job of its own priority
    # that had waited at least this much less when it started: the longest-waiting gang jobs run, as
    # first-come-first-served cannot do once a long job holds a node (`scheduler/policy/checkpoints.py`).
    # Whatever `gang_max_wait_s` says: it takes no room from other jobs. Waits are whole waits (it needs
    # `gang_bound_whole_wait`); None: off
    gang_stops_waited: float | None = None
    # a multi-GPU job's aging counts its whole wait (`JobRequest.waited_s`, its waits before each requeue
    # too): a gang job stopped for another ranks by all it has waited, not behind every gang job that came
    # after it (False: aging counts from the last requeue, as for every single-GPU job)
    gang_aging_whole_wait: bool = False

    def __post_init__(self) -> None:
        bound = self.gang_max_wait_s
        if bound is not None and not (math.isfinite(bound) and 0 <= bound <= MAX_GANG_WAIT_S):
            raise ValueError(f"PolicyConfig.gang_max_wait_s must be None or in [0, {MAX_GANG_WAIT_S:g}] s, got {bound!r}")
        if not (math.isfinite(self.short_job_bonus) and 0 <= self.short_job_bonus <= 100):
            raise ValueError(f"PolicyConfig.short_job_bonus must be in [0, 100], got {self.short_job_bonus!r}")
        if not (math.isfinite(self.short_job_s) and 0 <= self.short_job_s <= MAX_GANG_WAIT_S):
            raise ValueError(f"PolicyConfig.short_job_s must be in [0, {MAX_GANG_WAIT_S:g}] s, got {self.short_job_s!r}")
        ratio = self.gang_stops_longer
        if ratio is not None and not (math.isfinite(ratio) and 1 <= ratio <= 1000):
            raise ValueError(f"PolicyConfig.gang_stops_longer must be None or in [1, 1000], got {ratio!r}")
        if not (math.isfinite(self.gang_bound_backlog) and 0 <= self.gang_bound_backlog <= 10):
            raise ValueError(f"PolicyConfig.gang_bound_backlog must be in [0, 10], got {self.gang_bound_backlog!r}")
        waited = self.gang_stops_waited
        if waited is not None and not (math.isfinite(waited) and 60 <= waited <= MAX_GANG_WAIT_S):
            raise ValueError(f"PolicyConfig.gang_stops_waited must be None or in [60, {MAX_GANG_WAIT_S:g}] s, got {waited!r}")
        if waited is not None and not self.gang_bound_whole_wait:
            raise ValueError("PolicyConfig.gang_stops_waited compares whole waits: it needs gang_bound_whole_wait")
        if waited is not None and self.gang_stops_longer is not None:
            raise ValueError(
                "PolicyConfig.gang_stops_waited and gang_stops_longer: one or the other (a gang job stopped by one rule "
                "would stop its stopper back by the other)"
            )
        if not 0 <= self.gang_max_preemptions <= 100:
            raise ValueError(f"PolicyConfig.gang_max_preemptions must be in [0, 100], got {self.gang_max_preemptions!r}")


@dataclass(frozen=True)
class JobRequest:
    """What the policy needs to know about a waiting job (memory per GPU, GiB; times in seconds)."""

    id: str
    priority: int
    submit_s: float
    gpus: int
    mem_gib: float
    duration_s: float
    models: tuple[str, ...] = ()  # GPU models it may run on (a part of the name each); empty: any
    exclusive: bool = False  # a single-GPU job that shares its GPU with nobody (multi-GPU jobs always do)
    share: float = 1.0  # the part of a GPU's compute it declares it uses (< 1: co-located by declaration)
    preempted: int = 0  # times it was preempted so far
    prefer_node: str = ""  # among equal choices, first this node (its shard cache is warm for the job)
    preemptible: bool = True  # it resumes from its checkpoints, so a waiting gang job may stop it
    checkpoint_every_s: float = CHECKPOINT_EVERY_S  # how often it checkpoints (s of progress)
    # when it last joined the queue, if not at its submit: a preempted job's requeue. Aging and the
    # gang bound (`gang_max_wait_s`) count from it (`queued_at`)
    queued_s: float | None = None
    # what it waited before its last requeue (from each submit or requeue to the start after it): the
    # gang bound counts it with `PolicyConfig.gang_bound_whole_wait`
    waited_s: float = 0.0


def names_model(part: str, model: str) -> bool:
    """Whether `part` names the GPU model `model`: a part of its name, in any case, that does not cut
    a number in two. "H100" names "NVIDIA-H100-80GB-HBM3", "A100" "A100-SXM4-80GB" and "A10" an A10G,
    but "A10" does not name an A100, nor "L4" an L40S: models a site runs side by side, a price
    apart, that plain substrings confused."""
    part, model = part.lower(), model.lower()
    at = model.find(part)
    while at >= 0 and part:
        end = at + len(part)
        cuts_before = part[0].isdigit() and at > 0 and model[at - 1].isdigit()
        cuts_after = part[-1].isdigit() and end < len(model) and model[end].isdigit()
        if not (cuts_before or cuts_after):
            return True
        at = model.find(part, at + 1)
    return False


def allows(models: tuple[str, ...], model: str) -> bool:
    """Whether a job naming `models` may run on a GPU of `model`: none named, or one names it (`names_model`)."""
    return not models or any(names_model(part, model) for part in models)


def allowed(job: JobRequest, model: str) -> bool:
    """Whether `job` may run on a GPU of `model` (see `allows`)."""
    return allows(job.models, model)


@dataclass
class GpuState:
    uuid: str
    node: str
    model: str
    total_gib: float
    allocated_gib: float = 0.0  # the queue's ledger
    jobs: int = 0  # ledger jobs resident
    observed_used_gib: float | None = None  # DCGM framebuffer used, when known
    observed_util: float | None = None  # DCGM utilization %, when known
    exclusive: bool = False  # holds a job that shares its GPUs with nobody (a multi-GPU or exclusive job)
    shares: float = 0.0  # declared compute shares of the jobs on it (1.0 for each that declared none)
    solo: bool = False  # on a node that cannot share a GPU: one job at a time, whatever `max_jobs_per_gpu` says

    def free_gib(self) -> float:
        return self.total_gib - max(self.allocated_gib, self.observed_used_gib or 0.0)

    def is_idle(self, config: PolicyConfig) -> bool:
        observed_quiet = (self.observed_used_gib is None or self.observed_used_gib <= config.idle_mem_gib) and (
            self.observed_util is None or self.observed_util < config.idle_util_percent
        )
        return self.jobs == 0 and self.allocated_gib < 1e-6 and observed_quiet


@dataclass(frozen=True)
class RunningJob:
    id: str
    gpus: tuple[str, ...]
    mem_gib: float
    expected_end_s: float
    priority: int = 0
    shareable: bool = False  # a single-GPU job that did not ask to run alone: it may be preempted
    preempted: int = 0
    models: tuple[str, ...] = ()
    share: float = 1.0
    preemptible: bool = True  # a waiting gang job may stop it (it resumes from its checkpoint)
    checkpoint_every_s: float = CHECKPOINT_EVERY_S
    started_s: float = 0.0  # when it (last) started: the work since its last checkpoint is counted from it
    waited_s: float = 0.0  # what it had waited in all when it (last) started (`waited_by` then)


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpus: tuple[str, ...]
    mem_gib: float
    evicts: tuple[str, ...] = ()  # running jobs to preempt (requeue) before it starts


def short_bonus(job: JobRequest, config: PolicyConfig) -> float:
    """The priority a single-GPU job expected to run at most `short_job_s` gains (`short_job_bonus`)."""
    return config.short_job_bonus if job.gpus == 1 and job.duration_s <= config.short_job_s else 0.0


def queued_at(job: JobRequest) -> float:
    """When `job`'s present wait began, what aging counts from: its submit, or its last requeue. A
    stopped job that resumes was served already: counted from its submit, days of aging would rank it
    before every job that has not started once (measured in `benchmarks/gang_bound.py`)."""
    # never before the submit: a label read from the store cannot buy a job aging it did not wait
    return job.submit_s if job.queued_s is None else max(job.submit_s, job.queued_s)


def bound_start(job: JobRequest, config: PolicyConfig) -> float:
    """When `job`'s gang bound (`gang_max_wait_s`) started counting: its last requeue, less its
    earlier waits with `gang_bound_whole_wait` (so possibly before its requeue, never before its
    submit: a label read from the store cannot buy a wait the job did not have)."""
    if not config.gang_bound_whole_wait:
        return queued_at(job)
    return whole_wait_start(job)


def whole_wait_start(job: JobRequest) -> float:
    """When `job`'s whole wait would have begun had it waited once: its last requeue less its earlier
    waits (`waited_s`), never before its submit."""
    since = queued_at(job)
    return since - min(max(job.waited_s, 0.0), since - job.submit_s)


def aging_start(job: JobRequest, config: PolicyConfig) -> float:
    """When `job`'s aging started counting: its last requeue (`queued_at`), or for a multi-GPU job with
    `gang_aging_whole_wait` its whole wait's start (`whole_wait_start`)."""
    return whole_wait_start(job) if config.gang_aging_whole_wait and job.gpus > 1 else queued_at(job)


def waited_by(job: JobRequest, at: float) -> float:
    """What `job` has waited in all by `at`: since its last requeue, and before it (`waited_s`), never more
    than since its submit (a label read from the store cannot buy a wait the job did not have). With
    `gang_bound_whole_wait`, `at - bound_start(job)`."""
    return whole_wait(job.submit_s, job.queued_s, job.waited_s, at)


def whole_wait(submit_s: float, queued_s: float | None, waited_s: float, at: float) -> float:
    """`waited_by` from a job's fields: its submit, last requeue (None: never) and waits before it."""
    since = submit_s if queued_s is None else max(submit_s, queued_s)
    return max(at - since, 0.0) + min(max(waited_s, 0.0), since - submit_s)


def requeued_waited(job: JobRequest, started_s: float) -> float:
    """What `job` (as it last started, at `started_s`) has waited in all once it is stopped and
    requeued: its earlier waits and the one that ended at that start (`JobRequest.waited_s`)."""
    return job.waited_s + max(started_s - queued_at(job), 0.0)


def effective_priority(job: JobRequest, now: float, config: PolicyConfig) -> float:
    return job.priority + short_bonus(job, config) + config.aging_per_hour * max(now - aging_start(job, config), 0.0) / 3600.0


def static_priority(job: JobRequest, config: PolicyConfig) -> float:
    """`effective_priority` less the part every job shares at one clock: the order by it is the
    order by effective priority at any `now` past the submits, so it can be kept, not re-sorted."""
    return job.priority + short_bonus(job, config) - config.aging_per_hour * aging_start(job, config) / 3600.0

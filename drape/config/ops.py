"""Config of the GPU queue and metrics (Prometheus); tracking, orchestration and alerts are in
`drape.config.services`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape.config.base import StrictModel, mounted
from drape.config.kubernetes import KubernetesLauncherConfig
from drape.config.services import AlertsConfig, OrchestrationConfig, TrackingConfig
from drape.config.slurm import SlurmLauncherConfig

# their home before services.py and kubernetes.py
__all__ = ["AlertsConfig", "KubernetesLauncherConfig", "OrchestrationConfig", "TrackingConfig"]


JOB_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CA_BUNDLE",
    "AWS_ENDPOINT_URL",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
)


class QueueConfig(StrictModel):
    """The GPU queue (scheduler/): where jobs wait, how GPUs are seen, how jobs start."""

    enabled: bool = Field(default=False, description="train jobs go through the queue")
    url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<root>/queue.db (postgresql://… at scale)"
    )
    fleet: Literal["local", "static", "prometheus", "slurm"] = Field(
        default="local",
        description="how the queue sees GPUs: local (this machine's devices), static (the inventory file), "
        "prometheus (the DCGM exporter's series), slurm (Slurm's nodes, gres, CPUs, memory, partitions and state "
        "from scontrol and sinfo; a drained or down node takes no job; GPU memory from queue.slurm.gpu_memory_gib)",
    )
    inventory: str | None = Field(
        default=None,
        description="fleet YAML for 'static' (and the ledger's inventory)",
        json_schema_extra=mounted("none", "the dispatcher's and the cost ledger's, never a job's"),
    )
    prometheus_url: str | None = Field(default=None, description="Prometheus with the DCGM exporter's series")
    launcher: Literal["local", "kubernetes", "slurm"] = Field(
        default="local",
        description="how a placed job starts: local (a child process with CUDA_VISIBLE_DEVICES), kubernetes (a Job), "
        "slurm (an sbatch script whose srun starts torchrun on every node)",
    )
    node_commands: dict[str, list[str]] = Field(
        default_factory=dict,
        description="local launcher: node name → the command prefix that runs a program on that node (e.g. "
        "['ssh', 'node-a'], or nsenter into a rehearsal node's mount namespace); a node not listed runs jobs here",
    )
    policy: Literal["drape", "fifo-exclusive"] = Field(
        default="drape",
        description="placement: drape (memory profiles, GPU sharing, aging, gangs) or fifo-exclusive (the ad hoc "
        "baseline: first come first served, whole GPUs; benchmarks/scheduler.py compares them)",
    )
    aging_per_hour: float = Field(
        default=1.0, ge=0, description="priority points a waiting job gains per hour waited, so none starves; 0: no aging"
    )
    max_jobs_per_gpu: int = Field(default=4, gt=0, description="most jobs the queue places on one GPU (1: never share)")
    preempt_after_seconds: float = Field(
        default=1200.0,
        ge=0,
        description="a multi-GPU job waiting this long may preempt lower-priority shareable single-GPU jobs that can "
        "restart at once on idle GPUs elsewhere (they resume from their checkpoints); 0: never preempt",
    )
    max_preemptions: int = Field(default=2, ge=0, description="times one job may be preempted (or moved)")
    gang_max_wait_seconds: float = Field(
        default=0.0,
        ge=0,
        le=7 * 24 * 3600,
        description="a multi-GPU job waiting this long may stop lower-priority preemptible jobs (they are requeued and "
        "resume from their checkpoints) to take a node (scheduler/policy/checkpoints.py); 0: never. Off by default: on "
        "benchmarks/gang_bound.py it halves 8-GPU max waits at a cost in 1-GPU waits",
    )
    gang_max_preemptions: int = Field(
        default=4,
        ge=0,
        le=100,
        description="a job is stopped for a multi-GPU job past gang_max_wait_seconds only while it was preempted (or "
        "moved) fewer times than this, so no job is stopped over and over",
    )
    gang_stops_rehome: bool = Field(
        default=False,
        description="a multi-GPU job past gang_max_wait_seconds stops only jobs that can all start again at once off its "
        "nodes, so single-GPU jobs keep their room and the bound does not make them wait (benchmarks/wide_gangs.py); "
        "false: the cheapest node, whether or not they can",
    )
    gang_stops_longer: float = Field(
        default=0.0,
        ge=0,
        le=1000,
        description="a multi-GPU job past gang_max_wait_seconds may also stop a running multi-GPU job of its own "
        "priority whose work left is at least this many times its own run (shortest work first among equals; the "
        "stopped job can never stop it back), so a short gang is not held for days behind a long one "
        "(benchmarks/wide_gangs.py); 0: jobs of one priority never stop each other; else at least 1",
    )
    gang_bound_whole_wait: bool = Field(
        default=False,
        description="gang_max_wait_seconds bounds a multi-GPU job's whole wait: the waits before each of its requeues "
        "count too, so a gang job stopped after it had waited its bound is overdue again at once "
        "(scheduler/policy/checkpoints.py, benchmarks/wide_gangs.py); false: the bound counts from its last requeue",
    )
    gang_bound_backlog: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="gang_max_wait_seconds rises to this many times the queue's backlog while that is longer: the "
        "GPU-seconds of work waiting over the fleet's GPUs, the time the whole fleet needs to run what waits. At a "
        "peak gang jobs then wait their share before they stop others, and single-GPU jobs keep starting "
        "(scheduler/policy/checkpoints.py, benchmarks/policy_sweep.py); 0: the bound as set",
    )
    gang_stops_waited_seconds: float = Field(
        default=0.0,
        ge=0,
        le=7 * 24 * 3600,
        description="a multi-GPU job that has waited this long in all may stop a running multi-GPU job of its own "
        "priority, no wider, that had waited at least this much less when it started (it resumes from its "
        "checkpoint), whatever gang_max_wait_seconds says: the longest-waiting gang jobs run, rather than the first "
        "to start holding nodes for days (scheduler/policy/checkpoints.py, benchmarks/wide_gangs.py); needs "
        "gang_bound_whole_wait, excludes gang_stops_longer; 0: off; else at least 60",
    )
    gang_aging_whole_wait: bool = Field(
        default=False,
        description="a multi-GPU job's aging counts its whole wait (the waits before each of its requeues too), so a "
        "gang job stopped for another ranks by all it has waited rather than behind every gang job that came after "
        'it (scheduler/policy/state.py, benchmarks/wide_gangs.py\'s "aged"); false: aging counts from the last '
        "requeue, as for single-GPU jobs",
    )
    short_job_bonus: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="priority points a single-GPU job expected to run at most short_job_seconds gains, so on a full "
        "fleet short jobs start before long ones (and before stopped long jobs that wait to resume); 0: off",
    )
    short_job_seconds: float = Field(
        default=3600.0,
        ge=0,
        le=7 * 24 * 3600,
        description="the longest expected run (s) of a single-GPU job that short_job_bonus ranks higher",
    )
    rescue_gangs: bool = Field(
        default=False,
        description="a constrained multi-GPU job waiting preempt_after_seconds moves long unconstrained jobs off the node of "
        "its models that then clears within spread_after_seconds (scheduler/policy/scarcity.py); off: mixed on openb weeks",
    )
    placement: Literal["fullest-node", "fragmentation"] = Field(
        default="fullest-node",
        description="the node for a job among those that fit: the fullest (fewest idle GPUs; a multi-GPU job: fewest "
        "left over), or the one whose idle GPUs the waiting and running jobs' widths can still use best "
        "(scheduler/policy/fragmentation.py); measured in benchmarks/scheduler.py",
    )
    spread_after_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="a job sharing a GPU past its compute and expected to run this much longer moves to an idle GPU "
        "left once nothing waits for it (it resumes from its checkpoint); 0: never move",
    )
    headroom: float = Field(default=0.10, ge=0, description="added to measured p95 peak memory")
    lease_seconds: float = Field(
        default=60.0, gt=0, description="a dispatcher silent this long loses its jobs: adopted by another, or requeued"
    )
    max_attempts: int = Field(
        default=1, ge=1, le=20, description="runs of a job that fails before it stays failed (stage jobs resume: retry them)"
    )
    poll_seconds: float = Field(default=1.0, gt=0, description="seconds between a dispatcher's cycles (and a waiter's polls)")
    max_wait_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="the longest the queue's database may stay unreachable (a PostgreSQL restart or failover) before "
        "a flow waiting on its job fails with an error naming it; the wait is logged and counted "
        "(drape_service_outages_total), a dispatcher keeps cycling whatever the outage",
    )
    cpu_slot_gib: float = Field(default=16.0, gt=0, description="memory of the one slot a machine without GPUs offers")
    dispatch_in_process: bool = Field(default=True, description="the submitting task dispatches too (no separate dispatcher)")
    job_environment: list[str] = Field(
        default_factory=lambda: list(JOB_CREDENTIAL_VARIABLES),
        description="variables of the dispatcher's environment a local job receives besides the plain ones "
        "(PATH, HOME, locale, PYTHON*, DRAPE_*, CUDA/NCCL/TORCH/OMP settings): by default the object store's "
        "and MLflow's credentials, which stage jobs need; never the queue database's password",
    )
    placement_timeout_seconds: float = Field(
        default=24 * 3600.0, gt=0, description="a job no GPU of the fleet has held this long fails, with the reason"
    )
    stall_timeout_seconds: float | None = Field(
        default=1800.0,
        gt=0,
        le=7 * 24 * 3600.0,
        allow_inf_nan=False,
        description="a running stage job whose trainer reports no new step for this long (counted from its launch "
        "or its last report, through the object store) is cancelled and retried from its last checkpoint "
        "(scheduler/dispatch/watchdog.py); it must exceed the job's start-up to its first step unless "
        "stall_grace_seconds is set; null: never",
    )
    stall_grace_seconds: float | None = Field(
        default=None,
        gt=0,
        le=7 * 24 * 3600.0,
        allow_inf_nan=False,
        description="the time a stage job gets without a new report outside its training steps: from its launch "
        "until its trainer reports a first step (fetching the checkpoint and data, building the model), and "
        "after its last step (the final checkpoint and result); stall_timeout_seconds applies between the two, "
        "so it can be shorter than a start-up; null: stall_timeout_seconds throughout",
    )
    kubernetes: KubernetesLauncherConfig = Field(
        default=KubernetesLauncherConfig(), description="the Kubernetes engine (launcher: kubernetes)"
    )
    slurm: SlurmLauncherConfig = Field(default=SlurmLauncherConfig(), description="the Slurm engine (launcher: slurm)")

    @model_validator(mode="after")
    def _slurm_whole_gpus(self) -> QueueConfig:
        if self.launcher == "slurm" and self.max_jobs_per_gpu != 1:
            raise ValueError(
                "queue.launcher 'slurm' gives jobs whole GPUs (--gres=gpu:N): set queue.max_jobs_per_gpu to 1, so the "
                f"queue never places two jobs on one GPU that Slurm would then refuse (got {self.max_jobs_per_gpu})"
            )
        return self

    @model_validator(mode="after")
    def _gang_stops_longer(self) -> QueueConfig:
        if 0 < self.gang_stops_longer < 1:
            raise ValueError(
                "queue.gang_stops_longer: expected 0 (off) or a ratio of at least 1 (a job stops only one with at least "
                f"that many times its run left, so it can never be stopped back), got {self.gang_stops_longer}"
            )
        return self

    @model_validator(mode="after")
    def _gang_stops_waited(self) -> QueueConfig:
        waited = self.gang_stops_waited_seconds
        if 0 < waited < 60:
            raise ValueError(f"queue.gang_stops_waited_seconds: expected 0 (off) or at least 60 s, got {waited}")
        if waited and not self.gang_bound_whole_wait:
            raise ValueError(
                "queue.gang_stops_waited_seconds compares gang jobs' whole waits (the waits before each requeue too): "
                "set queue.gang_bound_whole_wait to true beside it"
            )
        if waited and self.gang_stops_longer:
            raise ValueError(
                "queue.gang_stops_waited_seconds and queue.gang_stops_longer: set one or the other (a gang job one rule "
                "stops would stop its stopper back by the other)"
            )
        return self

    @model_validator(mode="after")
    def _slurm_fleet_memory(self) -> QueueConfig:
        if self.fleet == "slurm" and not self.slurm.gpu_memory_gib:
            raise ValueError(
                "queue.fleet 'slurm' reads GPUs from Slurm's gres, which does not say how much memory a GPU has: set "
                "queue.slurm.gpu_memory_gib (gres type → GiB, e.g. {a100: 80, h100: 80})"
            )
        return self


class MetricsConfig(StrictModel):
    pushgateway_url: str | None = Field(default=None, description="Prometheus Pushgateway for flow runs; unset: no push")
    job: str = Field(default="drape", description="the Pushgateway job label flow runs push their series under")

"""Config of the GPU queue and metrics (Prometheus); tracking, orchestration and alerts are in
`drape.config.services`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape.config.base import StrictModel, mounted
from drape.config.names import DnsLabel, DnsSubdomain, LabelKey, LabelValue, NodeName
from drape.config.services import AlertsConfig, OrchestrationConfig, TrackingConfig
from drape.config.slurm import SlurmLauncherConfig

__all__ = ["AlertsConfig", "OrchestrationConfig", "TrackingConfig"]  # their home before services.py


WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"  # NVIDIA's device plugin, time-slicing or MPS with renameByDefault
Sharing = Literal["none", "time-slicing", "mps"]


def _pinned(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    if "@sha256:" not in image and (":" not in name or name.endswith(":latest")):
        raise ValueError(f"queue.kubernetes.image {image!r} must be pinned (a version tag or @sha256 digest, never latest)")
    return image


class KubernetesLauncherConfig(StrictModel):
    namespace: DnsLabel = Field(default="drape", description="the Kubernetes namespace job pods are created in")
    image: str = Field(default="ghcr.io/drape-ai/drape:0.1.0", description="pinned: a tag other than latest, or a digest")
    service_account: DnsSubdomain | None = Field(
        default="drape-job",
        description="the ServiceAccount job pods run as (infra/k8s/base/rbac.yaml); unset: the namespace's default",
    )
    run_as_user: int = Field(default=10001, gt=0, description="the non-root user (and group) job pods run as")
    product_label: LabelKey = Field(default="nvidia.com/gpu.product", description="node label that names the GPU product")
    products: dict[str, LabelValue] = Field(
        default_factory=lambda: {
            "H100-80GB": "NVIDIA-H100-80GB-HBM3",
            "L40S-48GB": "NVIDIA-L40S",
            "A100-40GB": "NVIDIA-A100-SXM4-40GB",
        },
        description="fleet GPU model → node label value",
    )
    tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        description="tolerations of job pods (Kubernetes' own keys): by default the GPU nodes' nvidia.com/gpu taint",
    )
    volume_claims: dict[str, DnsSubdomain] = Field(
        default_factory=dict,
        description="a job path (its config's live root or shard cache) → the PersistentVolumeClaim mounted there; "
        "a path not named here is the node's own directory (hostPath)",
    )
    request_timeout_seconds: float = Field(default=30.0, gt=0, description="the longest wait for one Kubernetes API call")
    training_operator: bool = Field(default=False, description="multi-node jobs as Kubeflow PyTorchJobs instead of indexed Jobs")
    node_label: LabelKey | None = Field(
        default="kubernetes.io/hostname",
        description="the node label whose value is the fleet's node name (kubernetes.io/hostname, which the kubelet "
        "sets on every node, is DCGM's Hostname under the GPU operator): every pod is pinned by required node affinity "
        "to the nodes the queue placed its job on (one pod per node across nodes), so the ledger says where it runs; "
        "null: Kubernetes picks among the nodes of the placed GPU product (the dispatcher then corrects the books "
        "from where the pods land, drape_queue_placement_drift_total)",
    )
    kueue_queue: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Kueue mode: the LocalQueue jobs are submitted to, suspended (`kueue.x-k8s.io/queue-name`); drape "
        "orders jobs and sizes them (GPUs, the GPU model or MIG slice their memory profile needs), Kueue admits them, "
        "kube-scheduler picks the node (docs/kueue.md; `drape queue kueue` renders the objects); unset: drape places",
    )
    sharing: Sharing = Field(
        default="none",
        description="how the cluster's device plugin shares a GPU between pods: none (whole GPUs only, nvidia.com/gpu), "
        "time-slicing or mps (NVIDIA's device plugin with renameByDefault: every GPU of such a node is offered as "
        "`shared_resource` only); the queue co-locates jobs only on nodes that share (or with dra_device_class)",
    )
    node_sharing: dict[NodeName, Sharing] = Field(
        default_factory=dict,
        description="per fleet node, how its GPUs are shared where it differs from `sharing` (the device plugin's "
        "per-node config, label nvidia.com/device-plugin.config)",
    )
    shared_resource: LabelKey | None = Field(
        default=None,
        description="the resource a shared GPU is offered as on a node that shares; unset: nvidia.com/gpu.shared "
        "(NVIDIA's device plugin with renameByDefault); never nvidia.com/gpu, under which a job planned to run alone "
        "would silently share",
    )
    dra_device_class: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="Dynamic Resource Allocation (resource.k8s.io/v1, Kubernetes 1.34+): the DeviceClass GPUs are "
        "claimed from (NVIDIA's DRA driver: gpu.nvidia.com); set, every pod claims the very devices the queue chose "
        "through a ResourceClaim, and jobs that share a GPU share one claim; unset: the device plugin picks devices",
    )
    dra_driver: str = Field(
        default="gpu.nvidia.com",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$",
        description="the DRA driver whose device attributes (index, uuid) the claims' selectors read",
    )
    credentials_secret: str | None = Field(
        default="drape-s3",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="the Secret every job pod takes its environment from (envFrom): the object store's and MLflow's "
        "credentials, e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN, AWS_ENDPOINT_URL), "
        "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD; never PGPASSWORD (jobs never reach the queue "
        "database); its values never appear in a job's spec; unset: none (pods get credentials another way, e.g. "
        "from their service account's cloud identity)",
    )
    cpu_per_gpu: float = Field(
        default=10.0,
        gt=0,
        le=64,
        description="CPUs a job pod requests per GPU it holds (a shared GPU: the part of it its memory profile holds), "
        "at least 1: a rank's data loader workers and its main process; 8 GPUs × 10 fit an 8×H100 node of 96 vCPUs "
        "(Azure ND H100 v5) as well as one of 192 (AWS p5) or 208 (GCP a3)",
    )
    host_memory_gib_per_gpu: float = Field(
        default=160.0,
        gt=0,
        le=1024,
        description="host memory (GiB) a job pod requests, and is limited to, per GPU it holds, besides /dev/shm: "
        "8 × 160 + 64 GiB of /dev/shm fit the ~1.8-2 TiB of an 8×H100 node",
    )
    shm_gib_per_gpu: float = Field(
        default=8.0,
        gt=0,
        le=256,
        description="size of the memory-backed /dev/shm (GiB) per GPU a job pod holds (data loader workers hand "
        "batches over through it; Kubernetes' default 64 MB kills them); counted in the pod's memory request and limit",
    )
    rendezvous_timeout_seconds: int = Field(
        default=1800,
        ge=60,
        le=86400,
        description="how long a multi-node job's torchrun waits for the other pods to join its c10d rendezvous "
        "(join_timeout, read_timeout): pods on fresh nodes pull a multi-GB image first",
    )

    @model_validator(mode="after")
    def _image_pinned(self) -> KubernetesLauncherConfig:
        _pinned(self.image)
        return self

    @model_validator(mode="after")
    def _sharing_declared(self) -> KubernetesLauncherConfig:
        if self.shared_resource == WHOLE_GPU_RESOURCE:
            raise ValueError(
                f"queue.kubernetes.shared_resource {WHOLE_GPU_RESOURCE!r} is the whole-GPU resource: a job planned to run "
                "alone would silently share its GPU; set renameByDefault in the device plugin's sharing config and "
                "name the renamed resource (nvidia.com/gpu.shared)"
            )
        shared = self.sharing != "none" or set(self.node_sharing.values()) - {"none"}
        if self.kueue_queue and (shared or self.dra_device_class):
            raise ValueError(
                f"queue.kubernetes.kueue_queue {self.kueue_queue!r}: in Kueue mode each job gets whole GPUs (or a MIG "
                "slice) admitted against the ClusterQueue's quota, and drape names no node or device, so GPU sharing "
                "(sharing / node_sharing) and DRA claims (dra_device_class) would be ignored; unset them, or unset "
                "kueue_queue to let drape place"
            )
        if self.shared_resource and self.sharing == "none" and set(self.node_sharing.values()) <= {"none"}:
            raise ValueError(
                f"queue.kubernetes.shared_resource {self.shared_resource!r} is set but no node shares its GPUs: declare "
                "queue.kubernetes.sharing (time-slicing or mps) or node_sharing"
            )
        return self

    def sharing_on(self, node: str) -> Sharing:
        """How `node`'s GPUs are shared: its `node_sharing` entry, else `sharing`."""
        return self.node_sharing.get(node, self.sharing)

    def shares(self, node: str) -> bool:
        """Whether the queue may put two jobs on one GPU of `node`: DRA claims, or a device plugin that shares."""
        return bool(self.dra_device_class) or self.sharing_on(node) != "none"

    def shared_resource_name(self) -> str:
        return self.shared_resource or SHARED_GPU_RESOURCE


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

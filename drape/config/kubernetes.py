"""Config of the Kubernetes engine (`queue.kubernetes`, scheduler/engines/kubernetes/): the Jobs drape
renders, how GPUs are asked for (whole, shared by time-slicing or MPS, or by a DRA device class), and
Kueue beside it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape.config.base import StrictModel
from drape.config.names import DnsLabel, DnsSubdomain, LabelKey, LabelValue, NodeName

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

"""Config of tracking (MLflow), alerts (Slack), metrics (Prometheus) and the GPU queue."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape import REGISTERED_MODEL
from drape.config.base import StrictModel


class TrackingConfig(StrictModel):
    uri: str | None = Field(default=None, description="MLflow URI; default sqlite:///<root>/mlflow.db")
    artifact_root: str | None = None
    experiment: str = "drape"
    registered_model: str = REGISTERED_MODEL


class AlertsConfig(StrictModel):
    slack_webhook_env: str = Field(
        default="DRAPE_SLACK_WEBHOOK_URL",
        description="name of the environment variable holding the webhook; never the URL itself",
    )
    slack_webhook_secret_block: str | None = Field(
        default=None, description="name of a Prefect Secret block holding the webhook (flows only); wins over the variable"
    )
    notify_on_pass: bool = False

    @model_validator(mode="after")
    def _no_inline_secret(self) -> AlertsConfig:
        if "://" in self.slack_webhook_env:
            raise ValueError("slack_webhook_env names an environment variable, not the webhook URL")
        return self


class KubernetesLauncherConfig(StrictModel):
    namespace: str = "drape"
    image: str = "ghcr.io/drape-ai/drape:latest"
    service_account: str | None = "drape-job"
    product_label: str = Field(default="nvidia.com/gpu.product", description="node label that names the GPU product")
    products: dict[str, str] = Field(
        default_factory=lambda: {
            "H100-80GB": "NVIDIA-H100-80GB-HBM3",
            "L40S-48GB": "NVIDIA-L40S",
            "A100-40GB": "NVIDIA-A100-SXM4-40GB",
        },
        description="fleet GPU model → node label value",
    )
    tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )
    volume_claims: dict[str, str] = Field(
        default_factory=dict,
        description="a job path (its config's live root or shard cache) → the PersistentVolumeClaim mounted there; "
        "a path not named here is the node's own directory (hostPath)",
    )
    request_timeout_seconds: float = Field(default=30.0, gt=0, description="the longest wait for one Kubernetes API call")
    training_operator: bool = Field(default=False, description="multi-node jobs as Kubeflow PyTorchJobs instead of indexed Jobs")


class QueueConfig(StrictModel):
    """The GPU queue (scheduler/): where jobs wait, how GPUs are seen, how jobs start."""

    enabled: bool = Field(default=False, description="train jobs go through the queue")
    url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<root>/queue.db (postgresql://… at scale)"
    )
    fleet: Literal["local", "static", "prometheus"] = "local"
    inventory: str | None = Field(default=None, description="fleet YAML for 'static' (and the ledger's inventory)")
    prometheus_url: str | None = Field(default=None, description="Prometheus with the DCGM exporter's series")
    launcher: Literal["local", "kubernetes", "prefect"] = "local"
    policy: Literal["drape", "fifo-exclusive"] = "drape"
    aging_per_hour: float = Field(default=1.0, ge=0)
    max_jobs_per_gpu: int = Field(default=4, gt=0)
    headroom: float = Field(default=0.10, ge=0, description="added to measured p95 peak memory")
    lease_seconds: float = Field(
        default=60.0, gt=0, description="a dispatcher silent this long loses its jobs: adopted by another, or requeued"
    )
    max_attempts: int = Field(
        default=1, ge=1, le=20, description="runs of a job that fails before it stays failed (stage jobs resume: retry them)"
    )
    poll_seconds: float = Field(default=1.0, gt=0)
    cpu_slot_gib: float = Field(default=16.0, gt=0, description="memory of the one slot a machine without GPUs offers")
    dispatch_in_process: bool = Field(default=True, description="the submitting task dispatches too (no separate dispatcher)")
    kubernetes: KubernetesLauncherConfig = KubernetesLauncherConfig()


class MetricsConfig(StrictModel):
    pushgateway_url: str | None = Field(default=None, description="Prometheus Pushgateway for flow runs; unset: no push")
    job: str = "drape"

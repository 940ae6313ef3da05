"""Typed pipeline configuration, validated once at the edge.

A YAML file fills `PipelineConfig`; one pydantic model per component, nested. Unknown keys
are errors (a typo must not silently fall back to a default), and every failure names the
file, the field and the reason, e.g. ``configs/demo.yaml: train.stages.texture.steps: Input
should be greater than 0 (got -5)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from drape import ARTIFACT_KINDS, REGISTERED_MODEL, STAGES, ArtifactKind, Outcome, Stage, layout


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, field and reason."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PathsConfig(_Strict):
    root: str = ".drape"

    @property
    def root_path(self) -> Path:
        return Path(self.root)


class StorageConfig(_Strict):
    """Where artifacts go. Credentials never live here: S3 uses the standard AWS chain."""

    object_store_url: str | None = Field(default=None, description="fsspec URL; default file://<root>/objects")
    endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint (MinIO, Ceph, a test server)")
    region: str | None = None
    multipart_chunk_bytes: int = Field(default=64 * 2**20, ge=5 * 2**20, description="S3 multipart part size")
    retry_attempts: int = Field(default=8, ge=1, description="S3 attempts per request (500, 503 SlowDown, resets, timeouts)")
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    read_timeout_seconds: float = Field(default=60.0, gt=0)
    prices_per_gb_month: dict[str, float] = Field(
        default_factory=lambda: {
            "live": 0.08,
            "STANDARD": 0.023,
            "STANDARD_IA": 0.0125,
            "GLACIER_IR": 0.004,
            "GLACIER": 0.0036,
            "DEEP_ARCHIVE": 0.00099,
        },
        description="USD per GB-month by storage class ('live': the nodes' disks), for the storage report",
    )

    @model_validator(mode="after")
    def _no_credentials_in_urls(self) -> StorageConfig:
        for name in ("object_store_url", "endpoint_url"):
            value = getattr(self, name) or ""
            if "@" in value.split("/")[2 if "://" in value else 0]:
                raise ValueError(
                    f"{name} must not carry credentials; S3 reads them from the AWS chain (environment, profile, role)"
                )
        return self


class TrackingConfig(_Strict):
    uri: str | None = Field(default=None, description="MLflow URI; default sqlite:///<root>/mlflow.db")
    artifact_root: str | None = None
    experiment: str = "drape"
    registered_model: str = REGISTERED_MODEL


class CacheConfig(_Strict):
    """The node-local shard cache that pre-staging fills (an NVMe path in production)."""

    dir: str | None = Field(default=None, description="default <root>/live/shards")
    budget_bytes: int = Field(default=64 * 2**30, ge=2**20, description="most bytes the cache may hold")
    concurrency: int = Field(default=4, gt=0, description="shard downloads in flight while pre-staging")
    read_ahead: int = Field(default=2, ge=0, description="shards fetched ahead of the one being read")


class DataConfig(_Strict):
    name: str = "synth-tryon"
    version: str = "v1"
    resolution: int = Field(default=64, ge=32, le=2048)
    num_identities: int = Field(default=24, gt=0)
    num_garments: int = Field(default=48, gt=0)
    samples_per_stage: dict[Stage, int] = Field(default_factory=lambda: {stage: 96 for stage in STAGES})
    control_samples: int = Field(default=16, gt=0)
    shard_max_samples: int = Field(default=64, gt=0)
    shard_max_bytes: int = Field(default=512 * 2**20, ge=2**20, description="a shard closes at this size or max samples")
    cache: CacheConfig = Field(default_factory=lambda: CacheConfig())

    @model_validator(mode="after")
    def _every_stage_has_samples(self) -> DataConfig:
        missing = [stage for stage in STAGES if self.samples_per_stage.get(stage, 0) <= 0]
        if missing:
            raise ValueError(f"samples_per_stage needs a positive count for {missing}")
        return self


class ModelConfig(_Strict):
    patch_size: int = Field(default=4, gt=0)
    num_layers: int = Field(default=2, gt=0)
    num_attention_heads: int = Field(default=4, gt=0)
    attention_head_dim: int = Field(default=32, gt=0)
    garment_patch_size: int = Field(default=8, gt=0)
    pose_channels: int = Field(default=3, gt=0)


class DiffusionConfig(_Strict):
    num_train_timesteps: int = Field(default=1000, gt=0)
    prediction_type: Literal["sample", "epsilon", "v_prediction"] = "sample"
    beta_schedule: Literal["linear", "scaled_linear", "squaredcos_cap_v2"] = "squaredcos_cap_v2"
    sampling_steps: int = Field(default=10, gt=0)


class StageTrainConfig(_Strict):
    steps: int = Field(gt=0, description="steps of this stage in a full run")
    finetune_steps: int = Field(default=550, gt=0, description="steps of a fine-tune pass")
    trainable: list[str] = Field(min_length=1, description="glob patterns over parameter names")
    lr: float | None = Field(default=None, gt=0)


class EmaConfig(_Strict):
    enabled: bool = False
    decay: float = Field(default=0.999, gt=0, lt=1)


class TrainConfig(_Strict):
    batch_size: int = Field(default=16, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    ema: EmaConfig = EmaConfig()
    checkpoint_every: int = Field(default=50, gt=0)
    log_every: int = Field(default=10, gt=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16"] = "fp32"
    parallelism: Literal["ddp", "fsdp"] = Field(default="ddp", description="under torchrun: DDP, or FSDP2 fully_shard")
    gradient_checkpointing: bool = False
    async_checkpoint: bool = Field(default=True, description="under torchrun: DCP saves in the background")
    data_partitions: int | None = Field(
        default=None,
        gt=0,
        description=(
            "disjoint shard groups the global batch is drawn from (drape/data/partition.py); default the world size. "
            "Fix it, a multiple of every world size you use, to train identically on any number of ranks"
        ),
    )
    stages: dict[Stage, StageTrainConfig]

    @model_validator(mode="after")
    def _all_stages_configured(self) -> TrainConfig:
        missing = [stage for stage in STAGES if stage not in self.stages]
        if missing:
            raise ValueError(f"stages must configure every stage; missing {missing}")
        return self


Threshold = float | dict[Stage, float] | None  # one value for every stage, or one per stage


def _threshold_for(threshold: Threshold, stage: str) -> float | None:
    return threshold.get(stage) if isinstance(threshold, dict) else threshold


class IdentityGateConfig(_Strict):
    embedder: Literal["pixel", "onnx"] = "pixel"
    onnx_model_path: str | None = None
    min_similarity: Threshold = None
    max_drop: float | None = Field(default=0.05, ge=0, description="change threshold vs the stage baseline's mean")

    @model_validator(mode="after")
    def _onnx_needs_path(self) -> IdentityGateConfig:
        if self.embedder == "onnx" and not self.onnx_model_path:
            raise ValueError("embedder 'onnx' needs onnx_model_path")
        return self


class TextureGateConfig(_Strict):
    min_fidelity: Threshold = None
    max_shift_pixels: int = Field(default=2, ge=0)
    mirror_penalty: float = Field(
        default=2.0, ge=0, description=("taken off per unit of negative handedness: the mark read mirrored (0: off)")
    )
    sharpness_floor: float = Field(
        default=0.2, ge=0, le=1, description=("share of the mark's gradient energy below which the score scales down (0: off)")
    )
    max_drop: float | None = Field(default=0.05, ge=0, description="change threshold vs the stage baseline's mean")


class CoherenceGateConfig(_Strict):
    min_score: Threshold = Field(default=None, description="vs the ground truth (a stage's first run, no baseline)")
    min_score_vs_baseline: Threshold = Field(
        default=None,
        description=(
            "vs the baseline's outputs: a successor of a good model scores higher against them than any model against "
            "the ground truth, so this threshold can be stricter; default min_score"
        ),
    )


class GatesConfig(_Strict):
    identity: IdentityGateConfig = IdentityGateConfig()
    texture: TextureGateConfig = TextureGateConfig()
    coherence: CoherenceGateConfig = CoherenceGateConfig()
    sample_seed: int = 1234
    grid_samples: int = Field(default=8, gt=0)

    def thresholds(self, stage: str, *, vs_baseline: bool = False) -> dict[str, float | None]:
        """Each check's threshold at `stage` (None: not configured, which blocks promotion); coherence
        measured against a baseline's outputs (`vs_baseline`) uses `min_score_vs_baseline` when set."""
        coherence = _threshold_for(self.coherence.min_score, stage)
        if vs_baseline and self.coherence.min_score_vs_baseline is not None:
            coherence = _threshold_for(self.coherence.min_score_vs_baseline, stage)
        return {
            "identity": _threshold_for(self.identity.min_similarity, stage),
            "texture": _threshold_for(self.texture.min_fidelity, stage),
            "coherence": coherence,
        }


STORAGE_CLASSES = ("STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE")


LiveUntil = Literal["stage_end", "run_end", "baseline"]
# the pipeline reads a baseline's checkpoint (the next stage starts from it) and its outputs (the
# coherence reference) from live storage, so for these kinds a baseline stays live while it is one
BASELINE_LIVE_KINDS = (ArtifactKind.CHECKPOINT, ArtifactKind.VALIDATION_OUTPUT)


class OutcomeRule(_Strict):
    """Overrides for one outcome of one kind; unset fields fall back to the kind's rule."""

    lifetime_days: int | None = Field(default=None, gt=0)
    storage_class: Literal[STORAGE_CLASSES] | None = None  # type: ignore[valid-type]
    live_until: LiveUntil | None = None


class RetentionRule(_Strict):
    live_until: LiveUntil = Field(
        default="stage_end",
        description=(
            "how long the live copy stays once its archived copy is verified: 'stage_end' (freed by the stage's "
            "archive step), 'run_end' (freed when the run ends: passed, gate failed or aborted), 'baseline' (a "
            "baseline's copy stays in live baselines/<stage>/ until superseded; other outcomes: stage_end)"
        ),
    )
    lifetime_days: int | None = Field(default=None, gt=0, description="None: keep forever")
    storage_class: Literal[STORAGE_CLASSES] = "STANDARD"  # type: ignore[valid-type]
    outcomes: dict[Outcome, OutcomeRule] = Field(default_factory=dict)


class RetentionConfig(_Strict):
    """Object-store lifetimes and classes, and how long the live copy stays, per artifact kind and outcome.

    How an artifact's rule is resolved from these (`drape.storage.retention.resolve` and
    `live_until`): a current baseline never expires; a superseded one lives `baseline_grace_days`
    from when it was superseded; failed candidates and aborted runs live `failed_lifetime_days`; a
    per-outcome override of the kind's rule wins over all of these except the baseline's.
    """

    rules: dict[str, RetentionRule] = Field(default_factory=lambda: {kind: RetentionRule() for kind in ARTIFACT_KINDS})
    failed_lifetime_days: int = Field(default=7, gt=0)
    baseline_grace_days: int = Field(default=30, gt=0, description="how long a superseded baseline stays archived")
    live_budget_bytes: int | None = Field(default=None, gt=0, description="live storage budget; over it, an alert fires")

    @model_validator(mode="after")
    def _known_kinds(self) -> RetentionConfig:
        unknown = sorted(set(self.rules) - set(ARTIFACT_KINDS))
        if unknown:
            raise ValueError(f"unknown artifact kinds {unknown}; expected some of {list(ARTIFACT_KINDS)}")
        for kind in BASELINE_LIVE_KINDS:
            override = self.rules.get(kind, RetentionRule()).outcomes.get(Outcome.BASELINE)
            if override is not None and override.live_until not in (None, "baseline"):
                raise ValueError(
                    f"rules.{kind}.outcomes.baseline.live_until must be 'baseline': the pipeline reads the "
                    f"current baseline's {kind} from live storage"
                )
        return self


class AlertsConfig(_Strict):
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


class KubernetesLauncherConfig(_Strict):
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
    shard_cache_host_path: str = "/mnt/nvme/drape-shards"
    training_operator: bool = Field(default=False, description="multi-node jobs as Kubeflow PyTorchJobs instead of indexed Jobs")


class QueueConfig(_Strict):
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
    lease_seconds: float = Field(default=60.0, gt=0, description="a dispatcher silent this long loses its jobs")
    poll_seconds: float = Field(default=1.0, gt=0)
    cpu_slot_gib: float = Field(default=16.0, gt=0, description="memory of the one slot a machine without GPUs offers")
    dispatch_in_process: bool = Field(default=True, description="the submitting task dispatches too (no separate dispatcher)")
    kubernetes: KubernetesLauncherConfig = KubernetesLauncherConfig()


class MetricsConfig(_Strict):
    pushgateway_url: str | None = Field(default=None, description="Prometheus Pushgateway for flow runs; unset: no push")
    job: str = "drape"


class PipelineConfig(_Strict):
    name: str = "demo"
    seed: int = 0
    paths: PathsConfig = PathsConfig()
    storage: StorageConfig = StorageConfig()
    tracking: TrackingConfig = TrackingConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    diffusion: DiffusionConfig = DiffusionConfig()
    train: TrainConfig
    gates: GatesConfig = GatesConfig()
    retention: RetentionConfig = RetentionConfig()
    alerts: AlertsConfig = AlertsConfig()
    metrics: MetricsConfig = MetricsConfig()
    queue: QueueConfig = QueueConfig()

    @model_validator(mode="after")
    def _patch_divides_resolution(self) -> PipelineConfig:
        for field, patch in (("patch_size", self.model.patch_size), ("garment_patch_size", self.model.garment_patch_size)):
            if self.data.resolution % patch:
                raise ValueError(f"model.{field} {patch} must divide data.resolution {self.data.resolution}")
        return self

    # where things live when the config leaves them unset: drape.layout decides
    @property
    def object_store_url(self) -> str:
        return self.storage.object_store_url or layout.default_object_store_url(self.paths.root)

    @property
    def cache_dir(self) -> Path:
        return layout.shard_cache_root(self)

    @property
    def queue_url(self) -> str:
        return self.queue.url or layout.default_queue_url(self.paths.root)

    @property
    def tracking_uri(self) -> str:
        return self.tracking.uri or layout.default_tracking_uri(self.paths.root)

    @property
    def artifact_root(self) -> str:
        return self.tracking.artifact_root or layout.default_artifact_root(self.paths.root)


def _format_errors(source: str, error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "<top level>"
        got = f" (got {item['input']!r})" if item["type"] not in ("missing",) and not isinstance(item["input"], dict) else ""
        lines.append(f"{source}: {field}: {item['msg']}{got}")
    return "\n".join(lines)


def parse_config(data: dict, source: str = "<config>") -> PipelineConfig:
    """Validate a mapping into a PipelineConfig; errors name `source`, the field and the reason."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_errors(source, error)) from None


def load_config(path: str | Path, overrides: dict | None = None) -> PipelineConfig:
    """Load and validate a YAML pipeline config; `overrides` are deep-merged on top."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if overrides:
        data = deep_merge(data, overrides)
    return parse_config(data, str(path))


def deep_merge(base: dict, overrides: dict) -> dict:
    """A new dict: `overrides` merged into `base`, recursing into nested mappings."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def default_config_path() -> Path:
    """The embedded demo config shipped in the repository's configs/ folder."""
    return Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"

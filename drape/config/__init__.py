"""Typed pipeline configuration, validated once at the edge.

A YAML file fills `PipelineConfig`; one pydantic model per component, nested, each subsystem's
models in a module of their own (`data`, `training`, `gates`, `storage`, `ops`, `kubernetes`,
`slurm`). Unknown keys are errors (a typo must not silently fall back to a default), and every
failure names the file, the field and the reason, e.g. ``configs/demo.yaml: train.stages.texture.steps: Input
should be greater than 0 (got -5)``.

A file may name others under `extends:` (drape.config.reading.extends): the production configs are a base,
a model recipe and a cluster. The site values a config declares under `site:` (paths, endpoints,
secret, image and node names) come from the site file $DRAPE_SITE names (drape.config.reading.site), never
from a tracked config.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from pydantic import Field, ValidationError, model_validator

from drape import layout
from drape.config.base import ConfigError, StrictModel, mounted
from drape.config.cost import PLANS, CostConfig, GpuPrice
from drape.config.data import CacheConfig, DataConfig, LoaderConfig
from drape.config.eval import EvalConfig, FidGateConfig
from drape.config.gates import CoherenceGateConfig, GatesConfig, IdentityGateConfig, TextureGateConfig, Threshold
from drape.config.inference import InferenceConfig, QualityConfig, VariantSpec
from drape.config.ops import (
    AlertsConfig,
    KubernetesLauncherConfig,
    MetricsConfig,
    OrchestrationConfig,
    QueueConfig,
    TrackingConfig,
)
from drape.config.reading.extends import deep_merge, read_config_data
from drape.config.reading.site import EXAMPLE_SITE, SITE_ENV, SITE_FIELDS, apply_site
from drape.config.shoppers import ShopperGateConfig, ShoppersConfig
from drape.config.slurm import SlurmLauncherConfig
from drape.config.storage import (
    BASELINE_LIVE_KINDS,
    STORAGE_CLASSES,
    LiveUntil,
    OutcomeRule,
    RetentionConfig,
    RetentionRule,
    StorageConfig,
)
from drape.config.training import (
    UNET_KINDS,
    ConditionName,
    DenoiserConfig,
    DiffusionConfig,
    EmaConfig,
    LoraConfig,
    ModelConfig,
    StageTrainConfig,
    TrainConfig,
)
from drape.secrets import check_no_credentials, redact

__all__ = [
    "EvalConfig",
    "FidGateConfig",
    "BASELINE_LIVE_KINDS",
    "STORAGE_CLASSES",
    "AlertsConfig",
    "CacheConfig",
    "CoherenceGateConfig",
    "CostConfig",
    "ConfigError",
    "DataConfig",
    "DenoiserConfig",
    "DiffusionConfig",
    "EmaConfig",
    "GatesConfig",
    "GpuPrice",
    "InferenceConfig",
    "IdentityGateConfig",
    "KubernetesLauncherConfig",
    "SlurmLauncherConfig",
    "LiveUntil",
    "LoaderConfig",
    "LoraConfig",
    "MetricsConfig",
    "ModelConfig",
    "OrchestrationConfig",
    "OutcomeRule",
    "PLANS",
    "PathsConfig",
    "PipelineConfig",
    "QualityConfig",
    "QueueConfig",
    "RetentionConfig",
    "RetentionRule",
    "ShopperGateConfig",
    "ShoppersConfig",
    "StageTrainConfig",
    "StorageConfig",
    "TextureGateConfig",
    "Threshold",
    "TrackingConfig",
    "TrainConfig",
    "VariantSpec",
    "EXAMPLE_SITE",
    "SITE_ENV",
    "SITE_FIELDS",
    "deep_merge",
    "default_config_path",
    "load_config",
    "read_config_data",
    "parse_config",
]


class PathsConfig(StrictModel):
    root: str = Field(
        default=".drape",
        description="the live storage root: checkpoints, baselines, the queue's and MLflow's local files and (by "
        "default) the shard cache and file:// object store; a node-local NVMe in production (a site value)",
        json_schema_extra=mounted("live"),
    )
    shared: bool = Field(
        default=False,
        description="the flow and the queue's trainers see one paths.root (a ReadWriteMany volume every pod mounts): "
        "checkpoints and results are read in place. Off (the default), nodes share nothing but the object store, "
        "and every hand-off goes through it (docs/topology.md)",
    )

    @property
    def root_path(self) -> Path:
        return Path(self.root)


class PipelineConfig(StrictModel):
    name: str = Field(default="demo", description="the config's name: in run names, job shapes and reports")
    seed: int = Field(default=0, description="the run's seed: data generation, initial weights, the steps' random draws")
    paths: PathsConfig = Field(default=PathsConfig(), description="where live storage is on the flow's and trainers' disks")
    storage: StorageConfig = Field(default=StorageConfig(), description="the object store every artifact goes to")
    tracking: TrackingConfig = Field(default=TrackingConfig(), description="MLflow: runs, params, metrics and the registry")
    orchestration: OrchestrationConfig = Field(
        default=OrchestrationConfig(), description="Prefect: the API flow runs report to, within one wait budget"
    )
    data: DataConfig = Field(default=DataConfig(), description="the dataset, its shards, the node's cache and the loader")
    model: ModelConfig = Field(default=ModelConfig(), description="the try-on model trained (a built-in kind or a class)")
    diffusion: DiffusionConfig = Field(default=DiffusionConfig(), description="the diffusion objective and the sampler")
    train: TrainConfig = Field(description="the training loop and each stage's steps and trainable parameters")
    gates: GatesConfig = Field(default=GatesConfig(), description="the validation gates a stage's checkpoint must pass")
    retention: RetentionConfig = Field(default=RetentionConfig(), description="archive lifetimes and live-storage rules")
    alerts: AlertsConfig = Field(default=AlertsConfig(), description="Slack alerts on gate failures (and passes)")
    metrics: MetricsConfig = Field(default=MetricsConfig(), description="Prometheus series pushed by flow runs")
    queue: QueueConfig = Field(default=QueueConfig(), description="the GPU queue stage jobs go through, and its engine")
    inference: InferenceConfig = Field(default=InferenceConfig(), description="the inference measuring stick (drape bench)")
    shoppers: ShoppersConfig = Field(default=ShoppersConfig(), description="opt-in per-shopper personalization")
    cost: CostConfig = Field(default=CostConfig(), description="prices and plans for the cost reports")
    eval: EvalConfig = Field(default=EvalConfig(), description="`drape eval` and the gates' optional FID/KID check")

    @property
    def trains_apart(self) -> bool:
        """Stage jobs run through the queue on nodes that share nothing with the flow's but the object store."""
        return self.queue.enabled and not self.paths.shared

    @model_validator(mode="after")
    def _no_credentials_in_urls(self) -> PipelineConfig:
        aws = "S3 reads them from the AWS chain (environment, profile, role)"
        libpq = "PostgreSQL reads the password from PGPASSWORD or ~/.pgpass (a Kubernetes Secret in the manifests)"
        proxy = "put authentication in front of it (a proxy) or give the job the standard variables"
        for name, url, instead in (
            ("storage.object_store_url", self.storage.object_store_url, aws),
            ("storage.endpoint_url", self.storage.endpoint_url, aws),
            ("queue.url", self.queue.url, libpq),
            ("queue.prometheus_url", self.queue.prometheus_url, proxy),
            ("tracking.uri", self.tracking.uri, f"MLflow reads MLFLOW_TRACKING_USERNAME/PASSWORD; {libpq}"),
            ("tracking.artifact_root", self.tracking.artifact_root, aws),
            ("metrics.pushgateway_url", self.metrics.pushgateway_url, proxy),
            ("shoppers.mlflow_backend_store_uri", self.shoppers.mlflow_backend_store_uri, libpq),
        ):
            check_no_credentials(name, url, instead)
        for name, value in _strings(self.model_dump(mode="json")):  # every other field, present and future
            if "://" in value:
                check_no_credentials(name, value, "credentials come from the environment, never from a config")
        return self

    @model_validator(mode="after")
    def _patch_divides_resolution(self) -> PipelineConfig:
        model, data = self.model, self.data
        for side, length in (("height", data.height), ("width", data.width)):
            if length % model.downsample:
                raise ValueError(
                    f"data.resolution {side} {length} must be a multiple of the VAE's downsampling {model.downsample}"
                )
            if model.kind in UNET_KINDS and model.class_ is None:
                continue
            space = length // model.downsample
            where = (
                f"the latent {side} {space} (data.resolution {side} {length} / VAE downsampling {model.downsample})"
                if model.latent
                else f"data.resolution {side} {length}"
            )
            for field, patch in (("patch_size", model.patch_size), ("garment_patch_size", model.garment_patch_size)):
                if space % patch:
                    raise ValueError(f"model.{field} {patch} must divide {where}")
        return self

    @model_validator(mode="after")
    def _conditions_the_model_reads(self) -> PipelineConfig:
        model = self.model
        read = set(get_args(ConditionName)) - ({"pose"} if model.kind == "catvton" else set())
        named = [("train.cfg_dropout", name) for name in self.train.cfg_dropout]
        named += [("diffusion.guidance_conditions", name) for name in self.diffusion.guidance_conditions]
        for field, name in named:
            if model.class_ is None and name not in read:
                reads = ", ".join(sorted(read))
                raise ValueError(f"{field}: model.kind {model.kind} is not conditioned on {name} (it reads {reads})")
        return self

    @model_validator(mode="after")
    def _training_choices_fit(self) -> PipelineConfig:
        train = self.train
        if train.loss_weighting == "min_snr" and self.diffusion.objective != "ddpm":
            raise ValueError("train.loss_weighting min_snr weighs DDPM timesteps by SNR; diffusion.objective is flow_matching")
        if train.optimizer == "adamw8bit" and train.device == "cpu":
            raise ValueError("train.optimizer adamw8bit is bitsandbytes' CUDA optimizer; train.device is cpu (use adamw)")
        return self

    @model_validator(mode="after")
    def _latents_need_a_fixed_vae(self) -> PipelineConfig:
        if self.data.latents_of is None:
            return self
        if self.model.class_ is None and not self.model.latent:
            raise ValueError(
                f"data.latents_of: model.kind {self.model.kind} works in pixel space; a latent dataset needs a latent model"
            )
        if self.model.class_ is None and self.model.vae.path is None:
            raise ValueError(
                "data.latents_of: latents are encoded once, so the VAE must be fixed: set model.vae.path "
                "(`drape model fit-vae` makes a stand-in)"
            )
        if self.data.latents_of == self.data.version:
            raise ValueError(
                f"data.latents_of names the version itself ({self.data.version!r}); it names the pixel version encoded"
            )
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


def _strings(value: object, at: str = "") -> list[tuple[str, str]]:
    """Every string in a dumped config with its dotted field name."""
    if isinstance(value, str):
        return [(at, value)]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _strings(item, f"{at}.{key}" if at else str(key))]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _strings(item, f"{at}[{index}]")]
    return []


def _format_errors(source: str, error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "<top level>"
        shown = item["type"] == "missing" or isinstance(item["input"], dict) or f"got {item['input']!r}" in item["msg"]
        got = "" if shown or item["type"] == "value_error" and "credentials" in item["msg"] else f" (got {item['input']!r})"
        lines.append(redact(f"{source}: {field}: {item['msg']}{got}"))
    return "\n".join(lines)


def parse_config(data: dict, source: str = "<config>") -> PipelineConfig:
    """Validate a mapping into a PipelineConfig; errors name `source`, the field and the reason."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_errors(source, error)) from None


def load_config(path: str | Path, overrides: dict | None = None, *, site: str | Path | None = None) -> PipelineConfig:
    """Load and validate a YAML pipeline config: the files its `extends:` names merged under it
    (drape.config.reading.extends), the site values it declares taken from the site file (`site`, else
    $DRAPE_SITE: drape.config.reading.site), then `overrides` deep-merged on top."""
    data = read_config_data(path)
    data, source = apply_site(data, str(path), site)
    if overrides:
        data = deep_merge(data, overrides)
    try:
        return parse_config(data, source)
    except ConfigError as error:
        lacking = [name for name, field in PipelineConfig.model_fields.items() if field.is_required() and name not in data]
        if not lacking:
            raise
        raise ConfigError(
            f"{error}\n{source}: no {', '.join(lacking)} section in it or the files it extends: a part of a config "
            "(an overlay such as configs/queue/gang-waits.yaml) runs only named under `extends:` after a whole config "
            "(configs/h100.yaml, configs/slurm.yaml), in a config of your own"
        ) from None


def default_config_path() -> Path:
    """The embedded demo config shipped in the repository's configs/ folder."""
    return Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"

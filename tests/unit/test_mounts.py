"""Every path a job reads is mounted in its pod (drape/mounts.py): each config field that can name a
local path declares how a job uses it, and a stage job's pod, rendered as the launcher creates it,
mounts every such field's folder at the same path (weights read-only), whatever the field."""

from __future__ import annotations

import json
import typing

import pytest
from kubernetes import client
from pydantic import BaseModel

from drape.config import EXAMPLE_SITE, PipelineConfig, load_config, parse_config
from drape.mounts import configured, declared, job_paths, local_path, model_paths
from scheduler.engines.kubernetes.objects import build_job
from scheduler.jobs.training import train_job_spec
from scheduler.policy import GpuState
from tests.unit.test_config import REPO

# Fields typed as text that name no local file, and why; any other text field must declare a mount
# kind (drape.config.base.mounted), so a field added later is either mounted or said not to be a path.
NOT_PATHS = {
    **dict.fromkeys(["name", "data.name", "data.version", "data.latents_of", "tracking.experiment"], "a name"),
    **dict.fromkeys(["tracking.registered_model", "metrics.job", "inference.variants.name", "inference.control.name"], "a name"),
    **dict.fromkeys(["storage.endpoint_url", "metrics.pushgateway_url", "queue.prometheus_url"], "a network endpoint"),
    "queue.url": "the queue's database: the dispatcher's and the flow's, never a job's",
    "storage.region": "an S3 region",
    "storage.prices_per_gb_month": "storage classes to prices",
    "data.synthetic.samples_per_stage": "stages to counts",
    "model.class": "an import path ('package.module:Name'), inside the image",
    "model.options": "an outside model's keyword arguments: its weights belong under a declared folder",
    "model.denoiser.config": "constructor arguments",
    "train.stages.trainable": "parameter-name patterns",
    "shoppers.trainable": "parameter-name patterns",
    "alerts.slack_webhook_env": "an environment variable's name",
    "alerts.slack_webhook_secret_block": "a Prefect block's name",
    "queue.node_commands": "the local launcher's command prefixes (no pod)",
    "queue.job_environment": "environment variable names",
    **{f"queue.kubernetes.{k}": "Kubernetes object, label or resource names" for k in ("namespace", "image", "service_account")},
    **{
        f"queue.kubernetes.{k}": "Kubernetes object, label or resource names"
        for k in ("product_label", "products", "tolerations")
    },
    **{
        f"queue.kubernetes.{k}": "Kubernetes object, label or resource names" for k in ("node_label", "kueue_queue", "dra_driver")
    },
    **{f"queue.kubernetes.{k}": "Kubernetes object, label or resource names" for k in ("shared_resource", "dra_device_class")},
    "queue.kubernetes.credentials_secret": "a Secret's name",
    "queue.kubernetes.volume_claims": "mounted paths (job_paths) to claims",
    **{
        f"queue.slurm.{k}": "Slurm's names and the login node's shell lines"
        for k in ("partition", "account", "gres_types", "setup")
    },
    "queue.slurm.gpu_memory_gib": "gres type names to GiB",
    "queue.slurm.accounting": "how sacct reads",
}


def _text_fields(model: type[BaseModel], prefix: str = ""):
    """(dotted field, its FieldInfo) of every leaf field whose type holds text (str, Path), nested models walked."""
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        nested = [
            a for a in (field.annotation, *_arguments(field.annotation)) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if nested:
            yield from _text_fields(nested[0], f"{key}.")
        elif "Literal" not in str(field.annotation) and any(word in str(field.annotation) for word in ("str", "Path")):
            yield key, field


def _arguments(annotation) -> list:
    found = []
    for argument in typing.get_args(annotation):
        found += [argument, *_arguments(argument)]
    return found


def test_every_text_field_says_whether_a_job_reads_it_from_disk():
    """A field that can hold a path either declares its mount kind or is listed here as naming no file."""
    undeclared = [key for key, field in _text_fields(PipelineConfig) if not field.json_schema_extra and key not in NOT_PATHS]
    assert not undeclared, f"declare json_schema_extra=mounted(kind) on these (or list them in NOT_PATHS): {undeclared}"
    both = [key for key, field in _text_fields(PipelineConfig) if field.json_schema_extra and key in NOT_PATHS]
    assert not both, f"declared as mounted and listed as naming no file: {both}"
    known = {key for key, _ in _text_fields(PipelineConfig)}
    assert set(NOT_PATHS) <= known, f"NOT_PATHS names fields that are gone: {sorted(set(NOT_PATHS) - known)}"


def test_the_declarations_cover_the_weights_and_folders_jobs_read():
    kinds = {field: kind for field, kind, _ in declared(PipelineConfig)}
    assert {kinds[f] for f in ("model.denoiser.path", "model.vae.path", "gates.identity.model_dir")} == {"model"}
    assert {kinds[f] for f in ("gates.identity.onnx_model_path", "eval.inception_path", "eval.lpips_backbone_path")} == {"file"}
    assert {kinds[f] for f in ("paths.root", "data.cache.dir", "data.loader.handoff_dir")} == {"live"}
    assert all(why for _, kind, why in declared(PipelineConfig) if kind == "none")  # 'none' always says why


def _every_path_set(tmp_path) -> tuple[PipelineConfig, dict[str, tuple[str, bool]]]:
    """configs/h100.yaml with every declared field set to a folder of its own; and field → (the
    folder its pod must mount, whether read-only)."""
    data = load_config(REPO / "configs" / "h100.yaml", site=EXAMPLE_SITE).model_dump(mode="json", by_alias=True)
    expected = {}
    values = {"store": "file:///site/{}", "checkpoint": "/site/{}/checkpoint", "file": "/site/{}/weights.bin"}
    for field, kind, _ in declared(PipelineConfig):
        if kind == "none":
            continue
        slug = field.replace(".", "-").replace("_", "-")
        section = data
        *parents, leaf = field.split(".")
        for key in parents:
            section = section[key]
        section[leaf] = values.get(kind, "/site/{}").format(slug)
        expected[field] = (f"/site/{slug}", kind in ("model", "file"))
    data["queue"]["url"] = f"sqlite:///{tmp_path}/queue.db"  # the queue's estimate reads its measured profiles here
    return parse_config(data, "h100.yaml with every path set"), expected


@pytest.fixture(autouse=True)
def _estimated(monkeypatch):
    """The queue's memory estimate of an 899 M-parameter model takes most of a minute; these tests read mounts, not sizes."""
    from scheduler.jobs import profiles

    fixed = profiles.Profile("h100/texture/8gpu", 60.0, 3600.0, None, None, 0, 60.0, 3600.0, "estimate")
    monkeypatch.setattr(profiles, "profile", lambda *args, **kwargs: fixed)


def _stage_pod(config: PipelineConfig) -> dict:
    spec = train_job_spec(config, stage="texture", mode="full", run_id="r1", command=["python", "-m", "drape.train"])
    row = {"id": "stage-training-r1", "kind": "stage-training", "stage": "texture", "attempts": 1, "gpus": spec.gpus}
    row |= {"command": json.dumps(spec.command), "labels": json.dumps(spec.labels), "env": "{}", "mem_gib": spec.mem_gib}
    gpus = [GpuState(f"h100-00/gpu{i}", "h100-00", "H100-80GB", 80) for i in range(spec.gpus)]
    job = build_job(row, gpus, config.queue.kubernetes)
    return client.ApiClient().sanitize_for_serialization(job)["spec"]["template"]["spec"]


def test_a_stage_pod_mounts_every_path_its_config_names(tmp_path):
    config, expected = _every_path_set(tmp_path)
    pod = _stage_pod(config)
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: bool(m.get("readOnly")) for m in container["volumeMounts"]}
    missing = {field: want for field, want in expected.items() if mounts.get(want[0]) != want[1]}
    assert not missing, f"fields whose folder the pod does not mount as it must (path, read-only): {missing}; pod has {mounts}"
    sources = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    for mount in container["volumeMounts"]:  # each a node folder at the same path (no claim configured)
        assert mount["mountPath"] == "/dev/shm" or sources[mount["name"]] == mount["mountPath"], mount


def test_the_production_stage_pod_sees_its_denoiser_and_vae():
    """The failure of issue 64: configs/h100.yaml's stage pod lacked /models/sd15-inpainting/unet."""
    config = load_config(REPO / "configs" / "h100.yaml", site=EXAMPLE_SITE)
    assert model_paths(config) == ["/models/sd15-inpainting/vae", "/models/sd15-inpainting/unet"]
    assert job_paths(config) == ["/mnt/drape", "/mnt/nvme/drape-shards"]


def test_local_forms_of_urls_and_what_is_never_a_node_folder(tmp_path, config):
    assert local_path("store", f"sqlite:///{tmp_path}/mlflow.db") == str(tmp_path)
    assert local_path("store", f"file://{tmp_path}/objects") == str(tmp_path / "objects")
    assert local_path("store", "s3://bucket/prefix") is None and local_path("store", "http://mlflow:5000") is None
    assert local_path("checkpoint", "denoise-baseline") is None  # a registry alias
    assert local_path("model", "org/sd15-inpainting") == "org/sd15-inpainting"  # a hub id: kept, for the pod to refuse
    shm = config.model_copy(
        update={
            "data": config.data.model_copy(
                update={"loader": config.data.loader.model_copy(update={"handoff_dir": "/dev/shm/drape"})}
            )
        }
    )
    assert job_paths(shm) == job_paths(config)  # the pod's memory, never a node folder
    assert [field for field, _, _ in configured(config)] == ["paths.root", "inference.model"]


def test_a_hub_id_denoiser_is_refused_for_a_pod_naming_why(tmp_path):
    config, _ = _every_path_set(tmp_path)
    model = config.model.model_copy(update={"denoiser": config.model.denoiser.model_copy(update={"path": "org/sd15-inpainting"})})
    with pytest.raises(ValueError, match="model path 'org/sd15-inpainting' of its config is relative.*Hugging Face cache"):
        _stage_pod(config.model_copy(update={"model": model}))

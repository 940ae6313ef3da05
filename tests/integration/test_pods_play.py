"""A stage pod, exactly as drape renders it, really runs: configs/h100.yaml's stage Job (its pod
template from `build_job`, the credentials as a test Secret) is played with `podman kube play` on
the image `make image-test` builds (infra/image/build.sh), and trains inside the pod, seeing only
its volumes: tiny SD-style weights at the recipe's /models/sd15-inpainting/{unet,vae}, live storage
and the shard cache at the site file's paths, the object store (a moto server) over the network.

The node's folders are a temporary directory: each hostPath's source is moved under it (what a
node provides), and DRAPE_NODE (the downward API's spec.nodeName, which podman 4.3 refuses) is the
node's name as the kubelet would set it; nothing else of the rendered pod changes. The pod shares the host's network (`kube
play --network host`), as a cluster's pod network reaches the object store. Needs root, podman,
runc and catatonit (`make services`) and the image; skips naming which is missing.
"""

from __future__ import annotations

import base64
import json
import os
import runpy
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from drape.config import EXAMPLE_SITE, deep_merge, load_config, parse_config
from drape.storage.handoff import result_key
from drape.storage.store import ObjectStore
from tests.conftest import TINY_UNET

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("IMAGE_TEST", "localhost/drape:test")
CONTAINERS_CONF = str(REPO / "infra" / "image" / "containers.conf")
VENV_PYTHON = "/opt/venv/bin/python"  # sys.executable of a flow in the image: the python of the job's command
TINY_VAE = {"latent_channels": 4, "block_out_channels": [32, 64], "layers_per_block": 1, "norm_num_groups": 8}
pytestmark = pytest.mark.slow


def _podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": CONTAINERS_CONF}
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
    return done


def _needs_podman() -> None:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman and runc are not installed (make services installs them)")
    if os.geteuid() != 0:
        pytest.skip("podman kube play of a pod with hostPath volumes runs as root here")
    if _podman("image", "exists", IMAGE, check=False).returncode != 0:
        pytest.skip(f"no image {IMAGE}: build it with `make image-test` (infra/image/build.sh)")
    built = _podman("image", "inspect", "--format", '{{index .Labels "drape.source"}}', IMAGE).stdout.strip()
    here = runpy.run_path(str(REPO / "infra" / "image" / "source_digest.py"))["source_digest"](REPO)
    assert built == here, (
        f"image {IMAGE} was built from another tree (its drape.source label {built or 'missing'}, this tree's {here}): "
        "rebuild it with infra/image/build.sh (layers cached: seconds to a few minutes)"
    )


def _weights(models: Path) -> None:
    """Tiny SD-style weights where the recipe expects SD1.5-inpainting's: unet/ and vae/ (diffusers, safetensors)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    UNet2DConditionModel(**TINY_UNET).save_pretrained(models / "unet", safe_serialization=True)
    blocks = {"down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2}
    AutoencoderKL(**TINY_VAE, **blocks).save_pretrained(models / "vae", safe_serialization=True)


def _config(bucket: str, endpoint: str, flow: Path):
    """configs/h100.yaml (site values from the example site file) at CPU size: one rank, a few steps."""
    data = load_config(REPO / "configs" / "h100.yaml", site=EXAMPLE_SITE).model_dump(mode="json", by_alias=True)
    steps = {stage: {"steps": 2, "finetune_steps": 1} for stage in data["train"]["stages"]}
    small = {
        "storage": {"object_store_url": f"s3://{bucket}", "endpoint_url": endpoint},
        "metrics": {"pushgateway_url": None},
        "queue": {"url": f"sqlite:///{flow}/queue.db"},  # the flow's side: the queue's estimate reads profiles here
        "data": {
            "source": "synthetic",
            # h100.yaml's dlib identity gate refuses a control set whose faces dlib cannot find
            # (drape.gates.checks.control): packaged portraits, at a size dlib reads them
            "resolution": [128, 96],
            "control_samples": 4,
            "shard_max_samples": 8,
            "synthetic": {"samples_per_stage": dict.fromkeys(steps, 8), "faces": "portraits"},
            "cache": {"budget_bytes": 2**30},
            "loader": {"workers": 0},
        },
        "model": {"vae": {**TINY_VAE, "mid_block_attention": True}},
        "train": {"device": "cpu", "precision": "fp32", "gpus": 1, "batch_size": 2, "data_partitions": 1, "stages": steps},
    }
    return parse_config(deep_merge(data, small), "configs/h100.yaml at CPU size")


def _pod(config, node: Path, command: list[str]) -> dict:
    """The stage Job's pod as drape renders it, its hostPaths' sources under `node`."""
    from kubernetes import client

    from scheduler.engines.kubernetes.objects import build_job
    from scheduler.jobs.training import train_job_spec
    from scheduler.policy import GpuState

    spec = train_job_spec(config, stage="identity", mode="full", run_id="play", command=command)
    row = {"id": "stage-training-play", "kind": "stage-training", "stage": "identity", "attempts": 1, "gpus": 1}
    row |= {"command": json.dumps(spec.command), "labels": json.dumps(spec.labels), "env": "{}", "mem_gib": spec.mem_gib}
    settings = config.queue.kubernetes.model_copy(update={"image": IMAGE})
    job = client.ApiClient().sanitize_for_serialization(
        build_job(row, [GpuState("h100-00/gpu0", "h100-00", "H100-80GB", 80)], settings)
    )
    template = job["spec"]["template"]
    for volume in template["spec"]["volumes"]:
        if "hostPath" in volume:
            source = node / volume["hostPath"]["path"].lstrip("/")
            source.mkdir(parents=True, exist_ok=True)
            volume["hostPath"]["path"] = str(source)
    for env in template["spec"]["containers"][0]["env"]:  # podman 4.3 cannot fill spec.nodeName: the kubelet's value
        if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env.pop("valueFrom")
            env["value"] = "h100-00"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job["metadata"]["name"], **template["metadata"]},
        "spec": template["spec"],
    }


def _secret() -> str:
    """The test's credentials as a Secret's `data` (base64 values), the form podman 4.3's envFrom reads from a podman secret."""
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    data = {key: base64.b64encode(os.environ[key].encode()).decode() for key in keys}
    return json.dumps(data)


def test_a_rendered_stage_pod_trains_inside_podman(s3_bucket, tmp_path):
    _needs_podman()
    bucket, endpoint = s3_bucket
    config = _config(bucket, endpoint, tmp_path / "flow")
    node = tmp_path / "node"
    _weights(node / "models" / "sd15-inpainting")
    from drape.training.jobs.stage_job import StageJob

    store = ObjectStore(f"s3://{bucket}", endpoint_url=endpoint)
    job = StageJob(config, "identity", Path("/unused"), run_id="play", handoff=True)
    command = [VENV_PYTHON, *job.publish(store)[1:]]
    pod = _pod(config, node, command)
    subprocess.run(
        ["chown", "-R", f"{config.queue.kubernetes.run_as_user}:{config.queue.kubernetes.run_as_user}", str(node)], check=True
    )
    manifest, secret = tmp_path / "pod.yaml", config.queue.kubernetes.credentials_secret
    manifest.write_text(yaml.safe_dump(pod))
    (tmp_path / "secret.json").write_text(_secret())
    name, started = pod["metadata"]["name"], time.monotonic()
    _podman("secret", "rm", secret, check=False)
    _podman("secret", "create", secret, str(tmp_path / "secret.json"))
    try:
        _podman("kube", "play", "--network", "host", "--replace", str(manifest))
        container = f"{name}-trainer"
        code = _podman("wait", container, timeout=900).stdout.strip()
        logs = _podman("logs", container, check=False)
        took = time.monotonic() - started
        print(f"pod {name}: start to finish {took:.0f} s, exit {code}")
        assert code == "0", (logs.stdout + logs.stderr)[-4000:]
    finally:
        _podman("kube", "down", str(manifest), check=False)
        _podman("secret", "rm", secret, check=False)
    result = json.loads(store.read_bytes(result_key("play", "identity")))
    assert result["world_size"] == 1 and result["steps"] == 2 and result["checkpoint"].startswith("/mnt/drape/"), result

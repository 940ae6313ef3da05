"""docs/guide.md executed at test scale, so the guide cannot go stale.

The blocks marked `<!-- guide: run -->` (and `run slurm` / `run kubernetes`) are run by bash, in
order, from the repository root, with only the guide's own variables (its `variables` block) set by
the test: a VITON-HD-shaped tree in its real layout (tests/unit/test_importers.py), a tiny
SD1.5-inpainting-shaped diffusers folder saved with `save_pretrained` and an attention file as
CatVTON's code saves it (tests/unit/test_catvton_release.py), stand-in feature networks, a moto S3
server, MLflow and the queue on SQLite, and a production-shaped config at 64×48
(tests/configs/guide-*.yaml, in place of configs/slurm.yaml and configs/h100.yaml). A block marked
as an illustration is not run (the unit guard checks that each says why, and that its `drape`
commands parse); a block with any other mark fails the test.

- On Slurm (the test cluster of tests/integration/slurm_cluster.py, two nodes of two GPUs each):
  the whole guide: the site file, the config, the import, the encode, the weights, Slurm's fleet and
  an sbatch script Slurm accepts, calibration, a run of the four stages whose stage jobs Slurm runs,
  the evaluation, and the registry's baselines. Each step's effect is checked.
- On Kubernetes: the site file, the config and the Kubernetes blocks: the manifests and a stage
  job's objects rendered and validated against the API schema (as test_k8s.py does). The steps the
  two share are the same commands with another $CLUSTER_CONFIG, run once above.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.unit.test_guide_commands import Block, guide_blocks

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"^export (.+?)(?:\s+#.*)?$")
STAGES = ("identity", "texture", "geometry", "denoise")


def guide_variables(blocks: list[Block]) -> set[str]:
    """The names the guide's `variables` block exports."""
    (block,) = [b for b in blocks if b.kind == "variables"]
    names = set()
    for line in block.code.splitlines():
        if match := VARIABLE.match(line.strip()):
            names |= {assignment.split("=", 1)[0] for assignment in match.group(1).split()}
    return names


def write_weights(models: Path) -> None:
    """SD1.5-inpainting's unet/ and vae/ (tiny, diffusers layout), CatVTON's attention release over
    that UNet, and the stand-in Inception and AlexNet files, where the guide says they are."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    from drape.training.published.catvton_release import RELEASE_FILE
    from tests.conftest import TINY_UNET
    from tests.unit.test_catvton_release import TINY_VAE, _catvtons_own_file
    from tests.unit.test_eval_metrics import write_alexnet_weights, write_tiny_inception

    sd15 = models / "stable-diffusion-inpainting"
    torch.manual_seed(7)
    UNet2DConditionModel(**TINY_UNET).save_pretrained(sd15 / "unet")
    blocks = {"down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2}
    AutoencoderKL(**TINY_VAE, **blocks).save_pretrained(sd15 / "vae")
    torch.manual_seed(8)
    _catvtons_own_file(UNet2DConditionModel(**TINY_UNET), models / "CatVTON" / "mix-48k-1024" / RELEASE_FILE)
    write_tiny_inception(models / "inception-2015-12-05.pt")
    write_alexnet_weights(models / "alexnet-owt-7be5be79.pth")


@pytest.fixture(scope="module")
def world(tmp_path_factory, moto_server):
    """The guide's variables (common to both clusters), with the files they name written."""
    import boto3

    from tests.unit.test_importers import make_viton_hd

    root = tmp_path_factory.mktemp("guide")
    make_viton_hd(root / "VITON-HD", pairs=16, test=6)
    write_weights(root / "models")
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket="guide-artifacts")
    return root, {
        "VITON_HD": str(root / "VITON-HD"),
        "MODELS": str(root / "models"),
        "STORE": "s3://guide-artifacts/drape",
        "S3_ENDPOINT": moto_server,
    }


def cluster_variables(root: Path, world_vars: dict, cluster: str) -> dict[str, str]:
    """Every variable of the guide for one cluster: its work folder, with the test-scale stand-in of
    the production config copied in (a config extends files beside it or under configs/)."""
    work = root / cluster
    work.mkdir()
    for name in ("guide-base.yaml", f"guide-{cluster}.yaml"):
        shutil.copyfile(REPO / "tests" / "configs" / name, work / name)
    return {
        **world_vars,
        "WORK": str(work),
        "CLUSTER_CONFIG": str(work / f"guide-{cluster}.yaml"),
        "CONFIG": str(work / "tryon.yaml"),
        "DRAPE_SITE": str(work / "site.yaml"),
        "MLFLOW_URI": f"sqlite:///{root / cluster}-mlflow.db",
        "QUEUE_URL": f"sqlite:///{root / cluster}-queue.db",
        "NODE_DISK": str(root / f"{cluster}-node"),
        "SLURM_PARTITION": "gpu",
        "GRES_TYPE": "gpu",  # the test cluster's gres is untyped (gpu:2)
        "GPU_GIB": "16",
        "PROMETHEUS_URL": "http://prometheus.monitoring:9090",
        "IMAGE": "registry.example.internal/drape:0.1.0-guide",  # not the default: the Job must carry the site's
    }


def run_blocks(blocks: list[Block], variables: dict[str, str], extra_env: dict[str, str], timeout: float) -> dict[str, str]:
    """Run each block by bash (-euo pipefail) from the repository root with the guide's variables;
    the output of each, by its first line. A block the guide's variables do not cover fails."""
    assert set(variables) == guide_variables(guide_blocks()), "the test sets exactly the guide's variables"
    env = {
        **os.environ,
        **extra_env,
        **variables,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
    }
    outputs = {}
    for block in blocks:
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
        )
        said = done.stdout + done.stderr
        print(f"--- {block.code.splitlines()[0]} ({time.monotonic() - started:.1f} s)\n{said[-3000:]}")
        assert done.returncode == 0, f"guide block failed (exit {done.returncode}):\n{block.code}\n{said[-6000:]}"
        outputs[block.code.splitlines()[0]] = said
    return outputs


def blocks_for(cluster: str, *, common: bool) -> list[Block]:
    """The blocks a cluster's test runs; anything not marked run, run <cluster>, the variables or an
    illustration is refused."""
    chosen = []
    for block in guide_blocks():
        assert block.kind in ("variables", "run", "run slurm", "run kubernetes", "illustration"), block
        if block.kind == f"run {cluster}" or (block.kind == "run" and (common or "cat > " in block.code)):
            chosen.append(block)
    return chosen


def output_of(outputs: dict[str, str], command: str) -> str:
    (said,) = [text for first, text in outputs.items() if command in first]
    return said


def test_the_guide_on_slurm(world, tmp_path):
    from tests.integration.slurm_cluster import SlurmCluster, slurm_installed

    if why := slurm_installed():
        pytest.fail(why)
    root, world_vars = world
    variables = cluster_variables(root, world_vars, "slurm")
    short = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # slurmstepd's sockets: paths under 108 bytes
    slurm = SlurmCluster(short)
    try:
        slurm.start()
        outputs = run_blocks(blocks_for("slurm", common=True), variables, {"SLURM_CONF": str(slurm.conf)}, timeout=900)
    finally:
        print(slurm.logs(tail=6000))
        slurm.run("scancel", "--full", "--user=root", check=False) if slurm.processes else None
        slurm.close()
        shutil.rmtree(short, ignore_errors=True)
    check_the_slurm_run(variables, outputs)


def check_the_slurm_run(variables: dict[str, str], outputs: dict[str, str]) -> None:
    from mlflow import MlflowClient

    from drape.config import load_config
    from drape.layout import dataset_prefix
    from drape.storage.store import open_store

    config = load_config(variables["CONFIG"], site=variables["DRAPE_SITE"])  # not os.environ: later tests read it
    assert (config.data.name, config.data.latents_of, config.data.version) == ("tryon-prod", "v1", "v1-sd15vae")
    assert config.queue.launcher == "slurm" and config.queue.fleet == "slurm"
    assert config.model.denoiser.path.endswith("CatVTON/mix-48k-1024")
    store = open_store(config)
    for version in ("v1", "v1-sd15vae"):  # step 3 imported, step 4 encoded, where the config reads them
        assert json.loads(store.read_bytes(f"{dataset_prefix(config.data.name, version)}/manifest.json"))["splits"], version
    shard = output_of(outputs, "drape data shard")
    for split, samples in (("control", 4), ("test_paired", 6), ("test_unpaired", 6)):  # control: data.control_samples
        assert re.search(rf"{split}\s+│\s+1\s+│\s+{samples}\b", shard), shard
    described = " ".join(output_of(outputs, "drape model describe").split())  # rich wraps lines at COLUMNS
    assert "every key mapped onto the UNet's 16 self-attention modules, shapes equal" in described, described
    sbatch = Path(variables["WORK"], "identity.sbatch").read_text()
    assert "--partition=gpu" in sbatch and "#SBATCH --gres=gpu" in sbatch and "#SBATCH --nodelist=slurm-0" in sbatch
    assert "to start at" in output_of(outputs, "sinfo"), "sbatch --test-only accepted the script"
    assert "gates.identity.min_similarity:" in output_of(outputs, "drape data prestage")
    trained = output_of(outputs, "drape run")
    for stage in STAGES:
        assert f"gate-{stage}: passed" in trained, trained[-4000:]
    assert "could not be worked out" not in trained, "the run's cost is priced (the overlay prices the gres type)"
    jobs = Path(variables["NODE_DISK"], "drape", "queue", "slurm")
    assert len(list(jobs.glob("*.sbatch"))) == 4, "each stage trained as a Slurm job"
    evaluated = " ".join(output_of(outputs, "drape eval").split())
    for metric in ("ssim", "lpips", "fid", "kid"):
        assert f"│ {metric} │" in evaluated, evaluated
    assert "tryon-prod/v1-sd15vae (VITON-HD) test_paired" in evaluated and "(VITON-HD) test_unpaired" in evaluated, evaluated
    client = MlflowClient(tracking_uri=variables["MLFLOW_URI"], registry_uri=variables["MLFLOW_URI"])
    fid = client.get_model_version_by_alias("drape-tryon", "denoise-baseline").tags["drape.eval.test_paired.fid"]
    promoted = output_of(outputs, "python - <<'EOF'")
    for stage in STAGES:
        assert f"{stage} baseline: version" in promoted, promoted
    assert f"FID {fid}" in promoted, promoted


def test_the_guide_on_kubernetes(world):
    import kubernetes_validate

    root, world_vars = world
    variables = cluster_variables(root, world_vars, "kubernetes")
    run_blocks(blocks_for("kubernetes", common=False), variables, {}, timeout=300)
    work = Path(variables["WORK"])
    installed = [doc for doc in yaml.safe_load_all((work / "drape-k8s.yaml").read_text()) if doc]
    job = [doc for doc in yaml.safe_load_all((work / "stage-job.yaml").read_text()) if doc]
    assert {o["kind"] for o in installed} >= {"Deployment", "StatefulSet", "Service", "Role"}
    assert [o["kind"] for o in job][-1] == "Job", job
    for obj in installed + job:
        kubernetes_validate.validate(obj, "1.33", strict=True)
    (pod,) = [o["spec"]["template"]["spec"] for o in job if o["kind"] == "Job"]
    assert pod["containers"][0]["image"] == variables["IMAGE"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"

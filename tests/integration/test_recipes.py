"""The field's recipes through the staged-training flow (Prefect test harness, MLflow on SQLite):
`catvton` with its UNet loaded from a tiny random checkpoint the test saves in diffusers layout
(`model.denoiser.path`), and a `latent-dit` trained by flow matching, each on a tiny random VAE
saved the same way (`model.vae.path`). Every stage trains, passes its gate, is snapshotted and
archived, and the checkpoints record the recipe and the objective they were trained with.

The flow is the subject, not the models' quality: a few steps per stage, with gates that pass
anything but a collapsed output (a random VAE decodes noise-like pictures).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from diffusers import UNet2DConditionModel

from drape import STAGES, pipeline
from drape.training.checkpoints.checkpoint import read_manifest
from drape.training.recipes.latent import fit_vae, synthetic_images, vae_config
from tests.conftest import PASS_ANYTHING, TINY_UNET, tiny_config

pytestmark = pytest.mark.slow

# A few steps a stage; the first stage trains long enough that its outputs carry the person (the
# gates' lowest thresholds are above zero, which a random model's bootstrap lower bound is not).
# Measured with one thread, 30 identity steps: identity lower bounds 0.19-0.21 (catvton) and
# 0.21-0.25 (flow matching) at every stage, texture 0.15-0.25, coherence 0.13-0.19.
STEPS = {"identity": 30, "texture": 4, "geometry": 4, "denoise": 4}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny random SD1.5-inpainting-shaped UNet and a 4-channel stand-in VAE briefly fitted on
    synthetic images (`drape model fit-vae`'s code), in diffusers layout as a pipeline folder holds
    them (unet/, vae/)."""
    folder = tmp_path_factory.mktemp("sd15-inpainting")
    config = tiny_config(folder / "drape", model={"kind": "latent-dit", "vae": {"latent_channels": 4}})
    torch.manual_seed(7)
    UNet2DConditionModel(**TINY_UNET).save_pretrained(folder / "unet", safe_serialization=True)
    vae = fit_vae(synthetic_images(config, 64), vae_config(config.model.vae, config.data.resolution), steps=60)
    vae.save_pretrained(folder / "vae", safe_serialization=True)
    return folder


def recipe_config(tmp_path: Path, name: str, model: dict, *, trainable: dict[str, list[str]] | None = None, **overrides):
    """The tiny config with `model`, `STEPS` steps a stage and gates that pass a tiny model, written to a file."""
    stages = {stage: {"steps": STEPS[stage], **({"trainable": trainable[stage]} if trainable else {})} for stage in STAGES}
    config = tiny_config(
        tmp_path / "drape",
        model=model,
        train={"stages": stages},
        gates=PASS_ANYTHING,
        queue={"enabled": False},
        **overrides,
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return config, path


def run_through_the_stages(config, path: Path, name: str) -> dict:
    """The flow over the four stages; asserts each trained, passed its gate, was snapshotted and archived."""
    from flows.staged_training import staged_training

    summary = staged_training(config_path=str(path), run_name=name)
    rows = summary["stages"]
    assert [row["stage"] for row in rows] == list(STAGES)
    for row in rows:
        assert row["steps"] == STEPS[row["stage"]], row  # trained
        assert row["verdict"] == "pass", (row["stage"], row.get("checks"))  # gated
        assert row.get("version"), row  # snapshotted: an MLflow model version
        assert row.get("archived_bytes", 0) > 0, row  # archived: uploaded and verified, then freed
    return summary


def baseline_manifest(config, stage: str = "denoise") -> dict:
    return read_manifest(pipeline.live_root(config) / "baselines" / stage / "checkpoint")


def test_the_catvton_recipe_from_a_pretrained_unet_goes_through_the_four_stages(tmp_path, prefect_harness, pretrained):
    model = {
        "kind": "catvton",
        "denoiser": {"path": str(pretrained / "unet")},
        "vae": {"path": str(pretrained / "vae"), "latent_channels": 4},
    }
    # the recipe trains the self-attention alone; the first stage trains the whole random UNet so
    # that a few dozen steps reach a passing gate
    trainable = {stage: ["unet.*"] if stage == "identity" else ["unet.*.attn1.*"] for stage in STAGES}
    config, path = recipe_config(tmp_path, "catvton", model, trainable=trainable)
    run_through_the_stages(config, path, "catvton")
    manifest = baseline_manifest(config)
    assert manifest["config"]["model"]["kind"] == "catvton"
    assert manifest["config"]["model"]["denoiser"]["path"] == str(pretrained / "unet")
    assert manifest["config"]["diffusion"]["objective"] == "ddpm"


def test_a_flow_matching_transformer_goes_through_the_four_stages(tmp_path, prefect_harness, pretrained):
    model = {
        "kind": "latent-dit",
        "patch_size": 2,
        "garment_patch_size": 4,
        "vae": {"path": str(pretrained / "vae"), "latent_channels": 4},
    }
    diffusion = {"objective": "flow_matching", "sampling_steps": 4}
    config, path = recipe_config(tmp_path, "fitdit", model, diffusion=diffusion)
    run_through_the_stages(config, path, "fitdit")
    for stage in STAGES:
        manifest = baseline_manifest(config, stage)
        assert manifest["config"]["model"]["kind"] == "latent-dit"
        assert manifest["config"]["diffusion"]["objective"] == "flow_matching"

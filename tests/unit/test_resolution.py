"""Non-square images: `data.resolution: [height, width]` (VITON-HD and DressCode are 1024×768) through
the config, the generator, the importers, every built-in model and the gates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drape import STAGES
from drape.config import ConfigError
from drape.data.dataset import build_dataset, import_dataset, load_split, to_model_inputs
from drape.data.importers import _Letterbox
from drape.data.partition import split_data
from drape.data.synth import make_garment, make_identity, make_sample, photo_seed, redraw
from drape.gates.run import evaluate_gate
from drape.training.loop.trainer import train_stage
from drape.training.recipes.model import build_model, sample
from scheduler.jobs.profiles import shape_key
from tests.conftest import tiny_config
from tests.unit.test_importers import make_viton_hd

PORTRAIT = [64, 48]  # 3:4, as VITON-HD's 1024×768, small
MODELS = {
    "pixel-dit": {"patch_size": 4, "garment_patch_size": 8},
    "latent-dit": {"kind": "latent-dit", "patch_size": 2, "garment_patch_size": 4, "vae": {"latent_channels": 4}},
    "latent-unet": {"kind": "latent-unet", "unet": {"block_out_channels": [16, 32]}, "vae": {"latent_channels": 4}},
}


def test_the_config_takes_height_and_width(tmp_path):
    config = tiny_config(tmp_path, data={"resolution": PORTRAIT})
    assert (config.data.height, config.data.width) == (64, 48) and config.data.resolution_label == "64×48 px"
    assert tiny_config(tmp_path, data={"resolution": [32, 32]}).data.resolution == 32  # a square stays one number
    assert "/64x48px/" in shape_key(config, "stage-training", "identity") and "/32px/" in shape_key(
        tiny_config(tmp_path), "x", None
    )
    with pytest.raises(ConfigError, match="each side must be 32-2048 pixels, got 16"):
        tiny_config(tmp_path, data={"resolution": [32, 16]})
    with pytest.raises(ConfigError, match="model.garment_patch_size 8 must divide data.resolution width 36"):
        tiny_config(tmp_path, data={"resolution": [32, 36]})


def test_a_portrait_sample_is_the_centre_of_the_square_one_with_its_boxes_moved():
    identity, garment = make_identity(0, 3), make_garment(0, 5)
    seed = photo_seed("identity", 1)  # what redraw takes from the key
    square = make_sample(0, "identity-00001", identity, garment, "down", seed, 64)
    portrait = make_sample(0, "identity-00001", identity, garment, "down", seed, (64, 48))
    assert portrait.target.size == (48, 64) and portrait.meta["resolution"] == [64, 48]
    assert np.array_equal(np.asarray(portrait.target), np.asarray(square.target)[:, 8:56])
    assert np.array_equal(np.asarray(portrait.garment), np.asarray(square.garment)[:, 8:56])
    x0, y0, x1, y1 = portrait.meta["face_box"]
    assert [x0 + 8, y0, x1 + 8, y1] == pytest.approx(square.meta["face_box"]) and 0 <= x0 < x1 <= 48
    assert np.array_equal(np.asarray(redraw(0, portrait.meta).target), np.asarray(portrait.target))  # the gates redraw it


def test_the_importers_keep_the_sources_aspect(tmp_path):
    source = make_viton_hd(tmp_path / "src")  # 48×64 photos: 3:4 portrait
    box = _Letterbox((48, 64), (32, 24))
    assert (box.dx, box.dy) == (0, 0) and box.point(48, 64) == [24.0, 32.0]  # scale only
    assert (_Letterbox((48, 64), 32).dx, _Letterbox((48, 64), 32).dy) == (8, 0)  # a square: bands at the sides
    manifest = import_dataset(
        source,
        tmp_path / "out",
        name="ext",
        version="v1",
        resolution=(32, 24),
        control=4,
        weights=dict.fromkeys(STAGES, 1),
        max_samples=3,
    )
    control = load_split(tmp_path / "out", manifest, "control")
    assert control["target"].shape == (4, 32, 24, 3) and control["garment"].shape == (4, 32, 24, 3)
    assert manifest["source"]["resolution"] == [32, 24]
    for meta in control["meta"]:
        x0, y0, x1, y1 = meta["face_box"]
        assert 0 <= x0 < x1 <= 24 and 0 <= y0 < y1 <= 16


@pytest.mark.parametrize("name", list(MODELS))
def test_every_built_in_model_trains_and_samples_on_a_portrait_grid(name, tmp_path):
    config = tiny_config(tmp_path, data={"resolution": PORTRAIT}, model=MODELS[name])
    model = build_model(config)
    batch = {field: torch.rand(2, 3, 64, 48) * 2 - 1 for field in ("target", "agnostic", "pose", "garment")} | {
        "mask": (torch.rand(2, 1, 64, 48) > 0.5).float()
    }
    clean, condition = model.prepare(batch)
    prediction = model(clean, torch.tensor([10, 500]), **condition)
    down = config.model.downsample
    assert prediction.shape == clean.shape and clean.shape[-2:] == (64 // down, 48 // down)
    out = sample(model, config.diffusion, batch, seed=0, num_steps=2)
    assert out.shape == (2, 3, 64, 48)
    workload = model.workload()
    assert workload.tokens > 0


def test_a_portrait_dataset_trains_and_gates(tmp_path):
    config = tiny_config(
        tmp_path / "drape",
        data={
            "resolution": PORTRAIT,
            "synthetic": {"samples_per_stage": dict.fromkeys(STAGES, 8)},
            "control_samples": 4,
            "shard_max_samples": 8,
        },
    )
    manifest = build_dataset(config, tmp_path / "shards")
    control = load_split(tmp_path / "shards", manifest, "control")
    assert control["target"].shape == (4, 64, 48, 3)
    data = config.model_dump(mode="json")
    data["train"]["stages"]["identity"]["steps"] = 2
    cfg = type(config).model_validate(data)
    trained = train_stage(
        cfg,
        stage="identity",
        data=split_data(tmp_path / "shards", manifest, "identity"),
        out_dir=tmp_path / "run",
        init_checkpoint=None,
    )
    report = evaluate_gate(
        cfg,
        stage="identity",
        run_id="r",
        checkpoint=trained.checkpoint,
        control=control,
        control_set="c",
        gate_dir=tmp_path / "gate",
    )
    assert set(report.checks) == {"identity", "texture", "coherence"}
    assert all(np.isfinite(check.mean) for check in report.checks.values())
    from PIL import Image

    with Image.open(tmp_path / "gate" / "outputs" / f"{control['keys'][0]}.png") as output:
        assert output.size == (48, 64)
    assert to_model_inputs(control)["target"].shape == (4, 3, 64, 48)

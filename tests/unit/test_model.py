"""Model shapes, checkpoint round trip (safetensors + manifest), deterministic sampling; a checkpoint
whose model config is absurd or whose manifest is not JSON is refused naming the file."""

import json
import math
import shutil
import time

import pytest
import torch

from drape.training.checkpoints.checkpoint import CheckpointError, load_model, read_manifest, save_checkpoint, verify_checkpoint
from drape.training.recipes.model import build_model, sample
from tests.conftest import tiny_config


def _inputs(batch, resolution):
    generator = torch.Generator().manual_seed(0)
    image = lambda: torch.rand(batch, 3, resolution, resolution, generator=generator) * 2 - 1  # noqa: E731
    return {
        "agnostic": image(),
        "pose": image(),
        "garment": image(),
        "mask": (torch.rand(batch, 1, resolution, resolution, generator=generator) > 0.5).float(),
    }


def test_forward_shapes(config):
    model = build_model(config)
    inputs = _inputs(3, config.data.resolution)
    noisy = torch.randn(3, 3, config.data.resolution, config.data.resolution)
    out = model(noisy, torch.tensor([1, 500, 999]), inputs["agnostic"], inputs["mask"], inputs["pose"], inputs["garment"])
    assert out.shape == noisy.shape


def test_garment_changes_the_output(config):
    model = build_model(config)
    inputs = _inputs(2, config.data.resolution)
    noisy = torch.randn(2, 3, config.data.resolution, config.data.resolution)
    t = torch.tensor([10, 10])
    a = model(noisy, t, inputs["agnostic"], inputs["mask"], inputs["pose"], inputs["garment"])
    b = model(noisy, t, inputs["agnostic"], inputs["mask"], inputs["pose"], inputs["garment"].flip(0))
    assert not torch.allclose(a, b)


def test_checkpoint_round_trip_and_manifest(config, tmp_path):
    model = build_model(config)
    path = save_checkpoint(
        tmp_path / "step-0000001",
        model=model,
        optimizer=None,
        trainable_names=["x"],
        ema=None,
        manifest={"stage": "identity", "step": 1, "data_manifest_hash": "abc", "config": {}},
    )
    manifest = read_manifest(path)
    assert manifest["stage"] == "identity" and manifest["step"] == 1 and manifest["data_manifest_hash"] == "abc"
    assert manifest["code_version"]
    assert any(name.endswith(".safetensors") for name in manifest["files"])
    assert not list(path.rglob("*.bin")) and not list(path.rglob("*.pt"))
    loaded = load_model(path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_tampered_checkpoint_is_refused(config, tmp_path):
    path = save_checkpoint(
        tmp_path / "ckpt", model=build_model(config), optimizer=None, trainable_names=[], ema=None, manifest={}
    )
    weights = next(path.rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match="does not match its sha256"):
        verify_checkpoint(path)
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        load_model(path)


def test_sampling_is_deterministic_per_seed(config):
    model = build_model(config).eval()
    inputs = _inputs(2, config.data.resolution)
    a = sample(model, config.diffusion, inputs, seed=7)
    b = sample(model, config.diffusion, inputs, seed=7)
    c = sample(model, config.diffusion, inputs, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= -1 and a.max() <= 1


def test_ema_weights_are_used_when_preferred(config, tmp_path):
    model = build_model(config)
    name = "transformer.proj_out.bias"
    ema = {name: torch.full_like(dict(model.named_parameters())[name], 0.5)}
    path = save_checkpoint(tmp_path / "ckpt", model=model, optimizer=None, trainable_names=[name], ema=ema, manifest={})
    assert torch.equal(dict(load_model(path, prefer_ema=True).named_parameters())[name], ema[name])
    assert torch.equal(dict(load_model(path).named_parameters())[name], dict(model.named_parameters())[name])


def test_export_weights_drops_optimizer_state(config, tmp_path):
    from drape.training.checkpoints.checkpoint import export_weights

    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters())
    model(
        torch.zeros(1, 3, 32, 32),
        torch.tensor([1]),
        *([torch.zeros(1, 3, 32, 32)] * 1),
        torch.zeros(1, 1, 32, 32),
        torch.zeros(1, 3, 32, 32),
        torch.zeros(1, 3, 32, 32),
    ).sum().backward()
    optimizer.step()
    names = [n for n, _ in model.named_parameters()]
    full = save_checkpoint(
        tmp_path / "full", model=model, optimizer=optimizer, trainable_names=names, ema=None, manifest={"step": 3}
    )
    exported = export_weights(full, tmp_path / "weights")
    assert (full / "optimizer.safetensors").is_file() and not (exported / "optimizer.safetensors").exists()
    manifest = verify_checkpoint(exported)
    assert manifest["step"] == 3 and manifest["optimizer_state"] is False
    a, b = load_model(full).state_dict(), load_model(exported).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_unknown_prediction_type_is_refused():
    from types import SimpleNamespace

    import torch

    from drape.training.recipes.model import diffusion_target

    unknown = SimpleNamespace(config=SimpleNamespace(prediction_type="flow_matching"))
    with pytest.raises(ValueError, match="prediction_type 'flow_matching' is not supported"):
        diffusion_target(unknown, torch.zeros(1), torch.zeros(1), torch.zeros(1))


# --- checkpoints whose files were damaged or rewritten --------------------------------------------
def test_a_checkpoint_whose_model_config_is_absurd_is_refused_before_it_is_built(tmp_path):
    from drape.storage.checksum import sha256_file

    path = save_checkpoint(
        tmp_path / "step-1",
        model=build_model(tiny_config(tmp_path / "d")),
        optimizer=None,
        trainable_names=[],
        ema=None,
        manifest={"step": 1},
    )
    for key, value, said in (
        ("num_layers", 10**6, "at most 4096"),
        ("attention_head_dim", 2**40, "at most 65536"),
        ("patch_size", math.nan, "finite"),
        ("num_attention_heads", -3, "never negative"),
    ):
        copy = shutil.copytree(path, tmp_path / key)
        config_file = copy / "model" / "config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), key: value}))
        manifest = json.loads((copy / "manifest.json").read_text())  # an attacker rewrites the hash too
        manifest["files"]["model/config.json"] = sha256_file(config_file)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        started = time.monotonic()
        with pytest.raises(CheckpointError, match=rf"config\.json: {key}: .*{said}"):
            load_model(copy)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("payload", ['{"step": 1,', ""])
def test_a_checkpoint_manifest_that_is_not_json_names_the_file(tmp_path, payload):
    (tmp_path / "step-0000001").mkdir()
    (tmp_path / "step-0000001" / "manifest.json").write_text(payload)
    with pytest.raises(ValueError, match=r"step-0000001/manifest\.json: not JSON .*line 1 column"):
        read_manifest(tmp_path / "step-0000001")

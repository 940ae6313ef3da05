"""Stage checkpoints (drape/training/checkpoints/checkpoint.py, drape/training/checkpoints/base.py, drape/storage/bases.py):
the stage's tensors plus a frozen base named by its content hash reassemble the model bit for bit;
a base whose content is not the one named is refused naming both hashes and the files; a model
that trains everything, and a checkpoint in the older whole format, load as whole models; resuming
from stage checkpoints ends with the weights of a run that saved whole checkpoints; four stages over
one base put it in the object store once; a restore brings the base back."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from drape.storage.bases import fetch_bases, prune_live_bases, publish_bases
from drape.storage.store import ObjectStore
from drape.training.checkpoints.base import BASE_FILE, content_hash
from drape.training.checkpoints.checkpoint import (
    STAGE_FILE,
    CheckpointError,
    load_model,
    model_tensor_names,
    read_manifest,
    read_model_tensors,
    save_checkpoint,
)
from drape.training.recipes.model import build_model, trainable_parameter_names
from tests.unit.conftest import seven_texture_steps, uninterrupted_and_resumed

PATTERNS = ["transformer.transformer_blocks.*.attn.*"]


def _trained(config, seed: int = 0):
    """The config's model with its attention tensors moved (as a stage that trained them), and their names."""
    model = build_model(config)
    names = trainable_parameter_names(PATTERNS, [n for n, _ in model.named_parameters()], model.frozen_prefixes)
    assert names and len(names) < len(list(model.parameters()))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in names:
                parameter.add_(torch.randn(parameter.shape, generator=generator))
    return model, names


def _save(model, names, path, bases, step=1):
    manifest = {"stage": "texture", "step": step}
    return save_checkpoint(path, model=model, optimizer=None, trainable_names=names, ema=None, manifest=manifest, bases=bases)


def test_a_stage_checkpoint_holds_its_tensors_and_reassembles_bit_for_bit(config, tmp_path):
    model, names = _trained(config)
    path = _save(model, names, tmp_path / "run" / "step-0000001", tmp_path / "bases")
    manifest = read_manifest(path)
    frozen = {n: t for n, t in model.state_dict().items() if n not in set(names)}
    assert manifest["base"] == {
        "sha256": content_hash(frozen),
        "tensors": len(frozen),
        "bytes": sum(t.numel() * t.element_size() for t in frozen.values()),
    }
    assert sorted(load_file(str(path / STAGE_FILE))) == sorted(names)
    assert not list((path / "model").glob("*.safetensors"))  # no copy of the frozen tensors
    loaded = load_model(path)
    expected = model.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name
    assert sorted(model_tensor_names(path)) == sorted(expected)
    frozen_name = next(iter(frozen))
    assert torch.equal(read_model_tensors(path, [frozen_name, names[0]])[frozen_name], frozen[frozen_name])
    # a second save over the same frozen tensors writes no second base
    _save(model, names, tmp_path / "run" / "step-0000002", tmp_path / "bases", step=2)
    assert [p.name for p in (tmp_path / "bases").iterdir()] == [manifest["base"]["sha256"]]


def test_a_base_whose_content_differs_is_refused_naming_both_hashes(config, tmp_path):
    model, names = _trained(config)
    path = _save(model, names, tmp_path / "a" / "step-0000001", tmp_path / "a" / "bases")
    other = build_model(config.model_copy(update={"seed": config.seed + 1}))
    other_path = _save(other, names, tmp_path / "b" / "step-0000001", tmp_path / "b" / "bases")
    wanted, other_digest = read_manifest(path)["base"]["sha256"], read_manifest(other_path)["base"]["sha256"]
    assert wanted != other_digest
    base_file = tmp_path / "a" / "bases" / wanted / BASE_FILE
    shutil.copy2(tmp_path / "b" / "bases" / other_digest / BASE_FILE, base_file)
    with pytest.raises(CheckpointError) as refused:
        load_model(path)
    message = str(refused.value)
    assert wanted in message and other_digest in message and str(base_file) in message and "manifest.json" in message
    shutil.rmtree(tmp_path / "a" / "bases")
    with pytest.raises(CheckpointError, match=f"bases/{wanted}"):
        load_model(path)


def test_everything_trained_or_no_bases_saves_the_whole_model(config, tmp_path):
    model, _ = _trained(config)
    every = [n for n, _ in model.named_parameters()]
    whole = _save(model, every, tmp_path / "all", tmp_path / "bases")
    old_format = _save(model, every[:3], tmp_path / "old", None)  # today's whole format, as before stage checkpoints
    for path in (whole, old_format):
        assert "base" not in read_manifest(path) and list((path / "model").glob("*.safetensors"))
        assert not (path / STAGE_FILE).exists()
        for name, tensor in load_model(path).state_dict().items():
            assert torch.equal(tensor, model.state_dict()[name]), name
    assert not (tmp_path / "bases").exists()


def test_resuming_from_stage_checkpoints_gives_the_weights_of_whole_checkpoints(config, texture_data, tmp_path, monkeypatch):
    cfg = seven_texture_steps(config)
    staged_full, staged_resumed = uninterrupted_and_resumed(cfg, texture_data, tmp_path / "staged")
    assert "base" in read_manifest(staged_resumed.checkpoint)
    import drape.training.loop.trainer as trainer

    monkeypatch.setattr(trainer, "bases_dir", lambda config, near: None)  # the reference: whole checkpoints, as before
    whole_full, whole_resumed = uninterrupted_and_resumed(cfg, texture_data, tmp_path / "whole")
    assert "base" not in read_manifest(whole_resumed.checkpoint)
    reference = load_model(whole_full.checkpoint).state_dict()
    for result in (staged_full, staged_resumed, whole_resumed):
        for name, tensor in load_model(result.checkpoint).state_dict().items():
            assert torch.equal(tensor, reference[name]), (result.checkpoint, name)


def test_four_stages_archive_one_base_and_restore_brings_it_back(config, tmp_path):
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    model, names = _trained(config)
    live = tmp_path / "live"
    checkpoints = []
    for index, stage in enumerate(("identity", "texture", "geometry", "denoise")):
        with torch.no_grad():  # each stage moves the trained tensors again; the frozen rest is the same
            dict(model.named_parameters())[names[0]].add_(1.0)
        path = live / "runs" / "r1" / stage / "checkpoints" / "step-0000004"
        checkpoints.append(_save(model, names, path, live / "bases", index))
    sent = sum(publish_bases(store, [checkpoint]) for checkpoint in checkpoints)
    digest = read_manifest(checkpoints[0])["base"]["sha256"]
    assert store.list("bases") == [f"bases/{digest}/{BASE_FILE}", f"bases/{digest}/manifest.json"]
    assert sent == sum(store.size(key) for key in store.list("bases"))
    stage_bytes = (checkpoints[0] / STAGE_FILE).stat().st_size
    assert stage_bytes * 4 < store.size(f"bases/{digest}/{BASE_FILE}")  # the stages' tensors are the small part
    # another node: the checkpoint alone, its base fetched from the store, the model whole again
    node = tmp_path / "node"
    shutil.copytree(checkpoints[-1], node / "checkpoints" / "step-0000004")
    fetch_bases(store, [node / "checkpoints" / "step-0000004"], node / "bases")
    assert torch.equal(load_model(node / "checkpoints" / "step-0000004").state_dict()[names[0]], model.state_dict()[names[0]])
    # the live base goes only once no live checkpoint names it, and only with a verified copy
    assert prune_live_bases(store, live / "bases", live) == 0
    shutil.rmtree(live / "runs")
    assert prune_live_bases(store, live / "bases", live) > 0 and not list((live / "bases").iterdir())


def test_a_checkpoint_of_the_older_whole_format_still_loads(tmp_path):
    """tests/assets/demo-base: a denoise baseline `make demo` wrote before stage checkpoints existed."""
    from pathlib import Path

    from drape.storage.bases import named_base
    from drape.training.checkpoints.checkpoint import export_weights

    old = Path(__file__).parents[1] / "assets" / "demo-base"
    assert "base" not in read_manifest(old) and named_base(old) is None
    model = load_model(old)
    weights = load_file(str(old / "model" / "diffusion_pytorch_model.safetensors"))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(tensor, weights[name]) for name, tensor in model.state_dict().items())
    exported = export_weights(old, tmp_path / "exported")  # a baseline made of it: whole too
    assert not (exported / STAGE_FILE).exists() and torch.equal(
        next(iter(load_model(exported).state_dict().values())), next(iter(model.state_dict().values()))
    )


def test_bf16_moments_are_an_opt_in_that_halves_them_and_says_it_is_lossy(config, texture_data, tmp_path):
    """`train.checkpoint_moments: bfloat16`: AdamW's moments stored in bf16 (half the bytes), the
    manifest saying so; restored, they are the fp32 moments rounded to 8 significant bits."""
    from drape.training.checkpoints.checkpoint import load_training_state
    from drape.training.loop.trainer import train_stage

    model, names = _trained(config)
    parameters = dict(model.named_parameters())
    optimizer = torch.optim.AdamW([parameters[n] for n in names], lr=1e-3)
    for name in names:
        parameters[name].grad = torch.randn_like(parameters[name])
    optimizer.step()
    kept = save_checkpoint(tmp_path / "f32", model=model, optimizer=optimizer, trainable_names=names, ema=None,
                           manifest={"step": 1})  # fmt: skip
    halved = save_checkpoint(tmp_path / "bf16", model=model, optimizer=optimizer, trainable_names=names, ema=None,
                             manifest={"step": 1}, moments=torch.bfloat16)  # fmt: skip
    assert "optimizer_moments" not in read_manifest(kept) and read_manifest(halved)["optimizer_moments"] == "bfloat16"
    stored = load_file(str(halved / "optimizer.safetensors"))
    assert {t.dtype for k, t in stored.items() if not k.endswith("/step")} == {torch.bfloat16}
    moments = sum(t.numel() * 4 for k, t in stored.items() if not k.endswith("/step"))
    sizes = [(path / "optimizer.safetensors").stat().st_size for path in (kept, halved)]
    assert sizes[0] - sizes[1] == pytest.approx(moments / 2, rel=0.01)
    restored = torch.optim.AdamW([parameters[n] for n in names], lr=1e-3)
    load_training_state(halved, restored, names)
    before, after = optimizer.state_dict()["state"], restored.state_dict()["state"]
    for index in before:
        for field in ("exp_avg", "exp_avg_sq"):
            exact, rounded = before[index][field], after[index][field]
            assert rounded.dtype == torch.float32 and torch.equal(rounded, exact.to(torch.bfloat16).float())
            assert torch.allclose(rounded, exact, rtol=2**-8, atol=0)
    assert any(not torch.equal(after[i]["exp_avg_sq"], before[i]["exp_avg_sq"]) for i in before)  # lossy, as it says
    # the trainer passes the recipe's choice on
    cfg = seven_texture_steps(config, checkpoint_moments="bfloat16")
    result = train_stage(cfg, stage="texture", data=texture_data, out_dir=tmp_path / "run", init_checkpoint=None)
    assert read_manifest(result.checkpoint)["optimizer_moments"] == "bfloat16"

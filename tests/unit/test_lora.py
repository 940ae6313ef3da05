"""LoRA fine-tune passes (drape/training/checkpoints/lora.py): adapters apart, merged for the gate, resumable."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from drape.data.partition import split_data
from drape.layout import StagePaths, artifact_kind
from drape.storage.retention import classify_stage_dir
from drape.training.checkpoints.checkpoint import CheckpointError, base_of, list_checkpoints, load_model, read_manifest
from drape.training.checkpoints.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, newest_adapter
from drape.training.checkpoints.stored import read_file
from drape.training.loop.trainer import train_stage
from scheduler.jobs.profiles import lora_parameters
from tests.conftest import tiny_config

TEXTURE = ["transformer.transformer_blocks.*.attn.*"]


class Killed(Exception):
    pass


def _config(config, *, steps=7, ema=False, **lora):
    data = config.model_dump(mode="json")
    data["train"].update({"checkpoint_every": 3, "lora": {"enabled": True, "rank": 2, "alpha": 4, "lr": 1e-2, **lora}})
    data["train"]["ema"] = {"enabled": ema, "decay": 0.9}
    for stage in data["train"]["stages"].values():
        stage["finetune_steps"] = steps
    data["train"]["stages"]["texture"].update({"steps": 3, "trainable": TEXTURE})
    return type(config).model_validate(data)


@pytest.fixture(scope="module")
def texture_data(tiny_dataset):
    directory, manifest, _ = tiny_dataset
    return split_data(directory, manifest, "texture")


@pytest.fixture(scope="module")
def base(texture_data, tmp_path_factory):
    """A whole checkpoint to adapt: a 3-step full texture stage (read only by the tests)."""
    root = tmp_path_factory.mktemp("lora-base")
    cfg = _config(tiny_config(root / "drape"))
    return train_stage(cfg, stage="texture", data=texture_data, out_dir=root / "base", init_checkpoint=None)


def _finetune(cfg, data, out, base, **kwargs):
    return train_stage(cfg, stage="texture", data=data, out_dir=out, init_checkpoint=base.checkpoint, mode="finetune", **kwargs)


def test_adapters_are_saved_apart_and_merged_into_the_checkpoint_the_gate_reads(config, texture_data, base, tmp_path):
    cfg = _config(config)
    result = _finetune(cfg, texture_data, tmp_path / "lora", base)
    adapters = StagePaths(tmp_path / "lora").adapters
    assert [p.name for p in list_checkpoints(adapters)] == ["step-0000003", "step-0000006", "step-0000007"]
    assert [p.name for p in list_checkpoints(tmp_path / "lora" / "checkpoints")] == ["step-0000007"]

    last = newest_adapter(adapters)
    tensors = load_file(str(last / ADAPTER_WEIGHTS))
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    assert json.loads((last / ADAPTER_CONFIG).read_text())["r"] == 2
    assert lora_parameters(cfg, "texture") == sum(t.numel() for t in tensors.values())  # the queue's estimate counts them
    assert (last / "optimizer.safetensors").is_file()
    frozen = base_of(base.checkpoint)  # a stage checkpoint: the model is its tensors and its frozen base
    folders = [Path(base.checkpoint), *([frozen] if frozen is not None else [])]
    whole = sum(p.stat().st_size for folder in folders for p in folder.rglob("*") if p.is_file())
    apart = sum(p.stat().st_size for p in last.rglob("*") if p.is_file())
    assert apart < whole / 4  # an adapter with its moments, not the model with its moments

    before, after = load_model(base.checkpoint), load_model(result.checkpoint)  # merged: the plain class loads it
    assert type(after) is type(before)
    manifest = read_manifest(result.checkpoint)
    targets = manifest["lora"]["targets"]
    assert targets and all(".attn." in t for t in targets) and manifest["lora"]["adapter"] == "adapters/step-0000007"
    b, a = before.state_dict(), after.state_dict()
    assert set(a) == set(b)
    changed = {name for name in a if not torch.equal(a[name], b[name])}
    assert changed and changed <= {f"{t}.weight" for t in targets}  # biases and every other layer untouched
    # the merge is W + (alpha / r) B A with the saved adapter
    name = targets[0]
    delta = tensors[f"{name}.lora_B.weight"] @ tensors[f"{name}.lora_A.weight"]
    torch.testing.assert_close(a[f"{name}.weight"], b[f"{name}.weight"] + 2.0 * delta)


def test_a_killed_lora_pass_resumes_from_its_adapter_to_the_same_weights(config, texture_data, base, tmp_path):
    cfg = _config(config, ema=True, dropout=0.1)  # EMA merged too; dropout masks drawn again alike
    full = _finetune(cfg, texture_data, tmp_path / "full", base)

    def die_at_step_5(done, total):
        if done == 5:
            raise Killed

    with pytest.raises(Killed):
        _finetune(cfg, texture_data, tmp_path / "killed", base, progress=die_at_step_5)
    resumed = _finetune(cfg, texture_data, tmp_path / "killed", base)
    assert resumed.resumed_from_step == 3
    for prefer_ema in (False, True):
        a = load_model(full.checkpoint, prefer_ema=prefer_ema).state_dict()
        b = load_model(resumed.checkpoint, prefer_ema=prefer_ema).state_dict()
        for name in a:
            assert torch.equal(a[name], b[name]), name
    merged = tmp_path / "full" / "checkpoints" / "step-0000007"  # its EMA as stored (packed by default), read back
    ema = read_file(merged, "ema.safetensors", read_manifest(merged))
    assert set(ema) == {f"{t}.weight" for t in read_manifest(full.checkpoint)["lora"]["targets"]}


def test_a_pass_killed_before_its_merge_merges_on_resume(config, texture_data, base, tmp_path):
    cfg = _config(config)
    full = _finetune(cfg, texture_data, tmp_path / "full", base)
    out = tmp_path / "crashed"
    _finetune(cfg, texture_data, out, base)
    merged = list_checkpoints(out / "checkpoints")[-1]
    shutil.rmtree(merged)  # as if killed after the last adapter was written
    again = _finetune(cfg, texture_data, out, base)
    assert again.resumed_from_step == 7 and list_checkpoints(out / "checkpoints")[-1].name == merged.name
    a, b = load_model(full.checkpoint).state_dict(), load_model(again.checkpoint).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_an_adapter_resumes_only_on_the_base_it_was_trained_on(config, texture_data, base, tmp_path):
    cfg = _config(config)
    out = tmp_path / "lora"

    def die_at_step_4(done, total):
        if done == 4:
            raise Killed

    with pytest.raises(Killed):
        _finetune(cfg, texture_data, out, base, progress=die_at_step_4)
    other = train_stage(
        _config(config, steps=7), stage="texture", data=texture_data, out_dir=tmp_path / "other", init_checkpoint=base.checkpoint
    )
    with pytest.raises(CheckpointError, match="another base"):
        train_stage(cfg, stage="texture", data=texture_data, out_dir=out, init_checkpoint=other.checkpoint, mode="finetune")


def test_a_lora_pass_needs_a_base_and_linear_layers_to_adapt(config, texture_data, tmp_path):
    cfg = _config(config)
    with pytest.raises(ValueError, match="adapts a baseline"):
        train_stage(cfg, stage="texture", data=texture_data, out_dir=tmp_path / "a", init_checkpoint=None, mode="finetune")


def test_retention_archives_adapters_as_their_own_kind(config, texture_data, base, tmp_path):
    _finetune(_config(config), texture_data, tmp_path / "lora", base)
    found = classify_stage_dir(tmp_path / "lora", "passed")
    kinds = {a.relative: a.kind for a in found}
    assert kinds["adapters/step-0000007"] == "adapter" and kinds["checkpoints/step-0000007"] == "checkpoint"
    assert artifact_kind("runs/r/texture/adapters/step-0000003") == "adapter"

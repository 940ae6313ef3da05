"""Every path that builds a model from a drape checkpoint reads it strictly (`load_model` through
drape/training/published/weights.py): a checkpoint whose manifest matches its files (rewritten along with them,
as a bug or an attacker would) but whose weights lack a tensor, hold a NaN, or are a pickle, is refused
at training init, the gate, eval, inference and `drape model export`, naming the tensor or the
pickle, and the pickle is never opened."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from drape.storage.checksum import sha256_file
from drape.training.checkpoints.checkpoint import CheckpointError, save_checkpoint
from drape.training.recipes.model import build_model

WEIGHTS = "diffusion_pytorch_model.safetensors"


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _reseal(path):
    """The manifest rewritten to match the files as they are now (its sha256 checks pass)."""
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"] = {
        str(p.relative_to(path)): sha256_file(p) for p in sorted(path.rglob("*")) if p.is_file() and p.name != "manifest.json"
    }
    (path / "manifest.json").write_text(json.dumps(manifest))


def _checkpoint(config, path, damage: str, marker):
    model = build_model(config)
    names = [n for n, _ in model.named_parameters()]
    save_checkpoint(path, model=model, optimizer=None, trainable_names=names, ema=None, manifest={"stage": "texture", "step": 1})
    weights = path / "model" / WEIGHTS
    state = load_file(str(weights))
    victim = sorted(state)[0]
    if damage == "missing":
        del state[victim]
        save_file(state, str(weights))
    elif damage == "nan":
        state[victim] = state[victim].clone()
        state[victim].view(-1)[0] = float("nan")
        save_file(state, str(weights))
    else:  # a pickle instead of safetensors (one that runs code when unpickled)
        weights.unlink()
        (path / "model" / "diffusion_pytorch_model.bin").write_bytes(pickle.dumps(_Exploit(marker)))
    _reseal(path)
    return victim


def _expected(damage: str, victim: str) -> str:
    return {"missing": f"in no file \\({victim}", "nan": f"{victim} in {WEIGHTS} holds 1 NaN", "pickle": "only pickle weights"}[
        damage
    ]


def _training_init(config, checkpoint, tmp_path):
    from drape.training.loop.distributed import DistContext
    from drape.training.loop.state import prepare_training

    prepare_training(config, "texture", tmp_path / "stage", checkpoint, DistContext())


def _gate(config, checkpoint, tmp_path):
    from drape.gates.run import generate_outputs

    generate_outputs(config, checkpoint, {}, tmp_path / "gate")


def _eval(config, checkpoint, tmp_path):
    from drape.eval.session import run_eval

    run_eval(config, version=str(checkpoint), split="control", mode="paired", networks=object())  # type: ignore[arg-type]


def _inference(config, checkpoint, tmp_path, monkeypatch):
    from drape.inference import tryon

    monkeypatch.setattr(tryon, "captured_inputs", lambda config, inputs: ({"keys": []}, "captured"))
    monkeypatch.setattr(tryon, "choose_variant", lambda config, variant, home, device: (None, "eager"))
    tryon.render_tryons(config, out=tmp_path / "out", model=str(checkpoint))


ENTRY_POINTS = {"training init": _training_init, "gate": _gate, "eval": _eval, "inference": _inference}


@pytest.mark.parametrize("damage", ["missing", "nan", "pickle"])
def test_every_entry_point_refuses_a_missing_tensor_a_nan_and_a_pickle(config, tmp_path, monkeypatch, damage):
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "checkpoints" / "step-0000001"
    victim = _checkpoint(config, checkpoint, damage, marker)
    for name, entry in ENTRY_POINTS.items():
        arguments = (config, checkpoint, tmp_path / name.replace(" ", "-"))
        with pytest.raises(CheckpointError, match=_expected(damage, victim)) as refused:
            entry(*arguments, monkeypatch) if entry is _inference else entry(*arguments)
        assert str(checkpoint) in str(refused.value), name
    from drape.cli import app

    result = CliRunner().invoke(
        app, ["model", "export", "--checkpoint", str(checkpoint), "--format", "diffusers", "--out", str(tmp_path / "export")],
        env={"COLUMNS": "400"},
    )  # fmt: skip
    assert result.exit_code == 2 and "drape model export" in result.output, result.output
    assert (victim if damage != "pickle" else "pickle") in result.output.replace("\n", "")
    assert not (tmp_path / "export").exists() and not marker.exists()


def test_a_stage_checkpoint_with_a_nan_in_its_base_or_stage_tensors_is_refused(config, tmp_path):
    from drape.training.checkpoints.checkpoint import STAGE_FILE, load_model
    from drape.training.recipes.model import trainable_parameter_names

    model = build_model(config)
    names = trainable_parameter_names(
        ["transformer.transformer_blocks.*.attn.*"], [n for n, _ in model.named_parameters()], model.frozen_prefixes
    )
    path = save_checkpoint(tmp_path / "run" / "step-0000001", model=model, optimizer=None, trainable_names=names, ema=None,
                           manifest={"step": 1}, bases=tmp_path / "bases")  # fmt: skip
    stage = load_file(str(path / STAGE_FILE))
    stage[names[0]] = torch.full_like(stage[names[0]], float("inf"))
    save_file(stage, str(path / STAGE_FILE))
    _reseal(path)
    with pytest.raises(CheckpointError, match=f"{names[0]} in {STAGE_FILE} holds"):
        load_model(path)

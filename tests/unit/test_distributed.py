"""Sharded (DCP) checkpoints of drape/training/loop/distributed.py on one process: they load without
pickle, and a crafted `.metadata` is refused even when its manifest was rewritten to match.
(Several gloo ranks under torchrun: tests/integration/test_distributed.py.)"""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from drape.training.checkpoints.checkpoint import CheckpointError
from drape.training.loop.distributed import DistContext, ShardedCheckpointer, load_sharded


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _dcp_checkpoint(path):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    ShardedCheckpointer(DistContext(), use_async=False).save(path, model, optimizer, None, {"step": 1})
    return model


def test_a_dcp_checkpoint_loads_without_pickle(tmp_path):
    saved = _dcp_checkpoint(tmp_path / "step-0000001.dcp")
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_sharded(tmp_path / "step-0000001.dcp", model, optimizer, None)
    assert torch.equal(model.weight, saved.weight)
    assert optimizer.param_groups[0]["lr"] == 1e-3


def test_a_crafted_dcp_metadata_is_refused_even_with_a_matching_manifest(tmp_path):
    """The sha256 manifest proves integrity, not origin: an attacker rewrites both."""
    from drape.storage.checksum import sha256_file

    path = tmp_path / "step-0000001.dcp"
    _dcp_checkpoint(path)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][".metadata"] = sha256_file(path / ".metadata")
    (path / "manifest.json").write_text(json.dumps(manifest))
    model = torch.nn.Linear(4, 3)
    with pytest.raises(CheckpointError, match="DCP metadata refers to"):
        load_sharded(path, model, torch.optim.AdamW(model.parameters()), None)
    assert not marker.exists()


def _stage_model(config, seed: int = 0):
    """drape's tiny model with its attention training (an AdamW step taken), as a stage that trains part of it."""
    from drape.training.recipes.model import build_model, trainable_parameter_names

    model = build_model(config.model_copy(update={"seed": config.seed + seed}))
    patterns = ["transformer.transformer_blocks.*.attn.*"]
    names = trainable_parameter_names(patterns, [n for n, _ in model.named_parameters()], model.frozen_prefixes)
    parameters = dict(model.named_parameters())
    optimizer = torch.optim.AdamW([parameters[n] for n in names], lr=1e-3)
    for name in names:
        parameters[name].grad = torch.randn_like(parameters[name])
    optimizer.step()
    return model, names, optimizer


def test_a_dcp_checkpoint_holds_what_trains_and_reassembles_bit_for_bit(config, tmp_path):
    """Like a stage checkpoint: the trained tensors, their moments and EMA; the frozen rest named by
    the content hash a stage checkpoint's base has, and loading refuses a model whose rest differs."""
    from drape.training.checkpoints.checkpoint import read_manifest, save_checkpoint
    from drape.training.loop.distributed import _safe_dcp

    model, names, optimizer = _stage_model(config)
    ema = {n: t.detach().clone() + 1 for n, t in model.named_parameters() if n in names}
    path = tmp_path / "step-0000001.dcp"
    ShardedCheckpointer(DistContext(), use_async=False).save(path, model, optimizer, ema, {"step": 1})
    stored = _safe_dcp(path)[0].read_metadata().state_dict_metadata
    held = {key.removeprefix("model.") for key in stored if key.startswith("model.")}
    assert held == set(names) and {key.removeprefix("ema.") for key in stored if key.startswith("ema.")} == set(names)
    state = model.state_dict()
    trained_bytes = sum(state[n].numel() * state[n].element_size() for n in names)
    whole_bytes = sum(t.numel() * t.element_size() for t in state.values())
    on_disk = sum(p.stat().st_size for p in path.glob("*.distcp"))
    assert 4 * trained_bytes <= on_disk < 4 * trained_bytes + whole_bytes - trained_bytes  # weights, 2 moments, EMA
    stage = save_checkpoint(tmp_path / "step-0000002", model=model, optimizer=None, trainable_names=names, ema=None,
                            manifest={"step": 2}, bases=tmp_path / "bases")  # fmt: skip
    assert read_manifest(path)["frozen"]["sha256"] == read_manifest(stage)["base"]["sha256"]
    # load into the model the stage started from (the trained tensors as they were before training): bit for bit
    fresh, _, fresh_optimizer = _stage_model(config)
    fresh_ema = {n: torch.zeros_like(t) for n, t in ema.items()}
    with torch.no_grad():
        for name in names:
            dict(fresh.named_parameters())[name].zero_()
    load_sharded(path, fresh, fresh_optimizer, fresh_ema)
    assert all(torch.equal(t, state[n]) for n, t in fresh.state_dict().items())
    assert all(torch.equal(fresh_ema[n], ema[n]) for n in names)
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(saved[i][k], loaded[i][k]) for i in saved for k in saved[i])
    # a model whose frozen tensors are not those it trained with is refused, naming both hashes
    other, _, other_optimizer = _stage_model(config, seed=1)
    with pytest.raises(CheckpointError, match=read_manifest(path)["frozen"]["sha256"]):
        load_sharded(path, other, other_optimizer, None)

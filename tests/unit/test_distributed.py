"""Sharded (DCP) checkpoints of drape/training/distributed.py on one process: they load without
pickle, and a crafted `.metadata` is refused even when its manifest was rewritten to match.
(Several gloo ranks under torchrun: tests/integration/test_distributed.py.)"""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from drape.training.checkpoint import CheckpointError
from drape.training.distributed import DistContext, ShardedCheckpointer, load_sharded


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

"""The trainer as operators run it: `python -m drape.train`, no Prefect, killed with SIGKILL mid-stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from drape.training.checkpoints.checkpoint import list_checkpoints, load_model
from tests.conftest import tiny_config
from tests.integration.test_distributed import train_here

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _command(config_path: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "drape.train", "--config", str(config_path), "--stage", "texture", "--out", str(out)]


def test_sigkill_mid_stage_then_resume_equals_uninterrupted(tmp_path):
    config = tiny_config(tmp_path / "drape", train={"checkpoint_every": 10, "stages": {"texture": {"steps": 60}}})
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    # one thread in both: the uninterrupted reference trains in this process (its boundary is not the
    # subject, and a trainer process costs ~7 CPU s of imports), the killed and resumed runs in theirs
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    train_here(config_path, tmp_path / "reference")

    killed_dir = tmp_path / "killed"
    process = subprocess.Popen(_command(config_path, killed_dir), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not list_checkpoints(killed_dir / "checkpoints") and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    steps_at_kill = [int(p.name.split("-")[1]) for p in list_checkpoints(killed_dir / "checkpoints")]
    assert steps_at_kill and max(steps_at_kill) < 60, "the process finished before it could be killed"

    resumed = subprocess.run(_command(config_path, killed_dir), env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout.splitlines()[-1])["resumed_from_step"] == max(steps_at_kill)
    a = load_model(list_checkpoints(tmp_path / "reference" / "checkpoints")[-1]).state_dict()
    b = load_model(list_checkpoints(killed_dir / "checkpoints")[-1]).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)

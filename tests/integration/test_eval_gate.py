"""A gate with eval.fid_gate enabled fails a stage whose outputs are far, in FID, from its
baseline's: the failure line in the report beside the other checks' and the FID/KID results in
report.json (about 17 s: a tiny model sampled and the gate's checks judged on 6 control samples)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from drape.data.dataset import synthesize_split
from drape.gates.run import evaluate_gate
from drape.training.checkpoints.checkpoint import save_checkpoint
from drape.training.recipes.model import build_model
from tests.conftest import tiny_config
from tests.unit.test_eval_metrics import write_tiny_inception

pytestmark = pytest.mark.slow


def test_the_gate_fails_a_stage_by_fid_when_enabled(tmp_path):
    inception_path = str(write_tiny_inception(tmp_path / "inception.pt"))
    config = tiny_config(
        tmp_path / "drape",
        eval={
            "inception_path": inception_path,
            "kid_subset_size": 4,
            "fid_gate": {"enabled": True, "resamples": 10, "max_fid_increase": 0.0},
        },
    )
    control = synthesize_split(config, "control", 6)
    checkpoint = save_checkpoint(
        tmp_path / "checkpoint",
        model=build_model(config),
        optimizer=None,
        trainable_names=[],
        ema=None,
        manifest={"stage": "denoise", "step": 0},
    )
    baseline_dir = tmp_path / "baseline"
    baseline_dir.mkdir()
    for key, target in zip(control["keys"], control["target"]):  # a baseline that renders the targets
        Image.fromarray(target).save(baseline_dir / f"{key}.png")
    report = evaluate_gate(
        config,
        stage="denoise",
        run_id="r",
        checkpoint=checkpoint,
        control=control,
        control_set="c",
        gate_dir=tmp_path / "gate",
        baseline={"version": "1"},
        baseline_outputs_dir=baseline_dir,
    )
    written = json.loads((tmp_path / "gate" / "report.json").read_text())
    assert [check["name"] for check in written["distribution"]] == ["fid", "kid"]
    assert not report.passed and any(line.startswith("fid: ") for line in report.failures())
    assert written["distribution"][0]["failures"][0] in written["failures"]

"""`drape eval` end to end: a VITON-HD tree in its real layout imported and published, a tiny model
registered in MLflow (SQLite), feature networks the test builds and passes by path in the config,
the metrics beside the protocol, the results on the model version, and a run that resumes."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drape import STAGES
from drape.cli import app
from drape.data.dataset import dataset_prefix, import_dataset, publish_dataset
from drape.eval.session import run_eval
from drape.ops.tracking import Tracker
from drape.storage.store import open_store
from tests.conftest import register_untrained_baseline, tiny_config
from tests.unit.test_eval_metrics import write_alexnet_weights, write_tiny_inception
from tests.unit.test_importers import make_viton_hd

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """VITON-HD (6 test persons) as dataset viton/v1, model version 1, and the config file."""
    root = tmp_path_factory.mktemp("eval")
    weights = {
        "inception_path": str(write_tiny_inception(root / "inception.pt")),
        "lpips_backbone_path": str(write_alexnet_weights(root / "alexnet.pth")),
        "batch_size": 4,
    }
    config = tiny_config(root / "drape", data={"name": "viton", "version": "v1", "control_samples": 2}, eval=weights)
    source = make_viton_hd(root / "viton-hd", pairs=8, test=6)
    with tempfile.TemporaryDirectory() as scratch:
        import_dataset(
            source, scratch, name="viton", version="v1", resolution=32, control=2, weights=dict.fromkeys(STAGES, 1), max_samples=4
        )
        publish_dataset(scratch, open_store(config), dataset_prefix(config))
    return config, register_untrained_baseline(config, root)


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_paired_eval_prints_metrics_and_protocol_and_tags_the_version(registered):
    config, path = registered
    result = _cli("eval", "--version", "1", "--split", "test", "--mode", "paired", "--config", str(path))
    assert result.exit_code == 0, result.output
    for name in ("ssim", "lpips", "fid", "kid"):
        assert name in result.output
    shown = " ".join(result.output.split())
    assert "protocol: viton/v1 (VITON-HD) test_paired (paired): 6 samples at 32×32 px, clean resize" in shown
    assert "not comparable (resolution, samples differ)" in shown and "5.425" not in shown  # CatVTON's FID not beside it
    tags = Tracker(config).client.get_model_version(config.tracking.registered_model, "1").tags
    assert float(tags["drape.eval.test_paired.fid"]) >= 0 and 0 < float(tags["drape.eval.test_paired.ssim"]) <= 1
    assert tags["drape.eval.test_paired.run"]


def test_unpaired_eval_reports_fid_and_kid_only(registered):
    config, _ = registered
    result = run_eval(config, version="1", split="test", mode="unpaired")
    assert set(result["metrics"]) == {"fid", "kid", "kid_std"} and result["protocol"]["split"] == "test_unpaired"
    assert result["protocol"]["samples"] == 6


def test_an_interrupted_run_resumes_from_its_batches(registered):
    config, _ = registered
    first = run_eval(config, version="1", split="test", mode="paired")
    batches = sorted(Path(first["directory"]).glob("batch-*.npz"))
    assert len(batches) == 2  # 6 samples, 4 a batch
    batches[1].unlink()  # the run died before its last batch
    again = run_eval(config, version="1", split="test", mode="paired")
    assert again["resumed_batches"] == 1 and again["metrics"] == pytest.approx(first["metrics"])


def test_a_missing_weight_file_and_a_wrong_split_are_named(registered, tmp_path):
    config, _ = registered
    broken = config.model_copy(update={"eval": config.eval.model_copy(update={"inception_path": str(tmp_path / "gone.pt")})})
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(broken.model_dump(mode="json", by_alias=True)))
    result = _cli("eval", "--version", "1", "--mode", "paired", "--config", str(path))
    assert result.exit_code == 2 and "gone.pt: no such file; download it once from" in " ".join(result.output.split())
    result = _cli("eval", "--version", "1", "--split", "control", "--mode", "unpaired", "--config", str(path))
    assert result.exit_code == 2 and "expected --split test" in result.output

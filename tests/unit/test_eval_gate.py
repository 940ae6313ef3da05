"""The gates' FID/KID option: a bootstrap bound on the rise over the baseline, the report's format,
(the gate wired with it: tests/integration/test_eval_gate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from drape.config.eval import EvalConfig
from drape.eval.features import load_inception
from drape.eval.gate import distribution_checks
from tests.unit.test_eval_metrics import write_tiny_inception


@pytest.fixture(scope="module")
def inception_path(tmp_path_factory):
    return str(write_tiny_inception(tmp_path_factory.mktemp("weights") / "inception.pt"))


def _settings(path: str, **gate) -> EvalConfig:
    return EvalConfig(inception_path=path, kid_subset_size=8, fid_gate={"enabled": True, "resamples": 20, **gate})


def _targets(count: int = 16) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)


def test_the_same_outputs_as_the_baseline_pass(inception_path):
    targets = _targets()
    outputs = np.clip(targets.astype(int) + 10, 0, 255).astype(np.uint8)
    checks = distribution_checks(_settings(inception_path), targets, outputs, outputs.copy())
    assert [c.name for c in checks] == ["fid", "kid"]
    assert all(c.passed and c.rise_bound == pytest.approx(0.0, abs=1e-9) and c.candidate == c.baseline for c in checks)


def test_a_clear_regression_fails_with_a_line_naming_it(inception_path):
    targets = _targets()
    baseline = np.clip(targets.astype(int) + 5, 0, 255).astype(np.uint8)
    candidate = targets // 4  # much darker: another distribution
    network = load_inception(inception_path)
    fid, kid = distribution_checks(
        _settings(inception_path, max_fid_increase=0.01), targets, candidate, baseline, network=network
    )
    assert fid.candidate > fid.baseline and fid.rise_bound > 0.01 and not fid.passed
    (line,) = fid.failures()
    assert line.startswith(f"fid: {fid.candidate:.4f} vs the baseline's {fid.baseline:.4f} on 16 control samples")
    assert "above the allowed 0.0100 (eval.fid_gate)" in line
    assert fid.to_dict()["passed"] is False and fid.to_dict()["failures"] == [line]
    generous = distribution_checks(
        _settings(inception_path, max_fid_increase=1000, max_kid_increase=10), targets, candidate, baseline
    )
    assert all(check.passed for check in generous)


def test_the_gate_option_needs_the_inception_weights_path():
    with pytest.raises(ValueError, match=r"eval.fid_gate.enabled needs eval.inception_path"):
        EvalConfig(fid_gate={"enabled": True})
    assert EvalConfig().fid_gate.enabled is False  # off unless asked for

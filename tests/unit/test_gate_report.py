"""Gate verdicts: lower confidence bounds, value and change thresholds, reasons people can act on."""

import numpy as np
import pytest

from drape.gates.verdict.report import CheckResult, GateReport, bootstrap_lower_bound


def test_bootstrap_lower_bound_matches_a_direct_resampling():
    values = np.array([0.9] * 14 + [0.1, 0.2])
    rng = np.random.default_rng(0)
    reference = np.quantile(values[rng.integers(0, 16, size=(2000, 16))].mean(axis=1), 0.05)
    assert bootstrap_lower_bound(values) == pytest.approx(reference)
    assert bootstrap_lower_bound(values) < values.mean()
    assert bootstrap_lower_bound([0.7] * 10) == pytest.approx(0.7)


def test_a_few_bad_samples_cannot_hide_behind_a_good_average():
    good = {f"s{i}": 0.85 for i in range(16)}
    few_bad = {**{f"s{i}": 0.97 for i in range(13)}, "s13": 0.2, "s14": 0.2, "s15": 0.2}
    assert CheckResult("identity", good, 0.8).passed
    hiding = CheckResult("identity", few_bad, 0.8)
    assert hiding.mean > 0.8 and not hiding.passed
    assert hiding.failures()[0].startswith("identity: lower bound") and "< threshold 0.8000" in hiding.failures()[0]


def test_change_threshold_against_the_baseline():
    values = {f"s{i}": 0.9 for i in range(8)}
    assert CheckResult("texture", values, 0.5, baseline_mean=0.93, max_drop=0.05).passed
    dropped = CheckResult("texture", values, 0.5, baseline_mean=0.99, max_drop=0.05)
    assert dropped.value_passed and not dropped.passed
    assert "fell more than 0.0500 below the baseline's 0.9900" in dropped.failures()[0]
    first = CheckResult("texture", values, 0.5, max_drop=0.05, change_note="no baseline yet")
    assert first.passed and not first.change_checked and first.to_dict()["change"]["note"] == "no baseline yet"


def test_the_variant_that_set_a_tolerance_is_within_it():
    """A nuisance tolerance is the fall of a variant's mean; judged again, that variant falls by
    as much, whatever the order the floats were added in."""
    values = {f"s{i}": v for i, v in enumerate([0.311406, 0.458282, 0.749142, 0.476715, 0.355325, 0.550435])}
    tolerance = max(float(np.mean(np.ones(6)) - np.mean(list(values.values()))), 0.0)
    result = CheckResult("texture", values, 0.3, baseline_mean=1.0, max_drop=tolerance)
    assert result.change_passed
    assert not CheckResult("texture", values, 0.3, baseline_mean=1.0, max_drop=tolerance - 1e-6).change_passed


def test_report_needs_every_check_and_ranks_worst_samples():
    checks = {name: CheckResult(name, {"a": 0.9, "b": 0.4, "c": 0.7}, 0.1) for name in ("identity", "texture")}
    report = GateReport("geometry", "r", "ckpt", "control-x", checks)
    assert not report.passed  # coherence missing: a partial gate never passes
    assert report.worst_samples(1) == [("identity", "b", 0.4), ("texture", "b", 0.4)]
    data = report.to_dict()
    assert data["schema"] == "drape.gate_report/v4" and data["verdict"] == "fail"


def test_an_unset_threshold_blocks_promotion_and_off_reports_without_judging():
    """Unset blocks (a forgotten threshold never passes silently); "off" is said on purpose: the value
    is measured and reported, the check judges nothing, while its change check still applies."""
    values = {"a": -0.2, "b": 0.05, "c": 0.1}
    unset = CheckResult("texture", values, None)
    assert not unset.passed and unset.failures() == ["texture: no threshold configured, so nothing can be promoted"]
    off = CheckResult("texture", values, None, threshold_source="off")
    assert off.passed and off.failures() == [] and off.mean == pytest.approx(np.mean(list(values.values())))
    fallen = CheckResult("texture", values, None, threshold_source="off", baseline_mean=0.9, max_drop=0.05)
    assert not fallen.passed and "texture" in fallen.failures()[0]


def test_a_rule_failure_names_the_rule_that_fired_drift_or_distance():
    """Issue 67: the summary said 'fail the rule dlib distance 0.600' when the drift rule fired."""
    from drape.gates.verdict.report import SampleRule

    values = {f"s{i}": 0.8 for i in range(4)}
    drift = {"s0": 0.25, "s1": 0.1, "s2": 0.1, "s3": 0.1}
    distance, blurred = "dlib distance 0.600 (one person at ≤ 0.60)", "dlib distance of the 2 px blurred faces > 0.170"
    drifted = SampleRule(values, 0.4, 0.0, distance, drift=drift, max_drift=0.17, drift_terms=blurred)
    summary = drifted.failures("identity")[-1]
    assert summary == f"identity: 1 of 4 samples fail, more than 0.0%; the rule that fired: drifted ({blurred})"
    assert distance not in summary and drifted.to_dict()["fired"] == [f"drifted ({blurred})"]
    other = SampleRule({**values, "s1": 0.2}, 0.4, 0.0, distance, drift=drift, max_drift=0.17, drift_terms=blurred)
    assert other.failures("identity")[-1].endswith(f"the rules that fired: another person ({distance}); drifted ({blurred})")
    assert SampleRule(values, 0.4, 0.25, distance, drift=drift, max_drift=0.17).to_dict()["fired"] == []  # passed: none

"""The nuisance floor and tolerances: thresholds and change checks that accepted variation cannot trip."""

from __future__ import annotations

import numpy as np
import pytest

from drape.config import ConfigError
from drape.gates.run import check_scores, judge
from drape.gates.suites.corruptions import CORRUPTIONS, apply
from drape.gates.suites.nuisance import NUISANCE
from drape.gates.verdict.floor import NuisanceLevels, floors, nuisance_levels, nuisance_scores, tolerances
from drape.gates.verdict.render import check_cells
from drape.gates.verdict.report import bootstrap_lower_bound, recorded
from tests.conftest import tiny_config

MEASURED = {"min_similarity": "nuisance", "max_drop": "nuisance"}


GATES = {
    "identity": MEASURED,
    "texture": {"min_fidelity": "nuisance", "max_drop": "nuisance"},
    "coherence": {"min_score": "nuisance", "min_score_vs_baseline": "nuisance", "max_drop": "nuisance"},
}


@pytest.fixture(scope="module")
def measured_128(tmp_path_factory):
    """Six control samples at 128 px, the checks' default methods, every threshold and tolerance
    measured at the gate."""
    from drape.data.dataset import synthesize_split

    config = tiny_config(tmp_path_factory.mktemp("floor"), data={"resolution": 128}, gates=GATES)
    control = synthesize_split(config, "control", 6)
    targets = control["target"]
    own = {name: recorded(values) for name, values in check_scores(config, control, targets, targets).items()}
    # The baseline here is the targets themselves, so every score `nuisance_levels` computes (on the
    # targets, on the baseline, the baseline against itself) is one set: computed once (four times
    # took minutes at 128 px); `test_levels_against_a_baseline_are_floors_and_tolerances_of_its_scores`
    # checks `nuisance_levels` itself gives the same.
    scored = nuisance_scores(config, control, targets, targets)
    first = NuisanceLevels(floors(scored), {})
    against = NuisanceLevels(floors(scored), tolerances(scored, own))
    return config, control, first, against, scored


def _judge(config, control, outputs, levels, baseline_outputs=None):
    return judge(
        config,
        stage="denoise",
        run_id="r",
        checkpoint="c",
        control=control,
        control_set="x",
        outputs=outputs,
        baseline_outputs=baseline_outputs,
        baseline=None if baseline_outputs is None else {"version": "1"},
        levels=levels,
    )


def test_levels_against_a_baseline_are_floors_and_tolerances_of_its_scores(tmp_path):
    """What `measured_128` builds from one set of scores is what `nuisance_levels` gives (at 32 px:
    the same code, a fraction of the cost), with and without a baseline."""
    from drape.data.dataset import synthesize_split

    config = tiny_config(tmp_path, gates=GATES)
    control = synthesize_split(config, "control", 3)
    targets = control["target"]
    own = {name: recorded(values) for name, values in check_scores(config, control, targets, targets).items()}
    scored = nuisance_scores(config, control, targets, targets)
    assert nuisance_levels(config, control) == NuisanceLevels(floors(scored), {})
    against = nuisance_levels(config, control, baseline_outputs=targets, baseline_scores=own)
    assert against == NuisanceLevels(floors(scored), tolerances(scored, own))
    assert set(against.tolerance) == {"identity", "texture", "coherence"}


def test_the_floor_is_the_lowest_lower_bound_of_any_nuisance_variant(measured_128):
    config, control, first, _, scored = measured_128
    for check, level in first.floor.items():
        lowers = {name: bootstrap_lower_bound(scores[check]) for name, scores in scored.items()}
        assert level.value == min(lowers.values()) and lowers[level.variant] == level.value
        assert 0 < level.value < 1  # a perfect output scores 1; harmless variation costs something


def test_nuisance_passes_and_a_regression_fails_in_both_modes(measured_128):
    config, control, first, against, _ = measured_128
    targets, meta = control["target"], control["meta"]
    for name in ("jpeg q60", "shift 2 px", "brightness -6%"):
        varied = NUISANCE[name](targets, meta, np.random.default_rng(0))
        assert _judge(config, control, varied, first).passed, name
        assert _judge(config, control, varied, against, baseline_outputs=targets).passed, name
    for check, name in (
        ("identity", "another identity's face"),
        ("texture", "logo replaced by another"),
        ("coherence", "wrong pattern"),
    ):
        redrawn = apply(CORRUPTIONS[check][name], targets, meta, control["mask"])
        first_run, later = _judge(config, control, redrawn, first), _judge(config, control, redrawn, against, targets)
        for report in (first_run, later):
            failed = report.checks[check]
            assert not failed.passed, (name, failed.to_dict())
            assert failed.margin is not None and failed.margin < 0
        # against a baseline the change check catches it too, coherence on the ground-truth scale
        assert later.checks[check].change_checked and not later.checks[check].change_passed


def test_jpeg_trips_a_fixed_tight_change_check_but_never_the_nuisance_one(tmp_path, tiny_dataset):
    from drape.data.dataset import load_split

    directory, manifest, _ = tiny_dataset
    control = load_split(directory, manifest, "identity")
    targets = control["target"]
    jpeg = NUISANCE["jpeg q60"](targets, control["meta"], np.random.default_rng(0))
    drops = {"fixed": 0.001, "nuisance": "nuisance"}
    verdicts = {}
    for label, drop in drops.items():
        gates = {check: {"max_drop": drop} for check in ("identity", "texture", "coherence")}
        config = tiny_config(tmp_path / label, gates=gates)
        report = _judge(config, control, jpeg, None, baseline_outputs=targets)
        verdicts[label] = {name: check.change_passed for name, check in report.checks.items()}
        assert all(check.change_checked for check in report.checks.values())
    assert not all(verdicts["fixed"].values())
    assert all(verdicts["nuisance"].values())


def test_the_report_gives_floor_margin_and_sources(measured_128):
    config, control, first, _, _ = measured_128
    report = _judge(config, control, control["target"], first)
    identity = report.checks["identity"]
    assert identity.threshold == first.floor["identity"].value and identity.threshold_source.startswith("nuisance floor (")
    assert identity.margin == pytest.approx(identity.lower - identity.floor)
    data = identity.to_dict()
    assert data["method"] == "embedding" and data["nuisance_floor"] == identity.floor and data["margin"] > 0
    cells = {cells.check: cells for cells in check_cells(report)}
    assert cells["identity"].threshold.endswith("(floor)") and cells["identity"].floor.startswith(f"{identity.floor:.3f} (+")


@pytest.mark.parametrize(
    ("check", "allowed"), [("identity", "embedding"), ("texture", "correlation"), ("coherence", "structure")]
)
def test_the_removed_aligned_method_is_refused_naming_the_field_and_the_method_allowed(tmp_path, check, allowed):
    """The opt-in aligned checks were removed (docs/gates.md): a config that still names one fails
    at load, naming the field, what it got and the one method each check has."""
    with pytest.raises(ConfigError) as refused:
        tiny_config(tmp_path, gates={check: {"method": "aligned"}})
    message = str(refused.value)
    assert f"gates.{check}.method" in message and f"'{allowed}'" in message and "aligned" in message, message


def test_a_measured_threshold_needs_the_nuisance_floor(tmp_path):
    with pytest.raises(ConfigError, match="texture.min_fidelity 'nuisance'"):
        tiny_config(tmp_path, gates={"texture": {"min_fidelity": {"denoise": "nuisance"}}, "nuisance_floor": False})
    with pytest.raises(ConfigError, match="coherence.max_drop 'nuisance'"):
        tiny_config(tmp_path, gates={"coherence": {"max_drop": "nuisance"}, "nuisance_floor": False})
    with pytest.raises(ConfigError, match="max_drop"):
        tiny_config(tmp_path, gates={"identity": {"max_drop": "noise"}})


def test_a_threshold_above_the_floor_is_noted_not_failed(tmp_path, tiny_dataset):
    """At 32 px a 2-px shift costs the pixel embedder more than the tiny config's identity threshold
    allows: the report says so, and a perfect output still passes."""
    from drape.data.dataset import load_split
    from drape.gates.verdict.render import markdown

    directory, manifest, _ = tiny_dataset
    control = load_split(directory, manifest, "identity")
    report = _judge(tiny_config(tmp_path), control, control["target"], None)
    identity = report.checks["identity"]
    assert identity.passed and identity.floor is not None and identity.threshold > identity.floor
    assert report.notes()[0].startswith(f"identity: threshold {identity.threshold:.4f} is above the nuisance floor")
    assert report.to_dict()["notes"] == report.notes() and "- note: identity: threshold" in markdown(report)


def test_a_lower_bound_exactly_at_its_threshold_is_reported_as_zero_margin():
    """A threshold 'nuisance' without a floor margin is the floor, which the harmless variant that set
    it reaches exactly: it passes, and the report says it passed at zero margin; a hair above, no note."""
    from drape.gates.verdict.report import CheckResult, GateReport, SampleRule

    values = {"s0": 0.8, "s1": 0.8, "s2": 0.8}
    exact = CheckResult("identity", values, 0.8, threshold_source="nuisance floor (jpeg q60)", floor=0.8)
    assert exact.passed and exact.at_threshold() == (
        "identity: passed at zero margin: lower bound 0.8000 is exactly the threshold (nuisance floor (jpeg q60))"
    )
    assert CheckResult("identity", values, 0.79).at_threshold() == ""
    assert CheckResult("identity", values, 0.81).at_threshold() == ""  # failed: the failure says so, not a note
    text = SampleRule({"s0": 0.75, "s1": 0.75}, 1.0, 1.0, "PP-OCR text similarity", min_lower=0.75)
    texture = CheckResult("texture", values, 0.5, rule=text)
    assert (
        texture.at_threshold()
        == "texture: passed at zero margin: PP-OCR text similarity: lower bound 0.7500 is exactly its minimum"
    )
    report = GateReport("identity", "r", "c", "x")
    report.checks = {"identity": exact, "texture": texture}
    assert report.notes() == [exact.at_threshold(), texture.at_threshold()]

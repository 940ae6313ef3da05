"""The corruption suite: each check flags the corruptions aimed at it; clean outputs pass."""

import numpy as np
import pytest

from drape.data.dataset import synthesize_split
from drape.gates.suites.calibration import calibrate
from drape.gates.suites.corruptions import CLEAN, CORRUPTIONS, applicable, apply, logo_mirror, sleeve_missing
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    # the texture check's melted and mirrored terms at their defaults (the tiny config turns them off for its blurry model)
    texture = {"max_shift_pixels": 2, "mirror_penalty": 2.0, "sharpness_floor": 0.2}
    config = tiny_config(tmp_path_factory.mktemp("c") / "drape", data={"resolution": 64}, gates={"texture": texture})
    control = synthesize_split(config, "control", 40)
    thresholds, rows = calibrate(config, control, false_alarm=0.05)
    return control, thresholds, rows


def test_every_corruption_changes_the_image(suite):
    control, _, _ = suite
    for corruptions in CORRUPTIONS.values():
        for name, corruption in corruptions.items():
            corrupted = apply(corruption, control["target"], control["meta"], control["garment_mask"])
            changed = (corrupted != control["target"]).any(axis=(1, 2, 3))
            assert changed[applicable(corruption, control["meta"])].mean() > 0.9, name


def test_clean_variants_pass_their_calibrated_thresholds(suite):
    _, thresholds, rows = suite
    for row in rows:
        if not row.aimed:
            assert row.rate <= 0.05, (row.check, row.outputs)
            assert np.median(row.scores) > 0.85, (row.check, row.outputs)


def test_each_check_flags_the_corruptions_aimed_at_it(suite):
    """At the gate's level: the mean falls well past a 0.05 change threshold from clean outputs."""
    _, _, rows = suite
    for check in CORRUPTIONS:
        clean_mean = min(row.scores.mean() for row in rows if row.check == check and not row.aimed)
        for row in rows:
            if row.check == check and row.aimed:
                assert row.scores.mean() < clean_mean - 0.05, (check, row.outputs, row.scores.mean(), clean_mean)


def test_corruptions_are_caught_sample_by_sample(suite):
    _, _, rows = suite
    rates = {(row.check, row.outputs): row.rate for row in rows if row.aimed}
    for key in [
        ("identity", "another identity's face"),
        ("identity", "skin-tone shift"),
        ("identity", "face geometry warp"),
        ("texture", "logo blurred (melted)"),
        ("texture", "logo mirrored"),
        ("texture", "logo replaced by another"),
        ("coherence", "garment shifted 4 px"),
        ("coherence", "wrong pattern"),
        ("coherence", "sleeve missing"),
    ]:
        assert rates[key] >= 0.95, (key, rates[key])


def test_mirroring_a_symmetric_mark_or_unsleeving_a_dress_is_not_counted():
    meta = [{"garment": {"logo": "A", "category": "dress"}}, {"garment": {"logo": "R", "category": "tee"}}]
    assert applicable(logo_mirror, meta).tolist() == [False, True]
    assert applicable(sleeve_missing, meta).tolist() == [False, True]


def test_an_imported_sample_without_the_generators_meta_is_corrupted_and_counted_by_what_is_known():
    """VITON-HD's samples carry no drawn garment and OpenPose's keypoint names (drape.data.importers):
    `drape gate calibrate --control` on an imported control set stopped with KeyError 'garment', then
    'shoulder_l'. A print of unknown symmetry counts as mirrored; unknown sleeves are not counted."""
    meta = [{"keypoints": {"r_shoulder": (4.0, 6.0)}, "face_box": [2, 0, 10, 6]}, {"face_box": [2, 0, 10, 6]}]
    assert applicable(logo_mirror, meta).tolist() == [True, True]
    assert applicable(sleeve_missing, meta).tolist() == [False, False]
    images = np.full((2, 16, 12, 3), 200, dtype=np.uint8)
    images[:, :6] = 90  # the face, whose colour the bare arm takes
    masks = np.full((2, 16, 12), 255, dtype=np.uint8)
    corrupted = sleeve_missing(images, meta, np.random.default_rng(0), masks)
    assert (corrupted[0] != images[0]).any()  # below and outside OpenPose's right shoulder (the image's left)
    assert (corrupted[1] == images[1]).all()  # no shoulder: left as it is


def test_a_missing_sleeve_shows_the_bare_arm(suite):
    """The sleeve's pixels take the person's skin colour (read from the face), not the background."""
    control, _, _ = suite
    corrupted = apply(sleeve_missing, control["target"], control["meta"], control["garment_mask"])
    for i in np.nonzero(applicable(sleeve_missing, control["meta"]))[0][:5]:
        changed = (corrupted[i] != control["target"][i]).any(axis=-1)
        assert changed.sum() > 10
        colours = np.unique(corrupted[i][changed], axis=0)
        assert len(colours) == 1
        skin = np.array(control["meta"][i]["identity"]["skin"])
        assert np.abs(colours[0].astype(int) - skin).max() <= 40, (colours[0], skin)
    assert set(CLEAN) == {"mild noise", "jpeg q90"}


def test_gate_thresholds_sit_under_clean_lower_bounds_and_catch_a_regression():
    """At the gate's level (bootstrap lower bound of the mean): clean outputs fall below the
    threshold in at most `false_alarm` of redrawn control sets, a regression of the mean by 0.1
    in nearly all of them."""
    from drape.gates.suites.calibration import Row, gate_thresholds

    rng = np.random.default_rng(0)
    clean = np.clip(rng.normal(0.9, 0.05, 60), 0, 1)
    rows = [
        Row("identity", "jpeg q90", False, clean, 0.0),
        Row("identity", "mild noise", False, clean + 0.02, 0.0),
        Row("identity", "regressed", True, clean - 0.1, 0.0),
    ]
    thresholds, gate_rows = gate_thresholds(rows, false_alarm=0.05, redraws=100)
    rates = {row.outputs: row.rate for row in gate_rows}
    assert gate_rows[0].lower > thresholds["identity"] > gate_rows[2].lower
    assert rates["jpeg q90"] <= 0.05 and rates["mild noise"] <= 0.05
    assert rates["regressed"] >= 0.99


def test_calibrating_on_a_wider_clean_suite_lowers_every_threshold(tmp_path):
    """What must pass sets the thresholds: a 2 px shift accepted means thresholds at or below its scores."""
    from drape.gates.suites.nuisance import NUISANCE

    texture = {"max_shift_pixels": 2, "mirror_penalty": 2.0, "sharpness_floor": 0.2}
    config = tiny_config(tmp_path / "drape", data={"resolution": 64}, gates={"texture": texture})
    control = synthesize_split(config, "control", 24)
    narrow, _ = calibrate(config, control, false_alarm=0.05)
    wide, rows = calibrate(config, control, false_alarm=0.05, clean_suite={**CLEAN, "shift 2 px": NUISANCE["shift 2 px"]})
    assert all(wide[check] <= narrow[check] for check in narrow) and wide["identity"] < narrow["identity"]
    shifted = [row for row in rows if row.outputs == "shift 2 px"]
    assert {row.check for row in shifted} == set(CORRUPTIONS) and all(row.rate <= 0.05 for row in shifted)

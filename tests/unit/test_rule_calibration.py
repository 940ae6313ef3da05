"""Per-resolution calibration of the per-sample rules (`drape gate calibrate`): dlib's `max_drift` and
OCR's `min_text_lower` / `max_misread_share` from the harmless rows, with the margin stated; the
calibrated config written whole or not at all; the OCR check judges only marks its crops read alike;
price-tag marks drawn where asked, letter marks unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from drape.gates.checks.ocr import TextCheck, legible
from drape.gates.suites.calibrated import (
    calibrated_overlay,
    drift_setting,
    rule_settings,
    text_settings,
    write_calibrated,
)
from drape.gates.suites.calibration import Row
from tests.conftest import tiny_config


def _row(check: str, outputs: str, aimed: bool, scores, rule) -> Row:
    return Row(check, outputs, aimed, np.array(scores, float), 0.0, rule=None if rule is None else np.array(rule, float))


DRIFT_ROWS = [
    _row("identity", "jpeg q90", False, [0.8, 0.8, 0.8], [0.05, 0.12, np.nan]),
    _row("identity", "denoise median 3", False, [0.7, 0.8, 0.8], [0.20, 0.10, 0.08]),
    # a warped face the same-person rule still calls one person (0.45 ≥ 0.4) drifts 0.31; another person's (0.2) is left out
    _row("identity", "face geometry warp", True, [0.45, 0.2, 0.6], [0.31, 0.05, 0.40]),
]


def test_max_drift_is_the_largest_harmless_drift_plus_the_margin_rounded_up():
    setting = drift_setting(DRIFT_ROWS, same_similarity=0.4, margin=0.02)
    assert setting is not None and (setting.value, setting.level, setting.variant) == (0.22, 0.20, "denoise median 3")
    assert setting.weakest == (0.31, "face geometry warp")
    assert setting.line() == (
        "gates.identity.max_drift: 0.22   # harmless 0.200 (denoise median 3), margin 0.02; "
        "nearest corruption face geometry warp 0.310"
    )
    assert drift_setting([_row("identity", "jpeg q90", False, [0.8], None)], same_similarity=0.4, margin=0.02) is None


WARP_ROWS = [
    _row("identity", "jpeg q90", False, [0.8, 0.8, 0.8], [0.0012, 0.0009, np.nan]),
    _row("identity", "denoise + resampled 0.8 + shift 1 px", False, [0.7, 0.8, 0.8], [0.0064, 0.0089, 0.0052]),
    _row("identity", "face geometry warp", True, [0.45, 0.2, 0.6], [0.0300, 0.0010, 0.0250]),
]


def test_max_warp_is_the_largest_harmless_warp_plus_its_margin_to_four_decimals(tmp_path):
    """The face-warp rule is calibrated like dlib's drift, in its own units (a share of the face width):
    the largest harmless warp plus `--warp-margin`, rounded up to 4 decimals (2 would make 0.0099 a
    limit of 0.01 or 0.00)."""
    dlib = tiny_config(tmp_path / "drape", gates={"identity": {"embedder": "dlib", "max_warp": 0.01}})
    (setting,) = rule_settings(dlib, WARP_ROWS, drift_margin=0.02, text_margin=0.05, warp_margin=0.001)
    assert (setting.key, setting.value, setting.level) == ("gates.identity.max_warp", 0.0099, 0.0089)
    assert setting.weakest == (0.0250, "face geometry warp")  # the warped face dlib still calls the same person
    assert setting.line() == (
        "gates.identity.max_warp: 0.0099   # harmless 0.00890 (denoise + resampled 0.8 + shift 1 px), margin 0.001; "
        "nearest corruption face geometry warp 0.02500"
    )


def test_text_rules_are_the_lowest_harmless_lower_bound_less_the_margin_and_the_largest_misread_share():
    rows = [
        _row("texture", "jpeg q90", False, [0.9] * 4, [1, 1, 1, np.nan]),  # the last mark is not judged
        _row("texture", "jpeg q60", False, [0.9] * 4, [1, 0.5, 1, 1]),  # one of four read otherwise
        _row("texture", "logo replaced by another", True, [0.2] * 4, [0, 0.5, 0, np.nan]),
    ]
    lower, share = text_settings(rows, min_similarity=1.0, margin=0.05)
    assert lower.key == "gates.texture.min_text_lower" and lower.variant == "jpeg q60"
    assert lower.value == pytest.approx(np.floor((lower.level - 0.05) * 100) / 100) and lower.level < 1.0
    # one of four misread under jpeg q60, and one misread more passes: 2 of 4
    assert (share.key, share.value, share.level, share.variant) == ("gates.texture.max_misread_share", 0.5, 0.25, "jpeg q60")
    assert share.weakest == (1.0, "logo replaced by another")  # every judged sample of it misread
    assert share.line() == (
        "gates.texture.max_misread_share: 0.50   # harmless 0.250 (jpeg q60), margin 1 misread of 4 judged; "
        "nearest corruption logo replaced by another 1.000"
    )
    assert text_settings([_row("texture", "jpeg q90", False, [0.9], [np.nan])], min_similarity=1.0, margin=0.05) == []


def test_the_misread_share_keeps_a_margin_of_one_misread_and_names_what_it_lets_pass():
    rows = [
        _row("texture", "jpeg q60", False, [0.9] * 4, [1, 0.5, 1, 1]),  # one of four misread
        _row("texture", "logo elastic warp", True, [0.5] * 4, [0, 0.5, 1, 1]),  # two of four: by chance
        _row("texture", "logo replaced by another", True, [0.2] * 4, [0.0] * 4),
    ]
    _, share = text_settings(rows, min_similarity=1.0, margin=0.05)
    assert (share.value, share.margin, share.weakest) == (0.5, 0.25, (1.0, "logo replaced by another"))
    assert "margin 1 misread of 4 judged (lets pass what it stopped at 1 of 4: logo elastic warp 0.500)" in share.line()
    six = [_row("texture", "white balance warm", False, [0.9] * 6, [1, 0.5, 1, 1, 1, 1]), rows[2]]
    _, share = text_settings(six, min_similarity=1.0, margin=0.05)
    assert share.value == 0.34 and share.line().count("margin 1 misread of 6 judged;") == 1  # 2 of 6 pass, 3 of 6 fail
    # none misread under any harmless kind: one of six may (0.17), a changed text on every tag may not
    clean = [_row("texture", "jpeg q60", False, [0.9] * 6, [1.0] * 6), rows[2]]
    _, share = text_settings(clean, min_similarity=1.0, margin=0.05)
    assert (share.value, share.level, share.weakest) == (0.17, 0.0, (1.0, "logo replaced by another")), share


def test_rule_settings_follow_the_configured_recognizers(tmp_path):
    dlib = tiny_config(tmp_path / "drape", gates={"identity": {"embedder": "dlib", "max_drift": 0.17}})
    assert [s.key for s in rule_settings(dlib, DRIFT_ROWS, drift_margin=0.02, text_margin=0.05)] == ["gates.identity.max_drift"]
    pixel = tiny_config(tmp_path / "drape")
    assert rule_settings(pixel, DRIFT_ROWS, drift_margin=0.02, text_margin=0.05) == []


def test_the_calibrated_config_extends_its_source_and_keeps_nuisance_thresholds(tmp_path):
    source = tmp_path / "base.yaml"
    identity = {"embedder": "dlib", "max_drift": 0.17, "min_similarity": "nuisance"}
    gates = {"identity": identity, "texture": {"min_fidelity": 0.5, "ocr": "rapidocr"}, "coherence": {"min_score": 0.5}}
    config = tiny_config(tmp_path / "drape", gates=gates)
    source.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    settings = text_settings([_row("texture", "jpeg q60", False, [0.9] * 4, [1, 0.5, 1, 1])], min_similarity=1.0, margin=0.05) + [
        drift_setting(DRIFT_ROWS, same_similarity=0.4, margin=0.02)
    ]
    gate = {"identity": 0.555, "texture": 0.4199, "coherence": 0.631}
    overlay = calibrated_overlay(source, config, gate, settings, vs_baseline=False)
    assert overlay["extends"] == str(source.resolve())
    assert overlay["gates"]["identity"] == {"max_drift": 0.22}  # 'nuisance' stays: measured at each gate
    assert overlay["gates"]["texture"]["min_fidelity"] == 0.41 and overlay["gates"]["coherence"] == {"min_score": 0.63}
    written = tmp_path / "calibrated.yaml"
    write_calibrated(written, source, config, gate, settings, vs_baseline=False, note="test")
    from drape.config import load_config

    loaded = load_config(written)
    assert loaded.gates.texture.max_misread_share == 0.5 and loaded.gates.identity.min_similarity == "nuisance"
    assert written.read_text().startswith("# drape gate calibrate: test\n# gates.texture.min_text_lower:")
    with pytest.raises(ValueError, match="the file exists"):
        write_calibrated(written, source, config, gate, settings, vs_baseline=False, note="test")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "calibrated.yaml", "drape"]  # no temporary left


def test_a_calibrated_config_that_does_not_load_is_not_written(tmp_path):
    source = tmp_path / "base.yaml"
    config = tiny_config(tmp_path / "drape", gates={"texture": {"ocr": "rapidocr"}})
    source.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    never = text_settings([_row("texture", "jpeg q60", False, [0.9] * 2, [0, 0])], min_similarity=1.0, margin=0.05)
    bad = [s if s.key.endswith("lower") else type(s)(s.key, 2.0, 2.0, s.variant, 0.0, None) for s in never]  # a share of 2
    with pytest.raises(ValueError, match="max_misread_share"):
        write_calibrated(tmp_path / "out.yaml", source, config, {}, bad, vs_baseline=False, note="test")
    assert not (tmp_path / "out.yaml").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "drape"]


def test_a_mark_is_judged_only_when_every_crop_reads_it_alike():
    assert legible(("49", "49", "49")) and not legible(("a", "a", "ca")) and not legible(("", "", ""))

    class Reader:
        name, pads = "fake", (0.1, 0.0, -0.1)

        def __init__(self):
            self.calls = 0

        def read_crops(self, crops):
            self.calls += 1
            return ["a", "a", "ca"] if self.calls == 1 else ["$49"] * len(crops)

    check = TextCheck(Reader())
    image = np.zeros((32, 32, 3), np.uint8)
    assert np.isnan(check.scores(image[None], image[None], [(4, 4, 28, 20)], ["k"])[0])  # an arm over the mark: not judged


def test_price_marks_are_drawn_where_asked_and_letter_marks_stay_as_they_were():
    from drape.data.synth import LOGO_TEXTS, PRICE_TEXTS, make_garment, make_identity, make_sample

    letters = [make_garment(0, g) for g in range(12)]
    prices = [make_garment(0, g, "prices") for g in range(12)]
    assert {g.logo for g in letters} <= set(LOGO_TEXTS) and {g.logo for g in prices} <= set(PRICE_TEXTS)
    assert [g.colour for g in letters] == [g.colour for g in prices]  # the same garments, another mark
    with pytest.raises(ValueError, match="data.synthetic.marks 'words': expected one of letters, prices"):
        make_garment(0, 1, "words")
    identity = make_identity(0, 1)
    tag = make_sample(0, "control-00000", identity, prices[0], "down", 3, 128).meta["logo_box"]
    mark = make_sample(0, "control-00000", identity, letters[0], "down", 3, 128).meta["logo_box"]
    assert tag[2] - tag[0] > 1.3 * (mark[2] - mark[0])  # a price tag's plate is wider

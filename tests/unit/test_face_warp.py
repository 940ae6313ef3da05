"""Drift of the same face as local geometry (`drape.gates.recognizers.warp`): harmless changes stay under
production's `max_warp` on real portraits at 256 px, a 10% squash of the lower face and eyes set 10%
closer exceed it on every sample, and the gate's failure names the drift rule, not the distance rule."""

import io
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from benchmarks.cases.real_cases import FaceScene, drift_face, real_control, swap_face
from drape.config import GatesConfig, IdentityGateConfig
from drape.gates.checks.checks import build_embedder
from drape.gates.recognizers import RecognizerCheck
from drape.gates.recognizers.dlib_face import DlibRecognizer
from drape.gates.recognizers.warp import face_warp, face_warps
from drape.gates.suites.harmless import DRIFT_EXTRA, WIDER
from drape.gates.suites.nuisance import NUISANCE
from drape.gates.verdict.rules import sample_rule

PRODUCTION = Path(__file__).resolve().parents[2] / "configs" / "base" / "production.yaml"


@pytest.fixture(scope="module")
def control():
    """Four real samples at 256 px: the two portraits framed at random, twice each."""
    return real_control(256, 4, seed=0)


def _limit() -> float:
    return float(yaml.safe_load(PRODUCTION.read_text())["gates"]["identity"]["max_warp"])


def _scenes(control) -> list[FaceScene]:
    return [FaceScene(t, tuple(m["face_box"]), m["person"]) for t, m in zip(control["target"], control["meta"])]


def test_a_face_against_itself_and_moved_as_a_whole_has_no_warp(control):
    """Identical faces read (almost) 0; a shift, scale and turn of the whole picture is undone, not read."""
    targets, boxes = control["target"], [m["face_box"] for m in control["meta"]]
    assert np.all(face_warps(targets, targets, boxes) < 0.0015)
    turned = np.stack(
        [np.asarray(Image.fromarray(t).rotate(2.0, Image.Resampling.BICUBIC, translate=(1.5, -1.0))) for t in targets]
    )
    assert np.all(face_warps(turned, targets, boxes) < 0.004)


@pytest.mark.parametrize(
    "kind",
    ["jpeg q60", "resized 0.75", "shift 1 px", "denoise median 3", "sharpen r1.5 60%", "gamma 1.1", "shift 1 px + jpeg q75"],
)
def test_harmless_kinds_stay_under_the_production_limit(control, kind):
    change = {**NUISANCE, **WIDER, **DRIFT_EXTRA}[kind]
    outputs = change(control["target"], control["meta"], np.random.default_rng(0))
    warps = face_warps(outputs, control["target"], [m["face_box"] for m in control["meta"]])
    assert np.all(warps < _limit()), (kind, warps.round(4))


def test_drifts_of_the_same_face_exceed_the_production_limit_on_every_sample(control):
    scenes = _scenes(control)
    for top, bottom, axis in ((0.55, 1.0, 0), (0.3, 0.55, 1)):  # the lower face squashed 10%, the eyes set 10% closer
        warps = np.array([face_warp(drift_face(scene, top, bottom, 0.9, axis), scene.image, scene.box) for scene in scenes])
        assert np.all(warps > _limit()), (top, warps.round(4))


def test_a_box_that_is_not_a_face_box_is_refused_and_a_plain_face_is_not_judged(control):
    target = control["target"][0]
    with pytest.raises(ValueError, match="face box"):
        face_warp(target, target, (40, 40, 30, 80))
    flat = np.full_like(target, 128)
    assert np.isnan(face_warp(flat, flat, control["meta"][0]["face_box"]))  # no structure: nothing to judge


def _jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return np.asarray(Image.open(buffer))


def test_the_gate_names_the_drift_rule_for_a_drift_and_the_distance_rule_for_another_person(control):
    """dlib with `max_warp`: a JPEG copy is the same person, a squashed lower face drifted (dlib's
    own rule calls it the same person), a swapped face another person; each failure line and the
    summary name the rule that fired in its own terms."""
    scenes = _scenes(control)[:3]
    gates = GatesConfig(identity=IdentityGateConfig(embedder="dlib", max_warp=_limit(), max_mismatch_share=0.0))
    check = build_embedder(gates)
    assert isinstance(check, RecognizerCheck) and check.judges_drift and check.drift_limit == _limit()
    outputs = np.stack(
        [
            _jpeg(scenes[0].image, 75),
            drift_face(scenes[1], 0.55, 1.0, 0.9, 0),
            swap_face(scenes[2], "hopper" if scenes[2].person == "astronaut" else "astronaut"),
        ]
    )
    keys = ["good", "squashed", "swapped"]
    matches = check.matches(outputs, np.stack([s.image for s in scenes]), [s.box for s in scenes], keys)
    assert [m.outcome for m in matches] == ["same person", "drifted", "another person"]
    values = np.array([m.similarity for m in matches])
    drift = np.array([np.nan if m.drift is None else m.drift for m in matches])
    rule = sample_rule("identity", gates, check, keys, values, None, drift)["rule"]
    assert rule.outcomes()["drifted"] == ["squashed"] and rule.outcomes()["another person"] == ["swapped"]
    lines = rule.failures("identity")
    assert any(
        line.startswith("identity: drifted in 1 of 3 outputs (local geometry: a part of the face moved >") for line in lines
    )
    assert any(line.startswith("identity: another person in 1 of 3 outputs (dlib distance") for line in lines)
    only_drift = sample_rule("identity", gates, check, keys[:2], values[:2], None, drift[:2])["rule"]
    (summary,) = [line for line in only_drift.failures("identity") if "fired" in line]
    assert "the rule that fired: drifted (local geometry" in summary and "dlib distance" not in summary


def test_max_warp_is_a_recognizers_rule_and_one_drift_rule_at_a_time():
    assert IdentityGateConfig(embedder="arcface", onnx_model_path="/models/arcface.onnx", max_warp=0.01).max_warp == 0.01
    with pytest.raises(ValueError, match="max_warp is a recognizer's drift rule"):
        IdentityGateConfig(embedder="pixel", max_warp=0.01)
    with pytest.raises(ValueError, match="set one"):
        IdentityGateConfig(embedder="dlib", max_warp=0.01, max_drift=0.17)
    with pytest.raises(ValueError):
        IdentityGateConfig(embedder="dlib", max_warp=0.0)
    assert isinstance(
        build_embedder(GatesConfig(identity=IdentityGateConfig(embedder="dlib", max_warp=0.01))).recognizer, DlibRecognizer
    )

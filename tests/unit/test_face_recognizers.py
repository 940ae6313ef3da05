"""The identity gate's real recognizers on real faces: dlib (detection, landmarks, ResNet descriptor)
and ArcFace's template alignment with an ONNX embedder; "no face found" as its own outcome."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from benchmarks.cases.real_cases import drift_face, erase_face, face_scene, swap_face
from drape.config import GatesConfig, IdentityGateConfig
from drape.gates.checks.checks import build_embedder
from drape.gates.recognizers import ControlSetError, RecognizerCheck
from drape.gates.recognizers.arcface import ARCFACE_TEMPLATE, ArcFaceRecognizer, align_face, similarity_transform
from drape.gates.recognizers.dlib_face import DRIFT_DISTANCE, DlibRecognizer
from drape.gates.verdict.report import CheckResult, SampleRule


@pytest.fixture(scope="module")
def dlib_check():
    return RecognizerCheck(DlibRecognizer())  # 0.3 s: loaded once


@pytest.fixture(scope="module")
def scenes():
    rng = np.random.default_rng(0)
    return [face_scene(person, 256, rng) for person in ("astronaut", "hopper", "astronaut")]


def _jpeg(image, quality):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return np.asarray(Image.open(buffer))


def _run(check, outputs, scenes):
    keys = [f"s{i}" for i in range(len(scenes))]
    sources = np.stack([scene.image for scene in scenes])
    return keys, check.matches(np.stack(outputs), sources, [scene.box for scene in scenes], keys)


def test_dlib_reads_the_same_person_through_harmless_changes(dlib_check, scenes):
    for edit in (lambda x: _jpeg(x, 75), lambda x: np.clip(x * 1.06, 0, 255).astype(np.uint8), lambda x: np.roll(x, 1, axis=1)):
        _, matches = _run(dlib_check, [edit(scene.image) for scene in scenes], scenes)
        assert [match.outcome for match in matches] == ["same person"] * 3
        assert all(1 - match.similarity < 0.3 for match in matches)  # dlib distance


def test_dlib_reads_a_swapped_face_as_another_person(dlib_check, scenes):
    swapped = [swap_face(scene, "hopper" if scene.person == "astronaut" else "astronaut") for scene in scenes]
    _, matches = _run(dlib_check, swapped, scenes)
    assert [match.outcome for match in matches] == ["another person"] * 3
    assert all(1 - match.similarity > 0.6 for match in matches)


def test_no_face_found_is_its_own_outcome_never_a_low_score(dlib_check, scenes):
    rng = np.random.default_rng(1)
    outputs = [scenes[0].image, erase_face(scenes[1], rng), scenes[2].image]
    keys, matches = _run(dlib_check, outputs, scenes)
    assert [match.outcome for match in matches] == ["same person", "no face found", "same person"]
    values = dlib_check.scores(np.stack(outputs), np.stack([s.image for s in scenes]), [s.box for s in scenes], keys)
    assert np.isnan(values[1]) and values[0] == pytest.approx(1.0) and values[2] == pytest.approx(1.0)
    by_key = dict(zip(keys, values.tolist()))
    result = CheckResult("identity", by_key, 0.5, rule=SampleRule(by_key, 0.4, 0.0, "dlib distance"))
    assert result.mean == pytest.approx(1.0) and result.lower == pytest.approx(1.0)  # the similarities of faces found
    assert result.rule.outcomes() == {"no face found": ["s1"], "another person": []}
    assert result.value_passed and not result.passed
    assert "identity: no face found in 1 of 3 outputs: s1" in result.failures()
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))  # JSON without NaN
    assert data["values"]["s1"] is None and data["rule"]["no face found"] == ["s1"]
    allowed = CheckResult("identity", by_key, 0.5, rule=SampleRule(by_key, 0.4, 0.34, "dlib distance"))
    assert allowed.passed


def test_a_drifted_face_fails_per_sample_a_harmless_copy_does_not(scenes):
    """The same person with the eyes set closer or the lower face squashed: dlib's same-person rule
    passes it, the drift rule (blurred faces' descriptors) does not; JPEG q60 and a 1 px shift do."""
    check = RecognizerCheck(DlibRecognizer(max_drift=DRIFT_DISTANCE))
    drifted = [drift_face(scenes[0], 0.3, 0.55, 0.75, 1), drift_face(scenes[1], 0.55, 1.0, 0.75, 0)]
    harmless = [_jpeg(scenes[2].image, 60), np.roll(scenes[2].image, 1, axis=1)]
    keys, matches = _run(check, drifted, scenes[:2])
    assert [m.outcome for m in matches] == ["drifted"] * 2 and all(m.same and m.drift > DRIFT_DISTANCE for m in matches)
    _, kept = _run(check, harmless, [scenes[2]] * 2)
    assert [m.outcome for m in kept] == ["same person"] * 2 and all(m.drift < DRIFT_DISTANCE for m in kept)
    values = {key: m.similarity for key, m in zip(keys, matches)}
    drift = {key: m.drift for key, m in zip(keys, matches)}
    rule = SampleRule(values, 0.4, 0.0, "dlib distance", drift=drift, max_drift=DRIFT_DISTANCE, drift_terms="drift")
    assert rule.outcomes()["drifted"] == keys and not rule.passed
    assert any(line.startswith("identity: drifted in 2 of 2 outputs (drift)") for line in rule.failures("identity"))
    gates = GatesConfig(identity=IdentityGateConfig(embedder="dlib", max_drift=0.2))
    assert (
        build_embedder(gates).judges_drift
        and not build_embedder(GatesConfig(identity=IdentityGateConfig(embedder="dlib"))).judges_drift
    )
    with pytest.raises(ValueError, match="max_drift is dlib's drift rule"):
        IdentityGateConfig(embedder="pixel", max_drift=0.2)


def test_a_source_without_a_face_is_an_error_naming_the_sample(dlib_check, scenes):
    blank = erase_face(scenes[0], np.random.default_rng(2))
    sources = np.stack([blank, scenes[1].image])
    with pytest.raises(ControlSetError, match=r"no face in the face box of 1 of 2 control targets \(k0\)") as error:
        dlib_check.matches(np.stack([scenes[0].image, scenes[1].image]), sources, [scenes[0].box, scenes[1].box], ["k0", "k1"])
    assert error.value.keys == ["k0"]


def test_config_builds_recognizers_and_states_rules_in_their_terms():
    check = build_embedder(GatesConfig(identity=IdentityGateConfig(embedder="dlib", same_person=0.5)))
    assert isinstance(check, RecognizerCheck) and check.recognizer.same_person == pytest.approx(0.5)
    assert "dlib distance 0.500" in check.recognizer.in_own_terms(0.5)
    with pytest.raises(ValueError, match="needs onnx_model_path"):
        IdentityGateConfig(embedder="arcface")
    with pytest.raises(ValueError, match="same_person is a recognizer's rule"):
        IdentityGateConfig(embedder="pixel", same_person=0.5)
    with pytest.raises(ValueError, match="expected a dlib distance"):
        IdentityGateConfig(embedder="dlib", same_person=3.0)


def test_similarity_transform_recovers_a_known_similarity():
    angle, scale, shift = np.deg2rad(23.0), 1.7, np.array([12.5, -4.0])
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    moved = ARCFACE_TEMPLATE @ (scale * rotation).T + shift
    matrix = similarity_transform(moved, ARCFACE_TEMPLATE)  # back onto the template
    np.testing.assert_allclose(moved @ matrix[:, :2].T + matrix[:, 2], ARCFACE_TEMPLATE, atol=1e-9)
    np.testing.assert_allclose(matrix[:, :2], rotation.T / scale, atol=1e-12)
    mirrored = ARCFACE_TEMPLATE * [-1, 1]  # a reflection is not a similarity: the fit stays a rotation
    assert np.linalg.det(similarity_transform(mirrored, ARCFACE_TEMPLATE)[:, :2]) > 0


def test_align_face_puts_the_landmarks_on_the_template():
    """Five blobs drawn where a tilted, scaled face's landmarks are land on the template's points
    (their centroids within 0.1 px)."""
    angle, scale = np.deg2rad(-15.0), 2.3
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    points = (ARCFACE_TEMPLATE - 56) @ (scale * rotation).T + [200, 180]
    image = np.zeros((400, 400, 3), np.uint8)
    for k, (x, y) in enumerate(points):
        ys, xs = np.mgrid[0:400, 0:400]
        blob = 255 * np.exp(-((xs - x) ** 2 + (ys - y) ** 2) / (2 * 3.0**2))  # σ 3 px, a channel per dot
        image[..., k % 3] = np.maximum(image[..., k % 3], blob.round().astype(np.uint8))
    aligned = align_face(image, points).astype(np.float64)
    for k, expected in enumerate(ARCFACE_TEMPLATE):
        channel = aligned[..., k % 3].copy()
        ys, xs = np.mgrid[0:112, 0:112]
        near = (xs - expected[0]) ** 2 + (ys - expected[1]) ** 2 <= 64
        weight = channel * near
        centre = np.array([(weight * xs).sum(), (weight * ys).sum()]) / weight.sum()
        assert np.linalg.norm(centre - expected) < 0.1, (k, centre, expected)


@pytest.fixture(scope="module")
def arcface_model(tmp_path_factory):
    """A small ArcFace-shaped ONNX model (112×112 RGB in [-1, 1] → 64-D), exported here."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 5, stride=4),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(64),
    )
    net(torch.zeros(1, 3, 112, 112))
    path = tmp_path_factory.mktemp("arcface") / "tiny.onnx"
    torch.onnx.export(net.eval(), (torch.zeros(1, 3, 112, 112),), str(path), input_names=["input"], dynamo=False)
    return path


def test_arcface_recognizer_aligns_then_embeds(arcface_model, scenes):
    recognizer = ArcFaceRecognizer(arcface_model)
    check = RecognizerCheck(recognizer)
    keys, matches = _run(check, [scene.image for scene in scenes], scenes)
    assert [match.similarity for match in matches] == pytest.approx([1.0] * 3)
    face = recognizer.aligned(scenes[0].image, scenes[0].box)
    assert face is not None and face.shape == (112, 112, 3)
    _, erased = _run(check, [erase_face(scenes[0], np.random.default_rng(3)), scenes[1].image, scenes[2].image], scenes)
    assert erased[0].outcome == "no face found" and "ArcFace cosine" in recognizer.in_own_terms(0.3)
    with pytest.raises(FileNotFoundError, match="onnx_model_path"):
        ArcFaceRecognizer(arcface_model.parent / "missing.onnx")


def test_floors_and_tolerances_leave_no_face_outcomes_out_of_the_similarities():
    from drape.gates.verdict.floor import floors, tolerances

    scored = {"blur": {"identity": np.array([np.nan] * 4)}, "jpeg": {"identity": np.array([0.9, np.nan, 0.8, 0.85])}}
    level = floors(scored)["identity"]
    assert level.variant == "jpeg" and 0.8 <= level.value <= 0.9  # the all-NaN variant sets no floor of NaN
    drop = tolerances(scored, {"identity": np.array([0.95, 0.95, 0.95, np.nan])})["identity"]
    assert drop.variant == "jpeg" and drop.value == pytest.approx(0.95 - 0.85)


def test_the_production_config_gates_on_real_recognizers():
    from pathlib import Path

    from drape.config import load_config

    gates = load_config(Path(__file__).parents[2] / "configs" / "h100.yaml").gates
    check = build_embedder(gates)
    assert isinstance(check, RecognizerCheck) and check.name == "dlib" and check.judges_drift
    assert gates.texture.ocr == "rapidocr" and gates.nuisance_suite == "wide" and gates.floor_margin["identity"] > 0

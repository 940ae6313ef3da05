"""Each gate check on crafted inputs: it passes what is right and catches what is wrong."""

import json

import numpy as np
import pytest
from PIL import Image, ImageFilter

from drape.data.dataset import load_split
from drape.gates.checks.checks import (
    OnnxFaceEmbedder,
    PixelFaceEmbedder,
    codec_view,
    coherence_scores,
    handedness,
    identity_scores,
    patch_fidelity,
    shifted_fidelities,
    texture_scores,
)
from drape.gates.run import judge
from drape.gates.verdict.report import CheckResult, GateReport


@pytest.fixture(scope="module")
def control(tiny_dataset):
    directory, manifest, _ = tiny_dataset
    return load_split(directory, manifest, "identity")


def _boxes(control, name):
    return [m[name] for m in control["meta"]]


def _other_identity(control):
    ids = [m["identity_id"] for m in control["meta"]]
    order = [next(j for j, other in enumerate(ids) if other != identity) for identity in ids]
    return control["target"][order]


def test_identity_same_face_scores_one_other_faces_low(control):
    embedder, boxes = PixelFaceEmbedder(), _boxes(control, "face_box")
    same = identity_scores(control["target"], control["target"], boxes, embedder)
    np.testing.assert_allclose(same, 1.0, atol=1e-5)
    other = identity_scores(_other_identity(control), control["target"], boxes, embedder)
    assert other.mean() < 0.75 and other.max() < same.min()


def test_identity_tolerates_noise_but_not_a_skin_tone_shift(control):
    embedder, boxes = PixelFaceEmbedder(), _boxes(control, "face_box")
    rng = np.random.default_rng(0)
    noisy = np.clip(control["target"] + rng.normal(0, 6, control["target"].shape), 0, 255).astype(np.uint8)
    assert identity_scores(noisy, control["target"], boxes, embedder).mean() > 0.9
    shifted = np.clip(control["target"].astype(int) + [60, -30, -60], 0, 255).astype(np.uint8)
    assert identity_scores(shifted, control["target"], boxes, embedder).mean() < 0.8


def _logo_edit(control, edit, pad=2):
    """Apply `edit` to the logo box grown by `pad` px: the damage reaches past the shift tolerance."""
    images = control["target"].copy()
    for image, box in zip(images, _boxes(control, "logo_box")):
        x0, y0 = max(int(round(box[0])) - pad, 0), max(int(round(box[1])) - pad, 0)
        x1, y1 = int(round(box[2])) + pad, int(round(box[3])) + pad
        image[y0:y1, x0:x1] = edit(image[y0:y1, x0:x1])
    return images


def test_texture_tolerates_small_shifts_but_not_blur_mirror_or_swap(control):
    targets, boxes = control["target"], _boxes(control, "logo_box")
    assert np.allclose(texture_scores(targets, targets, boxes, 1), 1.0)
    shifted = np.roll(targets, (1, -1), axis=(1, 2))
    assert texture_scores(shifted, targets, boxes, 1).mean() > 0.99
    blur = lambda patch: np.asarray(Image.fromarray(patch).filter(ImageFilter.BoxBlur(2)))  # noqa: E731
    assert texture_scores(_logo_edit(control, blur), targets, boxes, 1).mean() < 0.8
    flat = lambda patch: np.broadcast_to(patch.reshape(-1, 3).mean(0), patch.shape).astype(np.uint8)  # noqa: E731
    assert texture_scores(_logo_edit(control, flat), targets, boxes, 1).mean() < 0.1
    assert texture_scores(np.roll(targets, 1, axis=0), targets, boxes, 1).mean() < 0.6  # another garment's logo


def _mark(letter_l: bool = True) -> np.ndarray:
    """A 40×40 image with a 16×16 mark on a grey plate: an 'L' (asymmetric) or a 'T' (symmetric)."""
    image = np.full((40, 40, 3), 120, np.uint8)
    if letter_l:
        image[12:28, 12:15] = 20
        image[25:28, 12:26] = 20
    else:
        image[12:15, 12:28] = 20
        image[12:28, 18:22] = 20
    return image


def test_texture_penalises_a_mirrored_mark_but_not_a_symmetric_one_and_scales_down_a_melted_one():
    box = [[10, 10, 30, 30]]
    for letter_l in (True, False):
        target = _mark(letter_l)[None]
        mirrored = target.copy()
        mirrored[0, 10:30, 10:30] = target[0, 10:30, 10:30][:, ::-1]
        plain = texture_scores(mirrored, target, box, 2, mirror_penalty=0, sharpness_floor=0)[0]
        scored = texture_scores(mirrored, target, box, 2)[0]
        if letter_l:  # an 'L' mirrored is a 'J'-like mark: fidelity alone leaves some, the penalty takes it
            assert scored < plain - 0.2 and scored < 0.3
        else:  # a 'T' mirrored is a 'T'
            assert scored == pytest.approx(1.0)
    target = _mark()[None]
    melted = target.copy()
    melted[0, 8:32, 8:32] = np.asarray(Image.fromarray(target[0, 8:32, 8:32]).filter(ImageFilter.GaussianBlur(3)))
    plain = texture_scores(melted, target, box, 2, mirror_penalty=0, sharpness_floor=0)[0]
    assert texture_scores(melted, target, box, 2)[0] < 0.5 * plain  # correlation survives blur; sharpness does not
    assert texture_scores(target, target, box, 2)[0] == pytest.approx(1.0)


def test_handedness_reads_a_small_mark_on_a_large_plate():
    """A 4x3 px 'L' on a plate in a window of background: plate and background dominate plain
    correlation (mirrored, the window still correlates 0.8 or more with the mark); handedness reads
    only what tells the mark from its mirror image."""
    image = np.full((1, 32, 32, 3), 40, dtype=np.uint8)
    image[0, 8:20, 8:24] = (30, 60, 200)  # plate, centred in the window
    image[0, 12:16, 14] = image[0, 15, 14:17] = (250, 220, 40)  # the 'L', left of the centre line
    mirrored = image.copy()
    mirrored[0, 4:24, 4:28] = image[0, 4:24, 4:28][:, ::-1]
    box = [[4, 4, 28, 24]]
    view, seen = codec_view(image[0]), codec_view(mirrored[0])
    reference = view[4:24, 4:28]
    flipped = codec_view(np.ascontiguousarray(image[0, :, ::-1]))[4:24, 4:28]
    assert patch_fidelity(seen[4:24, 4:28], reference) > 0.8
    assert handedness(reference, reference, flipped) == pytest.approx(1.0)
    assert handedness(seen[4:24, 4:28], reference, flipped) < -0.8
    blob = np.asarray(Image.fromarray(image[0]).filter(ImageFilter.GaussianBlur(4)))
    assert abs(handedness(codec_view(blob)[4:24, 4:28], reference, flipped)) < 0.5
    assert handedness(reference, reference, reference) == 1.0  # symmetric: nothing to tell
    assert texture_scores(mirrored, image, box, 2, sharpness_floor=0)[0] < 0
    assert texture_scores(image, image, box, 2)[0] == pytest.approx(1.0)


def test_coherence_counts_a_local_defect_in_full():
    image = np.full((64, 64, 3), 200, np.uint8)
    image[16:56, 16:48] = (40, 90, 160)  # the garment
    mask = np.zeros((64, 64), np.uint8)
    mask[12:60, 12:52] = 255
    sleeve = image.copy()
    sleeve[40:56, 16:24] = 200  # one corner painted over with background: a sleeve gone
    assert coherence_scores(image[None], image[None], mask[None])[0] == pytest.approx(1.0)
    assert coherence_scores(sleeve[None], image[None], mask[None])[0] < 0.6


def test_patch_fidelity_catches_a_mirrored_mark():
    mark = np.zeros((12, 12, 3), np.uint8)
    mark[2:10, 2:4] = 255  # an "L"
    mark[8:10, 2:9] = 255
    assert patch_fidelity(mark, mark) == pytest.approx(1.0)
    assert patch_fidelity(mark[:, ::-1], mark) < 0.5


def test_the_shift_search_scores_each_window_as_patch_fidelity_does():
    """`shifted_fidelities` (three correlations) against `patch_fidelity` called on each window, as
    texture_scores searched before: on a codec view of noise with a flat corner and a mark."""
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (30, 34, 3)).astype(np.uint8)
    image[:12, :14] = 90  # flat: every window inside it scores 0
    region, reference = codec_view(image), codec_view(image)[9:19, 11:22]
    values = shifted_fidelities(region, reference)
    assert values.shape == (30 - 10 + 1, 34 - 11 + 1)
    expected = [
        [patch_fidelity(region[r : r + 10, c : c + 11], reference) for c in range(values.shape[1])]
        for r in range(values.shape[0])
    ]
    assert np.abs(values - np.array(expected)).max() < 1e-9
    assert values[9, 11] == pytest.approx(1.0) and values[0, 0] == 0.0 and int(np.argmax(values)) == 9 * values.shape[1] + 11


def test_coherence_structure_not_pixels(control):
    targets, masks = control["target"], control["mask"]
    assert np.allclose(coherence_scores(targets, targets, masks), 1.0)
    rng = np.random.default_rng(1)
    resampled = np.clip(targets + rng.normal(0, 8, targets.shape), 0, 255).astype(np.uint8)  # same garment, other trajectory
    assert coherence_scores(resampled, targets, masks).mean() > 0.8
    assert coherence_scores(np.roll(targets, 1, axis=0), targets, masks).mean() < 0.5
    grey = np.full_like(targets, 128)
    assert coherence_scores(grey, targets, masks).mean() < 0.05


def test_missing_threshold_blocks_promotion():
    check = CheckResult("texture", {"a": 0.9}, None)
    assert not check.passed and "no threshold configured" in check.failures()[0]
    report = GateReport("texture", "run", "ckpt", "control-x", {"texture": check})
    assert not report.passed


def test_report_names_check_value_and_threshold(config, control):
    report = judge(
        config,
        stage="identity",
        run_id="r1",
        checkpoint="c",
        control=control,
        control_set="control-abc",
        outputs=np.full_like(control["target"], 128),
        baseline_outputs=None,
        baseline=None,
    )
    assert not report.passed
    data = json.loads(json.dumps(report.to_dict()))
    assert data["verdict"] == "fail" and data["control_set"] == "control-abc"
    assert set(data["checks"]) == {"identity", "texture", "coherence"}
    assert data["checks"]["identity"]["threshold"] == 0.50
    assert len(data["checks"]["identity"]["values"]) == len(control["keys"])
    assert any(reason.startswith("identity: lower bound") and "< threshold 0.5000" in reason for reason in report.failures())
    assert data["checks"]["coherence"]["reference"].startswith("ground-truth targets")


def test_onnx_embedder(tmp_path, control):
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weights = rng.normal(size=(3 * 8 * 8, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["embedding"])],
        "tiny-face",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", 16])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.flatten())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "face.onnx"
    onnx.save(model, path)
    embedder, boxes = OnnxFaceEmbedder(path), _boxes(control, "face_box")
    np.testing.assert_allclose(identity_scores(control["target"], control["target"], boxes, embedder), 1.0, atol=1e-5)
    assert identity_scores(_other_identity(control), control["target"], boxes, embedder).mean() < 0.99
    with pytest.raises(FileNotFoundError, match="onnx_model_path"):
        OnnxFaceEmbedder(tmp_path / "missing.onnx")


def test_provenance_refuses_an_earlier_stage_or_untrained_checkpoint(config, tmp_path):
    import torch

    from drape.gates.run import provenance_problems
    from drape.gates.verdict.report import GateReport
    from drape.training.checkpoints.checkpoint import CheckpointError, model_tensor_names, read_model_tensors, save_checkpoint
    from drape.training.recipes.model import build_model

    start_model = build_model(config)
    start = save_checkpoint(
        tmp_path / "identity-baseline",
        model=start_model,
        optimizer=None,
        trainable_names=[],
        ema=None,
        manifest={"stage": "identity", "data_manifest_hash": "d1"},
    )
    assert provenance_problems(config, start, stage="texture", data_manifest_hash="d1", start_checkpoint=start) == [
        "provenance: the candidate was trained for stage 'identity', not 'texture'",
        f"provenance: the stage's trainable parameters ({len(_trainable(config, start_model))} tensors) are identical to "
        "its starting checkpoint identity-baseline: the stage did not train",
    ]
    trained = build_model(config)
    trained.load_state_dict(start_model.state_dict())
    with torch.no_grad():
        dict(trained.named_parameters())[_trainable(config, trained)[0]].add_(0.01)
    candidate = save_checkpoint(
        tmp_path / "texture-candidate",
        model=trained,
        optimizer=None,
        trainable_names=[],
        ema=None,
        manifest={"stage": "texture", "data_manifest_hash": "d1"},
    )
    assert provenance_problems(config, candidate, stage="texture", data_manifest_hash="d1", start_checkpoint=start) == []
    assert provenance_problems(config, candidate, stage="texture", data_manifest_hash="d2") == [
        "provenance: the candidate was trained on dataset d1, this run's is d2"
    ]
    report = GateReport("texture", "r", str(candidate), "control-x", provenance=["provenance: x"])
    assert not report.passed and report.failures()[0] == "provenance: x" and report.to_dict()["provenance"] == ["provenance: x"]
    # it reads the trainable tensors from the safetensors files, never the whole model
    names = _trainable(config, trained)
    read = read_model_tensors(candidate, names)
    assert set(read) == set(names) and set(names) < set(model_tensor_names(candidate))
    assert torch.equal(read[names[0]], dict(trained.named_parameters())[names[0]].detach())
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        read_model_tensors(candidate, ["nope"])


def _trainable(config, model) -> list[str]:
    from drape.training.recipes.model import trainable_parameter_names

    return trainable_parameter_names(config.train.stages["texture"].trainable, [n for n, _ in model.named_parameters()])


def test_judge_uses_the_vs_baseline_coherence_threshold_only_with_baseline_outputs(config, control):
    gates = config.gates.model_copy(
        update={"coherence": config.gates.coherence.model_copy(update={"min_score": 0.2, "min_score_vs_baseline": 0.97})}
    )
    cfg = config.model_copy(update={"gates": gates})
    noisy = np.clip(control["target"] + np.random.default_rng(0).normal(0, 8, control["target"].shape), 0, 255).astype(np.uint8)
    kwargs = dict(stage="texture", run_id="r", checkpoint="c", control=control, control_set="x", outputs=noisy)
    first = judge(cfg, baseline_outputs=None, baseline=None, **kwargs).checks["coherence"]
    assert first.threshold == 0.2 and first.passed
    later = judge(cfg, baseline_outputs=control["target"], baseline={"version": "3"}, **kwargs).checks["coherence"]
    assert later.threshold == 0.97 and not later.passed and later.reference == "baseline v3 outputs"

"""drape's MTCNN (P-, R-, O-Net with facenet-pytorch's weights) on real portraits: the faces found,
their five landmarks against dlib's, none on a texture, and the ArcFace path aligned by it."""

import numpy as np
import pytest

from benchmarks.cases.real_cases import erase_face, face_scene, portrait, texture
from drape.gates.recognizers import RecognizerCheck
from drape.gates.recognizers.mtcnn import Mtcnn, nms, weights_folder

# dlib's 68 landmarks reduced to ArcFace's five (eye centres, nose tip, mouth corners) on the full
# portraits: drape.gates.recognizers.arcface.five_points on dlib's HOG detection, measured once
DLIB_FIVE = {
    "astronaut": [[203.2, 101.5], [246.5, 104.2], [225.0, 127.0], [201.0, 139.0], [246.0, 141.0]],
    "hopper": [[223.7, 192.3], [305.3, 189.2], [267.0, 238.0], [233.0, 281.0], [300.0, 277.0]],
}


@pytest.fixture(scope="module")
def mtcnn():
    return Mtcnn()  # the weights from the installed facenet-pytorch wheel's data folder


@pytest.mark.parametrize("person", ["astronaut", "hopper"])
def test_mtcnn_finds_the_portrait_face_and_its_five_landmarks(mtcnn, person):
    faces = mtcnn.detect(portrait(person))
    assert len(faces) == 1 and faces[0].probability > 0.99
    x0, y0, x1, y1 = faces[0].box
    points, reference = faces[0].points, np.array(DLIB_FIVE[person])
    assert x0 < points[:, 0].min() and points[:, 0].max() < x1 and y0 < points[:, 1].min() and points[:, 1].max() < y1
    eye_distance = np.linalg.norm(reference[1] - reference[0])
    assert np.linalg.norm(points - reference, axis=1).max() < 0.15 * eye_distance  # within a few pixels of dlib's


def test_mtcnn_finds_no_face_on_a_texture(mtcnn):
    assert mtcnn.detect(texture("brick", 160, np.random.default_rng(0))) == []
    with pytest.raises(ValueError, match="RGB uint8"):
        mtcnn.detect(np.zeros((32, 32), np.uint8))


def test_nms_keeps_the_best_of_overlapping_boxes():
    boxes = np.array([[0, 0, 10, 10, 0.9], [1, 1, 11, 11, 0.95], [20, 20, 30, 30, 0.5], [2, 2, 6, 6, 0.8]], float)
    assert nms(boxes, 0.5) == [1, 3, 2]  # best first; the small box overlaps the union little
    assert nms(boxes, 0.5, by_min=True) == [1, 2]  # but lies inside the larger one


def test_weights_from_a_folder_that_lacks_them_is_a_clear_error(tmp_path):
    assert {p.name for p in weights_folder().iterdir()} >= {"pnet.pt", "rnet.pt", "onet.pt"}
    with pytest.raises(FileNotFoundError, match="lacks pnet.pt, rnet.pt, onet.pt"):
        Mtcnn(tmp_path)


def _tiny_arcface(path):
    """A small ArcFace-shaped ONNX model (112×112 RGB in [-1, 1] → 32-D), exported here."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 8, stride=8), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 32))
    torch.onnx.export(net.eval(), (torch.zeros(1, 3, 112, 112),), str(path), input_names=["input"], dynamo=False)
    return path


def test_arcface_aligned_by_mtcnn(tmp_path):
    from drape.config import IdentityGateConfig
    from drape.gates.recognizers import build_recognizer

    model = _tiny_arcface(tmp_path / "tiny.onnx")
    check = build_recognizer("arcface", model_path=str(model), detector="mtcnn")
    assert isinstance(check, RecognizerCheck) and IdentityGateConfig(embedder="arcface", onnx_model_path="m", detector="mtcnn")
    rng = np.random.default_rng(0)
    scenes = [face_scene(person, 256, rng) for person in ("astronaut", "hopper")]
    sources, boxes, keys = np.stack([s.image for s in scenes]), [s.box for s in scenes], ["a", "h"]
    assert check.scores(sources, sources, boxes, keys) == pytest.approx([1.0, 1.0])
    face = check.recognizer.aligned(scenes[0].image, scenes[0].box)
    assert face is not None and face.shape == (112, 112, 3)
    erased = np.stack([erase_face(scenes[0], rng), scenes[1].image])
    assert [m.outcome for m in check.matches(erased, sources, boxes, keys)] == ["no face found", "same person"]

"""ArcFace-family recognizers from a local ONNX file, on faces aligned to the 112×112 template.

ArcFace (and the models trained like it: CosFace, MagFace, AdaFace) read a face only as it was
aligned in training: five landmarks (eye centres, nose tip, mouth corners) moved by a similarity
transform (rotation, uniform scale, translation; least squares, Umeyama 1991) onto fixed points of
a 112×112 crop (`ARCFACE_TEMPLATE`, insightface's). The landmarks come from MTCNN (`detector:
mtcnn`, `drape.gates.recognizers.mtcnn`: the detector ArcFace's training crops were aligned with,
its weights from facenet-pytorch's wheel) or from dlib's 68-point predictor on its HOG detection
(`detector: dlib`; `face-recognition-models` ships it). Two embeddings are one person at a cosine
of at least `SAME_PERSON_COSINE` (about a 0.1% false-accept rate for ArcFace R100 on IJB-C).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from drape.gates.recognizers.dlib_face import HogFinder, model_file

ARCFACE_TEMPLATE = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]], dtype=np.float64
)
SAME_PERSON_COSINE = 0.28
LANDMARKS_68 = "shape_predictor_68_face_landmarks.dat"


def similarity_transform(source: np.ndarray, destination: np.ndarray) -> np.ndarray:
    """The 2×3 similarity transform (rotation, uniform scale, translation) that maps `source`
    points (N, 2) onto `destination` (N, 2) with the least squared error (Umeyama 1991)."""
    source, destination = np.asarray(source, np.float64), np.asarray(destination, np.float64)
    if source.shape != destination.shape or source.ndim != 2 or source.shape[1] != 2 or len(source) < 2:
        raise ValueError(f"similarity_transform: expected two (N ≥ 2, 2) point sets, got {source.shape} and {destination.shape}")
    mean_s, mean_d = source.mean(axis=0), destination.mean(axis=0)
    centred_s, centred_d = source - mean_s, destination - mean_d
    covariance = centred_d.T @ centred_s / len(source)
    u, singular, vt = np.linalg.svd(covariance)
    sign = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:  # a reflection is not a similarity: flip the weakest axis
        sign[1, 1] = -1
    rotation = u @ sign @ vt
    variance = (centred_s**2).sum() / len(source)
    if variance <= 0:
        raise ValueError("similarity_transform: the source points coincide")
    scale = float(np.trace(np.diag(singular) @ sign)) / variance
    matrix = np.zeros((2, 3))
    matrix[:, :2] = scale * rotation
    matrix[:, 2] = mean_d - scale * rotation @ mean_s
    return matrix


def align_face(image: np.ndarray, points: np.ndarray, size: int = 112) -> np.ndarray:
    """`image` (uint8 H×W×3) warped so that its five `points` (x, y) land on `ARCFACE_TEMPLATE`
    (scaled to `size`): uint8 size×size×3, bilinear. Points and template are in pixel indices (a
    pixel's centre at its index), as landmark detectors and OpenCV's `warpAffine` have them."""
    matrix = similarity_transform(points, ARCFACE_TEMPLATE * (size / 112.0))
    # PIL samples at pixel centres (index + 0.5): the same map in its coordinates
    matrix[:, 2] += 0.5 - matrix[:, :2].sum(axis=1) * 0.5
    inverse = np.linalg.inv(np.vstack([matrix, [0, 0, 1]]))[:2]  # PIL maps output pixels to input ones
    warped = Image.fromarray(np.ascontiguousarray(image)).transform(
        (size, size), Image.Transform.AFFINE, tuple(inverse.ravel()), resample=Image.Resampling.BILINEAR
    )
    return np.asarray(warped)


def five_points(shape) -> np.ndarray:
    """ArcFace's five landmarks from dlib's 68: eye centres (36-41, 42-47), nose tip (30), mouth
    corners (48, 54); the subject's right eye (the image's left) first, as the template has it."""
    xy = np.array([[shape.part(i).x, shape.part(i).y] for i in range(68)], dtype=np.float64)
    return np.stack([xy[36:42].mean(axis=0), xy[42:48].mean(axis=0), xy[30], xy[48], xy[54]])


def _landmark_source(detector: str, folder: str | Path | None):
    """(image, box) -> (crop, its five points) or None: MTCNN's (`folder`: its weights) or dlib's
    HOG detection and 68 landmarks reduced to five (`folder`: dlib's .dat files)."""
    if detector == "mtcnn":
        from drape.gates.recognizers.mtcnn import MtcnnLandmarks

        return MtcnnLandmarks(folder).locate
    if detector != "dlib":
        raise ValueError(f"gates.identity.detector {detector!r}: expected 'dlib' or 'mtcnn'")
    import dlib

    finder, predictor = HogFinder(), dlib.shape_predictor(str(model_file(folder, LANDMARKS_68)))

    def locate(image: np.ndarray, box):
        located = finder.locate(image, box)
        if located is None:
            return None
        crop, rectangle = located
        return crop, five_points(predictor(crop, rectangle))

    return locate


class ArcFaceRecognizer:
    """MTCNN's five landmarks (or HOG detection and dlib's 68 reduced to five), the template alignment and an
    ONNX embedding (input (N, 3, S, S) RGB in [-1, 1]); similarity is the embeddings' cosine."""

    name = "arcface"

    def __init__(
        self,
        model_path: str | Path,
        *,
        same_cosine: float = SAME_PERSON_COSINE,
        landmarks_dir: str | Path | None = None,
        detector: str = "dlib",
    ):
        import onnxruntime

        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"gates.identity.onnx_model_path: {path} does not exist (an ArcFace-family ONNX model)")
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        model_input = self.session.get_inputs()[0]
        self.input_name = model_input.name
        self.size = int(model_input.shape[-1]) if isinstance(model_input.shape[-1], int) else 112
        self.locate = _landmark_source(detector, landmarks_dir)
        self.same_person = same_cosine

    def aligned(self, image: np.ndarray, box) -> np.ndarray | None:
        """The face in `box` aligned to the template (uint8 S×S×3); None when no face is found."""
        located = self.locate(image, box)
        if located is None:
            return None
        crop, points = located
        return align_face(crop, points, self.size)

    def describe(self, image: np.ndarray, box) -> np.ndarray | None:
        face = self.aligned(image, box)
        if face is None:
            return None
        batch = (face.astype(np.float32).transpose(2, 0, 1)[None] / 127.5 - 1.0).astype(np.float32)
        embedding = self.session.run(None, {self.input_name: batch})[0][0].astype(np.float64)
        return embedding / max(float(np.linalg.norm(embedding)), 1e-8)

    def similarity(self, a: np.ndarray, b: np.ndarray) -> float:
        return float(np.dot(a, b))

    def in_own_terms(self, similarity: float) -> str:
        return f"ArcFace cosine {similarity:.3f} (one person at ≥ {self.same_person:.2f})"

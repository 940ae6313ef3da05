"""dlib's face recognizer: HOG detection, 5-point landmarks, the ResNet descriptor (99.38% on LFW).

The weights (`shape_predictor_5_face_landmarks.dat`, `dlib_face_recognition_resnet_model_v1.dat`)
ship in the `face-recognition-models` wheel; they are read from its installed folder (or a
configured one), never downloaded. The detector runs on the control sample's face box grown by
`PAD` and resized so the box is `FACE_PIXELS` wide (HOG finds faces from about 80 px; a 1024 px
try-on's face is 150-250 px, a 128 px one's 20-30), and of its detections the one that overlaps the
box most, by at least `MIN_OVERLAP`, is the face; none: no face found. The descriptor aligns the
face itself from the landmarks (dlib's `get_face_chip`, 150×150); two descriptors are one person at
a euclidean distance of at most 0.6 (dlib's published rule).

Drift of the same face (eyes set closer, a squashed jaw) is still one person by that rule: a
recognizer is built to forgive it. `drift` measures it apart: the distance of descriptors of the
face crops blurred by `DRIFT_BLUR` px (the crop's face box 160 px wide), on the same landmarks. The
blur takes away the fine detail a delivery path changes (sharpening, a median filter, resampling:
the harmless suite's largest plain distances, up to 0.24 at 256 px), not the face's geometry: on
40 real samples at 256 px the harmless suite's largest blurred distance is 0.127 and the smallest
drift's 0.210, where without the blur they overlap (0.240 against 0.217; docs/recognizers.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter

from drape.gates.recognizers import box_region

PAD, FACE_PIXELS, MIN_OVERLAP = 0.6, 160, 0.3
LANDMARKS, DESCRIPTOR = "shape_predictor_5_face_landmarks.dat", "dlib_face_recognition_resnet_model_v1.dat"
SAME_PERSON_DISTANCE = 0.6
# σ of the drift descriptor's blur in the crop's pixels, and the largest drift distance of the same
# face at the default: the harmless suite's largest (0.127, 40 samples at 256 px) plus a margin of
# about half the gap to the smallest drift (0.210)
DRIFT_BLUR, DRIFT_DISTANCE = 2.0, 0.17


def packaged_models() -> Path:
    """The `face_recognition_models` package's model folder (found without importing it: its
    `__init__` needs setuptools' pkg_resources)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("gates.identity.embedder 'dlib' needs the face-recognition-models package (pip install it)")
    return Path(next(iter(spec.submodule_search_locations))) / "models"


def _overlap(a, b) -> float:
    """Intersection over union of two (x0, y0, x1, y1) boxes."""
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def model_file(folder: str | Path | None, file: str) -> Path:
    """`file` in `folder` (default: the packaged models), which must exist."""
    path = (Path(folder) if folder else packaged_models()) / file
    if not path.is_file():
        raise FileNotFoundError(f"gates.identity: {path} does not exist (dlib's {file})")
    return path


class HogFinder:
    """dlib's HOG face detector, run on a control sample's face box (`locate`)."""

    def __init__(self) -> None:
        import dlib

        self.detector = dlib.get_frontal_face_detector()

    def locate(self, image: np.ndarray, box):
        """(the face crop resized, its dlib rectangle) for the detection in `box`; None if none."""
        x0, y0, x1, y1 = box_region(box, image.shape, PAD)
        scale = FACE_PIXELS / max(float(box[2]) - float(box[0]), 1.0)
        size = (max(1, round((x1 - x0) * scale)), max(1, round((y1 - y0) * scale)))
        crop = np.asarray(Image.fromarray(np.ascontiguousarray(image[y0:y1, x0:x1])).resize(size, Image.Resampling.BICUBIC))
        expected = [
            (float(box[0]) - x0) * scale,
            (float(box[1]) - y0) * scale,
            (float(box[2]) - x0) * scale,
            (float(box[3]) - y0) * scale,
        ]
        for upsample in (0, 1):
            found = self.detector(crop, upsample)
            scored = [(_overlap([r.left(), r.top(), r.right(), r.bottom()], expected), r) for r in found]
            scored = [(overlap, r) for overlap, r in scored if overlap >= MIN_OVERLAP]
            if scored:
                return crop, max(scored, key=lambda item: item[0])[1]
        return None


class DlibRecognizer:
    """dlib's detector, landmarks and descriptor; similarity is 1 less the descriptors' distance.
    A face's descriptor is two rows: the plain crop's (the same-person rule) and the blurred crop's
    (`drift`); `max_drift` (a distance, None: not judged) is the largest drift of the same face."""

    name = "dlib"

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        same_distance: float = SAME_PERSON_DISTANCE,
        max_drift: float | None = None,
    ):
        import dlib

        self.finder = HogFinder()
        self.landmarks = dlib.shape_predictor(str(model_file(model_dir, LANDMARKS)))
        self.descriptor = dlib.face_recognition_model_v1(str(model_file(model_dir, DESCRIPTOR)))
        self.same_person = 1.0 - same_distance
        self.max_drift = max_drift

    def describe(self, image: np.ndarray, box) -> np.ndarray | None:
        """(2, 128): the descriptors of the face crop and of the crop blurred by `DRIFT_BLUR` (without
        `max_drift` the plain one twice: the blurred one costs a second pass of the network)."""
        located = self.finder.locate(image, box)
        if located is None:
            return None
        crop, rectangle = located
        shape = self.landmarks(crop, rectangle)
        plain = np.array(self.descriptor.compute_face_descriptor(crop, shape), dtype=np.float64)
        if self.max_drift is None:
            return np.stack([plain, plain])
        blurred = np.clip(gaussian_filter(crop.astype(np.float64), (DRIFT_BLUR, DRIFT_BLUR, 0)), 0, 255)
        smooth = np.ascontiguousarray(blurred.round().astype(np.uint8))
        return np.stack([plain, np.array(self.descriptor.compute_face_descriptor(smooth, shape), dtype=np.float64)])

    def similarity(self, a: np.ndarray, b: np.ndarray) -> float:
        return 1.0 - float(np.linalg.norm(a[0] - b[0]))

    def drift(self, a: np.ndarray, b: np.ndarray) -> float:
        """The blurred crops' descriptor distance: how far the same face moved."""
        return float(np.linalg.norm(a[1] - b[1]))

    def in_own_terms(self, similarity: float) -> str:
        return f"dlib distance {1.0 - similarity:.3f} (one person at ≤ {1.0 - self.same_person:.2f})"

    def drift_terms(self) -> str:
        return f"dlib distance of the {DRIFT_BLUR:g} px blurred faces > {self.max_drift:.3f} (the same face drifted)"

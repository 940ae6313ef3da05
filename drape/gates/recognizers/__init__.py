"""Face recognizers for the identity gate: detection, landmarks, alignment and a descriptor.

A recognizer answers, per control sample, one of three things about the output's face against the
source's: the same person (with its similarity), another person, or no face found at all. No face
found is its own outcome, never a low score: a similarity of a face the detector never saw would
be a number about nothing. Similarities are on one scale, higher is closer, in the recognizer's
own terms: dlib's is 1 less the euclidean distance of its 128-D descriptors (its published
same-person rule is a distance of at most 0.6, a similarity of at least 0.4); ArcFace's is the
cosine of its embeddings (about 0.28 at a 0.1% false-accept rate).

- `dlib_face.DlibRecognizer`: dlib's HOG detector, 5-point landmarks and ResNet descriptor
  (weights from the `face-recognition-models` package, read from its installed path).
- `arcface.ArcFaceRecognizer`: any ArcFace-family ONNX model from a local path, fed crops
  aligned by the standard similarity transform of five landmarks onto the 112×112 template.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class FaceRecognizer(Protocol):
    name: str
    same_person: float  # the similarity at or above which the recognizer calls two faces one person

    def describe(self, image: np.ndarray, box) -> np.ndarray | None:
        """The descriptor of the face in `box` of RGB uint8 `image`; None when no face is found there."""

    def similarity(self, a: np.ndarray, b: np.ndarray) -> float:
        """Two descriptors' similarity in the recognizer's own terms (higher: closer)."""

    def in_own_terms(self, similarity: float) -> str:
        """`similarity` as the recognizer's literature states it (e.g. 'distance 0.41')."""


@dataclass(frozen=True)
class FaceMatch:
    """One sample's outcome: `similarity` is None when no face was found in the output; `drift`
    (a recognizer's own distance, None: not measured) and `drifted`: the same person, whose face
    moved further than the recognizer's `max_drift`."""

    similarity: float | None
    same: bool
    drift: float | None = None
    drifted: bool = False

    @property
    def outcome(self) -> str:
        if self.similarity is None:
            return "no face found"
        if not self.same:
            return "another person"
        return "drifted" if self.drifted else "same person"


class ControlSetError(ValueError):
    """The control set cannot be judged as it is (a source face the recognizer does not find): bad
    input, not a failed gate (the CLI exits 2, never 1). Names every sample at fault."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys


def faceless_message(recognizer: str, keys: list[str], total: int) -> str:
    """The error text for control samples whose target's face `recognizer` does not find."""
    shown = ", ".join(keys[:10]) + (" …" if len(keys) > 10 else "")
    return (
        f"control set: {recognizer} finds no face in the face box of {len(keys)} of {total} control targets ({shown}); "
        "the identity check cannot judge a sample without a source face: make the control set again "
        "(data.synthetic.faces: portraits) or fix those samples' face_box"
    )


class SourceCache:
    """Descriptors of source faces by content: the gate compares every nuisance variant and the
    candidate with the same control targets, so each source face is described once."""

    def __init__(self, recognizer: FaceRecognizer, limit: int = 4096):
        self.recognizer, self.limit = recognizer, limit
        self.found: dict[str, np.ndarray | None] = {}

    def describe(self, image: np.ndarray, box, key: str) -> np.ndarray | None:
        """The source face's descriptor, None when the recognizer finds none (`match_faces` refuses the set)."""
        digest = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest() + repr([round(float(v), 2) for v in box])
        if digest not in self.found:
            if len(self.found) >= self.limit:
                self.found.clear()
            self.found[digest] = self.recognizer.describe(image, box)
        return self.found[digest]


def match_faces(
    recognizer: FaceRecognizer, cache: SourceCache, outputs: np.ndarray, sources: np.ndarray, boxes: list, keys: list[str]
) -> list[FaceMatch]:
    """Per sample, the output's face against the source's (`FaceMatch`); a source without a face is
    a `ControlSetError` naming every such sample (bad input: no output is judged)."""
    references = [cache.describe(source, box, key) for source, box, key in zip(sources, boxes, keys)]
    faceless = [key for key, reference in zip(keys, references) if reference is None]
    if faceless:
        raise ControlSetError(faceless_message(recognizer.name, faceless, len(keys)), faceless)
    matches = []
    for output, reference, box in zip(outputs, [found for found in references if found is not None], boxes):
        seen = recognizer.describe(output, box)
        if seen is None:
            matches.append(FaceMatch(None, False))
            continue
        similarity = recognizer.similarity(seen, reference)
        limit = getattr(recognizer, "max_drift", None)
        drift = recognizer.drift(seen, reference) if limit is not None else None  # type: ignore[attr-defined]
        same = similarity >= recognizer.same_person
        matches.append(FaceMatch(similarity, same, drift, same and drift is not None and drift > limit))
    return matches


def drift_values(matches: list[FaceMatch]) -> np.ndarray:
    """Per sample, the drift distance (NaN: no face found or drift not measured)."""
    return np.array([np.nan if match.drift is None else match.drift for match in matches], dtype=np.float64)


def recognizer_scores(matches: list[FaceMatch]) -> np.ndarray:
    """The identity check's per-sample values: each similarity clipped to [0, 1], NaN where no
    face was found (`drape.gates.verdict.report` counts those apart, never as a low score)."""
    return np.array([np.nan if match.similarity is None else float(np.clip(match.similarity, 0.0, 1.0)) for match in matches])


def box_region(box, shape: tuple[int, ...], pad: float) -> tuple[int, int, int, int]:
    """The pixel window (x0, y0, x1, y1) of `box` grown by `pad` of its size on each side, inside the image."""
    x0, y0, x1, y1 = (float(v) for v in box)
    if not all(np.isfinite([x0, y0, x1, y1])) or x1 <= x0 or y1 <= y0:
        raise ValueError(f"face box {list(box)}: expected finite [x0, y0, x1, y1] with x1 > x0 and y1 > y0")
    grow_x, grow_y = (x1 - x0) * pad, (y1 - y0) * pad
    height, width = shape[:2]
    left, top = max(int(np.floor(x0 - grow_x)), 0), max(int(np.floor(y0 - grow_y)), 0)
    right, bottom = min(int(np.ceil(x1 + grow_x)), width), min(int(np.ceil(y1 + grow_y)), height)
    if right - left < 2 or bottom - top < 2:
        raise ValueError(f"face box {list(box)} lies outside the {width}×{height} image")
    return left, top, right, bottom


class RecognizerCheck:
    """The identity check through a recognizer: per-sample similarities (NaN: no face found in
    the output), each source face described once (`SourceCache`). With `max_warp`, the drift rule
    is the face's local geometry (`drape.gates.recognizers.warp.face_warp`, a share of the face
    box's width) instead of the recognizer's own (dlib's `max_drift`)."""

    def __init__(self, recognizer: FaceRecognizer, *, max_warp: float | None = None):
        self.recognizer, self.cache = recognizer, SourceCache(recognizer)
        self.name = recognizer.name
        self.max_warp = max_warp

    def matches(self, outputs: np.ndarray, sources: np.ndarray, boxes: list, keys: list[str]) -> list[FaceMatch]:
        found = match_faces(self.recognizer, self.cache, outputs, sources, boxes, keys)
        if self.max_warp is None:
            return found
        from drape.gates.recognizers.warp import face_warp

        limit, matches = self.max_warp, []
        for match, output, source, box in zip(found, outputs, sources, boxes):
            # only a face that is there and the same person can have drifted (NaN: too little structure to judge)
            warp = face_warp(output, source, box) if match.same else None
            drifted = warp is not None and bool(warp > limit)
            matches.append(FaceMatch(match.similarity, match.same, warp, drifted))
        return matches

    @property
    def drift_limit(self) -> float | None:
        """The drift rule's limit, in its own terms (`max_warp`, or the recognizer's `max_drift`); None: not judged."""
        return self.max_warp if self.max_warp is not None else getattr(self.recognizer, "max_drift", None)

    def drift_terms(self) -> str:
        """The drift rule as the gate states it when it fires."""
        if self.max_warp is not None:
            return f"local geometry: a part of the face moved > {self.max_warp:.4f} of the face width against the rest"
        return self.recognizer.drift_terms() if self.judges_drift else ""  # type: ignore[attr-defined]

    def scores(self, outputs: np.ndarray, sources: np.ndarray, boxes: list, keys: list[str]) -> np.ndarray:
        return recognizer_scores(self.matches(outputs, sources, boxes, keys))

    @property
    def judges_drift(self) -> bool:
        """A drift limit is set: `max_warp`, or the recognizer's own (`max_drift`)."""
        return self.drift_limit is not None


def build_recognizer(
    embedder: str,
    *,
    model_path: str | None = None,
    model_dir: str | None = None,
    same_person: float | None = None,
    detector: str = "dlib",
    max_drift: float | None = None,
    max_warp: float | None = None,
):
    """The configured recognizer (`gates.identity.embedder` 'dlib' or 'arcface'), its same-person
    rule in its own terms (`same_person`; default dlib's 0.6 distance, ArcFace's 0.28 cosine) and
    its drift rule: the face's local geometry (`max_warp`, a share of the face width) or dlib's
    descriptor drift (`max_drift`, a distance of blurred faces' descriptors); None: not judged."""
    if embedder == "dlib":
        from drape.gates.recognizers.dlib_face import SAME_PERSON_DISTANCE, DlibRecognizer

        recognizer = DlibRecognizer(model_dir, same_distance=same_person or SAME_PERSON_DISTANCE, max_drift=max_drift)
        return RecognizerCheck(recognizer, max_warp=max_warp)
    if embedder == "arcface":
        from drape.gates.recognizers.arcface import SAME_PERSON_COSINE, ArcFaceRecognizer

        return RecognizerCheck(
            ArcFaceRecognizer(
                model_path or "",
                same_cosine=SAME_PERSON_COSINE if same_person is None else same_person,
                landmarks_dir=model_dir,
                detector=detector,
            ),
            max_warp=max_warp,
        )
    raise ValueError(f"gates.identity.embedder {embedder!r}: expected 'dlib' or 'arcface' for a recognizer")

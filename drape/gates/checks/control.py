"""Control sets a face recognizer can judge: every control target must hold a face the configured
recognizer (dlib, an ArcFace-family model) finds in its face box, or the identity check has nothing
to compare an output's face with. A set that fails this is refused when it is made (`drape data
synth`, a run creating its dataset: exit 2, naming the samples), never at gate time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from drape.config import GatesConfig
from drape.gates.recognizers import ControlSetError, RecognizerCheck, faceless_message


def judges_faces(gates: GatesConfig | None) -> bool:
    """The identity check runs through a recognizer: its sources need faces it finds."""
    return gates is not None and gates.identity.is_recognizer


def _rgb(image) -> np.ndarray:
    """A sample's target as RGB uint8 (a PIL image as the generator and importers make, or an array)."""
    return np.asarray(image.convert("RGB") if hasattr(image, "convert") else image)


def refuse_faceless_control(gates: GatesConfig | None, samples: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """(split, sample) pairs passed through as they stream, every control sample's target described
    by the configured recognizer on the way (nothing held but the keys); once they are through, a
    `ControlSetError` naming every control sample whose face it does not find. Without a recognizer
    nothing is checked. Raised inside the stream, so `write_dataset` publishes no manifest."""
    check = _recognizer(gates)
    faceless, judged = [], 0
    for split, sample in samples:
        if check is not None and split == "control":
            judged += 1
            if check.recognizer.describe(_rgb(sample.target), sample.meta["face_box"]) is None:
                faceless.append(sample.key)
        yield split, sample
    if check is not None and faceless:
        raise ControlSetError(faceless_message(check.name, faceless, judged), faceless)


def _recognizer(gates: GatesConfig | None) -> RecognizerCheck | None:
    if gates is None or not judges_faces(gates):
        return None
    from drape.gates.checks.checks import build_embedder

    check = build_embedder(gates)
    assert isinstance(check, RecognizerCheck)  # judges_faces: dlib or arcface
    return check

"""Control sets a face recognizer can judge: every control target must hold a face the configured
recognizer (dlib, an ArcFace-family model) finds in its face box, or the identity check has nothing
to compare an output's face with. A set that fails this is refused when it is made (`drape data
synth`, a run creating its dataset: exit 2, naming the samples), never at gate time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from drape.config import GatesConfig
from drape.gates.recognizers import ControlSetError, RecognizerCheck, faceless_message


def judges_faces(gates: GatesConfig) -> bool:
    """The identity check runs through a recognizer: its sources need faces it finds."""
    return gates.identity.method == "embedding" and gates.identity.embedder in ("dlib", "arcface")


def faceless_keys(check: RecognizerCheck, targets: Sequence[np.ndarray], boxes: Sequence, keys: Sequence[str]) -> list[str]:
    """The keys of the targets in which `check`'s recognizer finds no face in the face box (each
    described once, as the gate will: `SourceCache`)."""
    return [key for target, box, key in zip(targets, boxes, keys) if check.cache.describe(target, box, key) is None]


def refuse_faceless_control(gates: GatesConfig, samples: Sequence) -> None:
    """Raise `ControlSetError` naming every control sample (`drape.data.synth.Sample`) whose target's
    face the configured recognizer does not find; nothing to check without a recognizer."""
    if not judges_faces(gates) or not samples:
        return
    from drape.gates.checks import build_embedder

    check = build_embedder(gates)
    assert isinstance(check, RecognizerCheck)  # judges_faces: dlib or arcface
    targets = [np.asarray(sample.target) for sample in samples]
    missing = faceless_keys(check, targets, [sample.meta["face_box"] for sample in samples], [sample.key for sample in samples])
    if missing:
        raise ControlSetError(faceless_message(check.name, missing, len(samples)), missing)

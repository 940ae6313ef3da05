"""The per-sample rules a recognizer adds to a check (`drape.gates.verdict.report.SampleRule`), in its own terms:
identity through dlib or ArcFace (no face found, another person), texture through OCR (text misread)."""

from __future__ import annotations

import numpy as np

from drape.config import GatesConfig
from drape.gates.recognizers import RecognizerCheck
from drape.gates.verdict.report import SampleRule


def sample_rule(
    check: str,
    gates: GatesConfig,
    embedder,
    keys: list[str],
    values: np.ndarray,
    text: np.ndarray | None,
    drift: np.ndarray | None = None,
) -> dict:
    """The CheckResult fields of `check`'s per-sample rule, if a recognizer judges it (else none);
    `drift`: per sample, the drift of the same face, when a drift rule is set (`gates.identity.max_warp`:
    the face's local geometry; `max_drift`: dlib's blurred descriptors)."""
    if check == "identity":
        return _recognizer_rule(gates, embedder, keys, values, drift)
    if check == "texture":
        return _text_rule(gates, keys, text)
    return {}


def _recognizer_rule(gates: GatesConfig, embedder, keys: list[str], values: np.ndarray, drift: np.ndarray | None) -> dict:
    """The CheckResult fields of a recognizer's per-sample rule (identity through dlib or arcface):
    no face found, another person, and with a drift limit a drifted face of the same person, in the
    drift rule's own terms (so the gate names the rule that fired: the distance rule or the drift rule)."""
    if not isinstance(embedder, RecognizerCheck):
        return {}
    recognizer = embedder.recognizer
    judged = drift is not None and embedder.judges_drift
    rule = SampleRule(
        dict(zip(keys, values.tolist())),
        recognizer.same_person,
        gates.identity.max_mismatch_share,
        recognizer.in_own_terms(recognizer.same_person),
        drift=dict(zip(keys, drift.tolist())) if judged and drift is not None else None,
        max_drift=embedder.drift_limit if judged else None,
        drift_terms=embedder.drift_terms() if judged else "",
    )
    return {"rule": rule}


def _text_rule(gates: GatesConfig, keys: list[str], text: np.ndarray | None) -> dict:
    """The texture check's OCR rule: the samples whose source reads text, each to read the same."""
    if text is None:
        return {}
    judged = {key: value for key, value in zip(keys, text.tolist()) if np.isfinite(value)}
    texture = gates.texture
    terms = f"{texture.ocr}: 1 - normalized edit distance ≥ {texture.min_text_similarity:.2f}"
    rule = SampleRule(
        judged,
        texture.min_text_similarity,
        texture.max_misread_share,
        terms,
        "no text read",
        "text misread",
        texture.min_text_lower,
    )
    return {"rule": rule}

"""Text fidelity through OCR: read the logo region of the source garment and of the output, and
score the two readings by normalized edit distance (the metric text-rendering papers report,
AnyText's NED: 1 less the Levenshtein distance over the longer string's length).

The glyph check (`drape.gates.checks.texture_scores`, `drape.gates.aligned`) compares strokes; a
letter swapped for one of similar shape ("SALE" → "SAIE") or a changed price keeps most strokes
in place. Reading the text catches what the strokes hide. Per sample the rule is "the output
reads as the source does" (a similarity of 1 by default, `gates.texture.min_text_similarity`); a
source region with no text read is not judged (a mark without letters has nothing to misread).

`RapidOcrReader`: PaddleOCR's PP-OCR recognition model through onnxruntime (the
`rapidocr-onnxruntime` wheel ships the models; nothing is downloaded). It reads the logo box as
one line, so detection (a second network, ~1 s per crop on a CPU) is not run: the box is known.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Protocol

import numpy as np

from drape.gates.recognizers import box_region

PAD = 0.15  # of the box's height, around the logo box: OCR reads a line with a margin


class TextReader(Protocol):
    name: str

    def read(self, image: np.ndarray, box) -> str:
        """The text in `box` of RGB uint8 `image` ('' when none is read)."""


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions, one each."""
    previous = list(range(len(b) + 1))
    for i, left in enumerate(a, start=1):
        current = [i]
        for j, right in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right)))
        previous = current
    return previous[-1]


def text_similarity(read: str, expected: str) -> float:
    """1 less the normalized edit distance of two readings, in [0, 1] (two empty readings: 1)."""
    longest = max(len(read), len(expected))
    return 1.0 if longest == 0 else 1.0 - edit_distance(read, expected) / longest


def normalize(text: str) -> str:
    """A reading as it is compared: whitespace removed (OCR spaces letters of a logo unevenly)."""
    return "".join(text.split())


class RapidOcrReader:
    """PP-OCR recognition (rapidocr-onnxruntime) on the logo box as one line of text."""

    name = "rapidocr"

    def __init__(self) -> None:
        from rapidocr_onnxruntime import RapidOCR

        self.engine = RapidOCR()

    def read(self, image: np.ndarray, box) -> str:
        x0, y0, x1, y1 = box_region(box, image.shape, 0.0)
        pad = max(2, round((y1 - y0) * PAD))
        height, width = image.shape[:2]
        crop = np.ascontiguousarray(image[max(y0 - pad, 0) : min(y1 + pad, height), max(x0 - pad, 0) : min(x1 + pad, width)])
        found, _ = self.engine(crop[..., ::-1], use_det=False, use_cls=False, use_rec=True)  # it takes OpenCV's BGR
        return normalize("".join(str(line[0]) for line in found or []))


class TextCheck:
    """Per-sample text similarity of output vs source logo readings (NaN: the source reads no text),
    each source read once (by content)."""

    def __init__(self, reader: TextReader, limit: int = 4096):
        self.reader, self.limit = reader, limit
        self.sources: dict[str, str] = {}
        self.last_reads: dict[str, tuple[str, str]] = {}  # key: (source reading, output reading), for reports

    def _source(self, image: np.ndarray, box) -> str:
        digest = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest() + repr([round(float(v), 2) for v in box])
        if digest not in self.sources:
            if len(self.sources) >= self.limit:
                self.sources.clear()
            self.sources[digest] = self.reader.read(image, box)
        return self.sources[digest]

    def scores(self, outputs: np.ndarray, sources: np.ndarray, boxes: list, keys: list[str]) -> np.ndarray:
        values = []
        for output, source, box, key in zip(outputs, sources, boxes, keys):
            expected = self._source(source, box)
            if not expected:
                values.append(np.nan)
                continue
            read = self.reader.read(output, box)
            self.last_reads[key] = (expected, read)
            values.append(text_similarity(read, expected))
        return np.array(values, dtype=np.float64)


@functools.lru_cache(maxsize=2)
def shared_text_check(reader: str) -> TextCheck:
    """The configured OCR (`gates.texture.ocr`), loaded once per process: a gate reads the same
    sources under every nuisance variant, and the check caches their readings by content."""
    if reader == "rapidocr":
        return TextCheck(RapidOcrReader())
    raise ValueError(f"gates.texture.ocr {reader!r}: expected 'rapidocr' (or 'off')")

"""Text fidelity through OCR: read the logo region of the source garment and of the output, and
score the two readings by normalized edit distance (the metric text-rendering papers report,
AnyText's NED: 1 less the Levenshtein distance over the longer string's length).

The glyph check (`drape.gates.checks.checks.texture_scores`) compares strokes; a
letter swapped for one of similar shape ("SALE" → "SAIE") or a changed price keeps most strokes
in place. Reading the text catches what the strokes hide. Per sample the rule is "the output
reads as the source does" (a similarity of 1 by default, `gates.texture.min_text_similarity`); a
source region with no text read is not judged (a mark without letters has nothing to misread).

`RapidOcrReader`: PaddleOCR's PP-OCR recognition model through onnxruntime (the
`rapidocr-onnxruntime` wheel ships the models; nothing is downloaded). It reads the logo box as
one line, so detection (a second network, ~1 s per crop on a CPU) is not run: the box is known.
`drape.gates.recognizers.tesseract.TesseractReader` (`gates.texture.ocr: tesseract`): Tesseract 5
through its command line, a batch of crops per call.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Protocol

import numpy as np

from drape.gates.recognizers import box_region

PAD = 0.15  # of the box's height, around the logo box: OCR reads a line with a margin
# the crops a logo box is read from by default (a reader without its own `pads`), margins in shares of the
# box's height (negative: an inset): the source from each, the output from each while the median is open
READ_PADS = (PAD, 0.05, -0.08)
# PP-OCR's crops (RapidOcrReader.pads): insets of 8% and 12% and a 15% margin; chosen from eight margins
# (15% to an inset of 12%) on 100 samples under the compound harmless kind and the look-alike letters,
# and held apart on 100 others (docs/recognizers.md)
RAPID_PADS = (-0.08, PAD, -0.12)
SAME_SHAPE = frozenset("cosuvwxz")  # letters whose lower case is the upper case drawn smaller


class TextReader(Protocol):
    name: str

    def read_crops(self, crops: list[np.ndarray]) -> list[str]:
        """The raw text of each RGB uint8 crop, one line each ('' when none is read)."""


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
    """A reading as it is compared: letters and digits only, the scene-text benchmarks' convention
    (OCR spaces a logo's letters unevenly, reads a plate's edge as '[' or '|' and a small mark such
    as a decimal point inconsistently), with the letters whose cases share a shape (c, o, s, u, v,
    w, x, z) in upper case ('TOKYo' is 'TOKYO'). Case is kept for the others: 'l' is not 'L'."""
    kept = (c for c in text if c.isalnum())
    return "".join(c.upper() if c in SAME_SHAPE else c for c in kept)


def crop(image: np.ndarray, box, pad: float = PAD) -> np.ndarray:
    """The logo box of RGB uint8 `image` with a margin of `pad` of its height (at least 2 px; a
    negative `pad` insets the crop by that share instead, inside a plate's edge)."""
    x0, y0, x1, y1 = box_region(box, image.shape, 0.0)
    margin = round((y1 - y0) * pad) if pad < 0 else max(2, round((y1 - y0) * pad))
    height, width = image.shape[:2]
    return np.ascontiguousarray(
        image[max(y0 - margin, 0) : min(y1 + margin, height), max(x0 - margin, 0) : min(x1 + margin, width)]
    )


def read(reader: TextReader, image: np.ndarray, box, pad: float | None = None) -> str:
    """The normalized text `reader` reads in `box` of `image` (by default from the reader's first crop)."""
    pad = getattr(reader, "pads", READ_PADS)[0] if pad is None else pad
    return normalize(reader.read_crops([crop(image, box, pad)])[0])


class RapidOcrReader:
    """PP-OCR recognition (rapidocr-onnxruntime) on the logo box as one line of text.

    Each crop goes to the recognition network as it is (RGB to BGR, resized by the recognizer to its
    48 px line height, aspect kept), one crop per call: rapidocr's own entry point first resizes an
    image under 30 px on a side to multiples of 32 on both sides (a 26×100 crop becomes 32×128, its
    letters stretched), and batches crops padded to the widest of a batch, so a reading would depend
    on the crop's neighbours. Read this way, PP-OCR misreads fewer degraded words (benchmarks/gate_ocr.py).
    The recognizer's parts (`text_rec`: `rec_image_shape`, `resize_norm_img`, `session`, `postprocess_op`)
    are rapidocr-onnxruntime 1.4's, the version pyproject.toml pins."""

    name = "rapidocr"
    pads = RAPID_PADS

    def __init__(self) -> None:
        from rapidocr_onnxruntime import RapidOCR

        self.engine = RapidOCR()
        self.recognizer = self.engine.text_rec

    def read_crops(self, crops: list[np.ndarray]) -> list[str]:
        return [self._read(index, piece) for index, piece in enumerate(crops)]

    def _read(self, index: int, piece: np.ndarray) -> str:
        if piece.ndim != 3 or piece.shape[2] != 3 or piece.dtype != np.uint8:
            raise ValueError(f"ocr rapidocr: crop {index} is {piece.dtype} {piece.shape}: expected RGB uint8")
        height, width = piece.shape[:2]
        if height == 0 or width == 0:
            return ""
        recognizer = self.recognizer
        _, line_height, line_width = recognizer.rec_image_shape
        line = recognizer.resize_norm_img(np.ascontiguousarray(piece[..., ::-1]), max(line_width / line_height, width / height))
        text, _ = recognizer.postprocess_op(recognizer.session(line[None].astype(np.float32))[0])[0]
        return str(text)


class TextCheck:
    """Per-sample text similarity of output vs source logo readings (NaN: the source's mark is not
    `legible`: no text, or crops that read it differently), each source read once (by content).

    Source and output are read from the same crops (`pads`: by default the reader's, else
    `READ_PADS`), each crop's output reading compared with the source's reading of that crop, and
    the sample's similarity is the median over the crops: a recognizer that misreads one crop of a
    harmless copy reads the others as the source, while a look-alike letter that one crop's reading
    hides ('IIMITED' read 'LIMITED' with a 15% margin, 'S49.99' read '$49.99') reads changed from
    the others. Crops are read in turn, each only while the median is still open (a harmless copy
    that reads the same from most crops is read no further). The crops of all outputs go to the
    reader at once (Tesseract starts once per batch)."""

    def __init__(self, reader: TextReader, limit: int = 4096, pads: tuple[float, ...] | None = None):
        self.reader, self.limit = reader, limit
        self.pads = tuple(pads if pads is not None else getattr(reader, "pads", READ_PADS))  # a reader may prefer its own
        self.sources: dict[str, tuple[str, ...]] = {}
        self.last_reads: dict[str, tuple[str, str]] = {}  # key: (source reading, output reading), for reports

    def _source(self, image: np.ndarray, box) -> tuple[str, ...]:
        """The source's normalized reading from each crop of `pads`, in their order ('' where a crop
        reads nothing; a small word's source can misread in one crop too: '$49.99' as '498' at 128 px)."""
        digest = hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest() + repr([round(float(v), 2) for v in box])
        if digest not in self.sources:
            if len(self.sources) >= self.limit:
                self.sources.clear()
            readings = self.reader.read_crops([crop(image, box, pad) for pad in self.pads])
            self.sources[digest] = tuple(map(normalize, readings))
        return self.sources[digest]

    def scores(self, outputs: np.ndarray, sources: np.ndarray, boxes: list, keys: list[str]) -> np.ndarray:
        expected = [self._source(source, box) for source, box in zip(sources, boxes)]
        judged = [i for i, texts in enumerate(expected) if legible(texts)]
        found: dict[int, list[tuple[float, str, str]]] = {i: [] for i in judged}  # (similarity, source, output) per crop
        majority = len(self.pads) // 2 + 1
        for index, pad in enumerate(self.pads):
            open_ = [i for i in judged if sum(same[0] >= 1.0 for same in found[i]) < majority]
            readings = self.reader.read_crops([crop(outputs[i], boxes[i], pad) for i in open_]) if open_ else []
            for i, raw in zip(open_, readings):
                text, source = normalize(raw), expected[i][index]
                found[i].append((text_similarity(text, source), source, text))
        values = []
        for i, key in enumerate(keys):
            if i not in found:
                values.append(np.nan)
                continue
            read = sorted(found[i] + [(1.0, "", "")] * (len(self.pads) - len(found[i])))  # crops left unread: the median is 1
            median = read[len(read) // 2] if len(read) % 2 else min(read[len(read) // 2 - 1 :], key=lambda r: r[0])
            self.last_reads[key] = median[1:] if median[1] or median[2] else found[i][0][1:]
            values.append(median[0])
        return np.array(values, dtype=np.float64)


def legible(readings: tuple[str, ...]) -> bool:
    """A source mark the check can judge: every crop of it reads the same text, and some text. A
    mark an arm covers, the hem cuts or the resolution leaves too small reads differently from crop
    to crop ('$62' under a crossed arm: 'a?', 'a)', 'ca?'); there is no reading to hold the output
    to, and judging it would fail good outputs at random."""
    return bool(readings) and bool(readings[0]) and len(set(readings)) == 1


ENGINES = ("rapidocr", "tesseract")


@functools.lru_cache(maxsize=2)
def shared_text_check(reader: str) -> TextCheck:
    """The configured OCR (`gates.texture.ocr`), loaded once per process: a gate reads the same
    sources under every nuisance variant, and the check caches their readings by content."""
    if reader == "rapidocr":
        return TextCheck(RapidOcrReader())
    if reader == "tesseract":
        from drape.gates.recognizers.tesseract import TesseractReader

        return TextCheck(TesseractReader())
    raise ValueError(f"gates.texture.ocr {reader!r}: expected one of {', '.join(ENGINES)} (or 'off')")

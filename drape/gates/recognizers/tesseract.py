"""Tesseract as the gates' second OCR engine (`gates.texture.ocr: tesseract`), behind the same
interface as PP-OCR (`drape.gates.checks.ocr.TextReader`).

Debian's `tesseract-ocr` (5.x, LSTM, with the English model) is called through its command line:
every crop of a batch is written as a PNG into a temporary folder, one list file names them, and
one `tesseract LIST stdout --psm 7` call (a single line of text per image) reads them all; the
pages of its output are separated by form feeds. Starting Tesseract and loading its model costs
about a second, reading a crop tens of milliseconds, so a check reads a whole control set per call.
A call that runs past `timeout_s` or fails is an error naming the command and what it printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

PAGE_BREAK = "\f"


class TesseractError(RuntimeError):
    """Tesseract is missing, failed, timed out, or returned a different number of pages."""


class TesseractReader:
    """One line of text per crop through the `tesseract` command line (English LSTM model)."""

    name = "tesseract"
    # crops read (shares of the box's height, drape.gates.checks.ocr.crop): inset first, as Tesseract reads a
    # plate's edge beside a word as a letter ('|', '1'), then with a small margin, then inset less
    pads = (-0.08, 0.05, -0.03)

    def __init__(self, binary: str = "tesseract", language: str = "eng", timeout_s: float = 120.0):
        found = shutil.which(binary)
        if found is None:
            raise TesseractError(f"ocr tesseract: no {binary!r} on PATH (Debian: apt-get install tesseract-ocr)")
        if not 0 < timeout_s <= 3600:
            raise ValueError(f"ocr tesseract: timeout_s {timeout_s}: expected in (0, 3600]")
        self.binary, self.language, self.timeout_s = found, language, timeout_s

    def read_crops(self, crops: list[np.ndarray]) -> list[str]:
        if not crops:
            return []
        with tempfile.TemporaryDirectory(prefix="drape-tesseract-") as folder:
            paths = []
            for index, piece in enumerate(crops):
                if piece.ndim != 3 or piece.dtype != np.uint8:
                    raise ValueError(f"ocr tesseract: crop {index} is {piece.dtype} {piece.shape}: expected RGB uint8")
                path = Path(folder) / f"{index:06d}.png"
                Image.fromarray(piece).save(path)
                paths.append(str(path))
            listing = Path(folder) / "crops.txt"
            listing.write_text("\n".join(paths) + "\n")
            text = self._run([self.binary, str(listing), "stdout", "--psm", "7", "-l", self.language])
        pages = text.split(PAGE_BREAK)  # between pages; a page that reads nothing is empty
        if len(pages) == len(crops) + 1 and not pages[-1].strip():
            pages.pop()  # a break after the last page
        if len(pages) != len(crops):
            raise TesseractError(f"ocr tesseract: read {len(pages)} pages for {len(crops)} crops")
        return [" ".join(page.split()) for page in pages]

    def _run(self, command: list[str]) -> str:
        env = {**os.environ, "OMP_THREAD_LIMIT": "1"}  # one thread per call, as the gates' other recognizers
        try:
            done = subprocess.run(command, capture_output=True, timeout=self.timeout_s, env=env, check=False)
        except subprocess.TimeoutExpired as error:
            raise TesseractError(f"ocr tesseract: {' '.join(command[:2])} ran past {self.timeout_s:.0f} s") from error
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[-500:]
            raise TesseractError(f"ocr tesseract: exit {done.returncode} from {' '.join(command[:2])}: {said}")
        return done.stdout.decode(errors="replace")

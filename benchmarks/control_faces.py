"""Control faces a real recognizer sees: dlib's detection rate in the synthetic generator's control
targets, drawn faces (`data.synthetic.faces: drawn`, the baseline) against real portraits composed
into the heads (`portraits`), side by side on the same samples (the same poses, garments and
backgrounds) at each `--resolution`.

The detector is the gate's own (`drape.gates.recognizers.dlib_face`: HOG on the face box grown and
resized, 5 landmarks, the ResNet descriptor); a target counts as found when the recognizer returns a
descriptor for its face box, exactly what the identity gate needs of a control source.

    .venv/bin/python benchmarks/control_faces.py                      # 16 samples at 64, 128, 256 px
    .venv/bin/python benchmarks/control_faces.py --resolution 64 128 256 1024x768 --samples 16
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.data.synth import generate_split  # noqa: E402
from drape.gates.recognizers.dlib_face import DlibRecognizer  # noqa: E402


def _resolution(text: str) -> int | tuple[int, int]:
    if "x" in text:
        height, width = text.split("x")
        return int(height), int(width)
    return int(text)


def detection(recognizer: DlibRecognizer, faces: str, resolution, samples: int, seed: int) -> tuple[int, float]:
    """(targets whose face dlib finds, seconds per sample for drawing and describing)."""
    started, found = time.perf_counter(), 0
    drawn = generate_split(
        seed=seed, split="control", num_samples=samples, num_identities=24, num_garments=48, resolution=resolution, faces=faces
    )
    for sample in drawn:
        found += recognizer.describe(np.asarray(sample.target.convert("RGB")), sample.meta["face_box"]) is not None
    return found, (time.perf_counter() - started) / samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolution", nargs="+", default=["64", "128", "256"], help="sides, or HEIGHTxWIDTH")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    recognizer = DlibRecognizer()
    table = Table(title=f"dlib finds a face in the control targets ({args.samples} samples, seed {args.seed})")
    for column in ("resolution", "drawn", "portraits", "ratio", "s/sample drawn", "s/sample portraits"):
        table.add_column(column, justify="right")
    for text in args.resolution:
        resolution = _resolution(text)
        drawn, drawn_time = detection(recognizer, "drawn", resolution, args.samples, args.seed)
        real, real_time = detection(recognizer, "portraits", resolution, args.samples, args.seed)
        ratio = f"{real / drawn:.1f}×" if drawn else "∞ (drawn: none)"
        table.add_row(text, f"{drawn}/{args.samples}", f"{real}/{args.samples}", ratio, f"{drawn_time:.2f}", f"{real_time:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()

"""Price tags PP-OCR can judge: the synthetic generator's price tags (`data.synthetic.marks: prices`)
drawn with the strokes of each `--stroke` (the plate's height over it: `drape.data.synth_draw.PRICE_STROKE`,
30 now, 20 before) side by side on the same control samples (the same people, poses and garments) at
each `--resolution`. Per stroke and resolution: the tags the OCR check judges (every crop reads
alike, `drape.gates.checks.ocr.legible`), those read as their own price, and, over `--seeds` draws
of each kind, the most tags a harmless kind of the wide suite misreads (a false alarm of
`gates.texture.max_misread_share`) and the fewest a logo corruption misreads.

The control set is configs/rehearsal-gate.yaml's (its seed, people, garments; no crossed arms over a
tag, `drape.data.synth.LEGIBLE_CONTROL`); the reader is the gate's (`shared_text_check('rapidocr')`).

    .venv/bin/python benchmarks/price_tags.py                         # 6 samples, 256x192 and 128x96, strokes 20 and 30
    .venv/bin/python benchmarks/price_tags.py --samples 24 --resolution 256x192 --stroke 20 25 30
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

from drape.config import load_config  # noqa: E402
from drape.data import synth_draw  # noqa: E402
from drape.data.synth import generate_split  # noqa: E402
from drape.gates.checks.ocr import TextCheck, legible, shared_text_check  # noqa: E402
from drape.gates.suites import corruptions  # noqa: E402
from drape.gates.suites.calibrated import misreads  # noqa: E402
from drape.gates.suites.harmless import suite  # noqa: E402

AIMED = {
    "logo blurred (melted)": corruptions.logo_blur,
    "logo elastic warp": corruptions.logo_elastic,
    "logo mirrored": corruptions.logo_mirror,
    "logo replaced by another": corruptions.logo_swap,
}


def _resolution(text: str) -> int | tuple[int, int]:
    if "x" in text:
        height, width = text.split("x")
        return int(height), int(width)
    return int(text)


def _misread(check: TextCheck, outputs, targets, boxes) -> int:
    """Tags read otherwise than their target, counted as calibration counts them (similarity under 1)."""
    return misreads(check.scores(outputs, targets, boxes, [f"s{i}" for i in range(len(targets))]), 1.0)[0]


def measure(check: TextCheck, stroke: int, resolution, samples: int, seeds: int) -> dict:
    """The counts of one stroke at one resolution (see the module docstring)."""
    config = load_config(REPO / "configs" / "rehearsal-gate.yaml")
    synthetic, kept = config.data.synthetic, synth_draw.PRICE_STROKE
    synth_draw.PRICE_STROKE = stroke
    try:
        drawn = list(
            generate_split(
                seed=config.seed,
                split="control",
                num_samples=samples,
                num_identities=synthetic.num_identities,
                num_garments=synthetic.num_garments,
                resolution=resolution,
                faces=synthetic.faces,
                marks="prices",
            )
        )
    finally:
        synth_draw.PRICE_STROKE = kept
    started = time.perf_counter()
    targets = np.stack([np.asarray(s.target.convert("RGB")) for s in drawn])
    meta, boxes = [s.meta for s in drawn], [s.meta["logo_box"] for s in drawn]
    sources = [check._source(target, box) for target, box in zip(targets, boxes)]
    judged = [i for i, reading in enumerate(sources) if legible(reading)]
    right = sum(sources[i][0] == meta[i]["garment"]["logo"].strip("$") for i in judged)
    masks = np.zeros(targets.shape[:3], dtype=bool)

    def worst(kinds: dict, most: bool) -> tuple[int, str]:
        found = []
        for name, kind in kinds.items():
            counts = [
                _misread(check, corruptions.apply(kind, targets, meta, masks, seed), targets, boxes) for seed in range(seeds)
            ]
            found.append((max(counts) if most else min(counts), name))
        return max(found) if most else min(found)

    harmless, aimed = worst(suite("wide"), True), worst(AIMED, False)
    return {
        "judged": len(judged),
        "right": right,
        "harmless": harmless,
        "aimed": aimed,
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolution", nargs="+", default=["256x192", "128x96"], help="sides, or HEIGHTxWIDTH")
    parser.add_argument("--stroke", nargs="+", type=int, default=[20, 30], help="the plate's height over the stroke width")
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=3, help="draws of each kind (noise, JPEG blocks land differently)")
    args = parser.parse_args()
    check = shared_text_check("rapidocr")
    table = Table(
        title=f"PP-OCR on the rehearsal-gate control set's price tags ({args.samples} samples, {args.seeds} draws a kind)"
    )
    for column in ("resolution", "stroke", "judged", "read right", "harmless: most misread", "aimed: fewest misread", "s"):
        table.add_column(column, justify="right")
    for text in args.resolution:
        for stroke in args.stroke:
            found = measure(check, stroke, _resolution(text), args.samples, args.seeds)
            judged = found["judged"]
            table.add_row(
                text,
                f"1/{stroke}" + (" (now)" if stroke == synth_draw.PRICE_STROKE else ""),
                f"{judged}/{args.samples}",
                f"{found['right']}/{judged}",
                f"{found['harmless'][0]}/{judged}" + (f" ({found['harmless'][1]})" if found["harmless"][0] else " (every kind)"),
                f"{found['aimed'][0]}/{judged} ({found['aimed'][1]})",
                f"{found['seconds']:.0f}",
            )
    Console(width=200).print(table)


if __name__ == "__main__":
    main()

"""FID and KID with `eval.fid_resize: clean` vs `legacy`, on the same images and the same network.

Images: the synthetic generator's control targets at `--resolution` (default 256×192, VITON-HD's
3:4) are the reference set; against them, (a) the same targets degraded as a weak model's outputs
(Gaussian blur of radius 1, then JPEG at quality 40) and (b) another draw of the generator (its
`identity` split: the same distribution). Network: `--inception PATH` (the real
`inception-2015-12-05.pt` where you have it) or, by default, the tests' stand-in with the real
one's structure (`tests/unit/test_eval_metrics.py`: random rectified conv features): its numbers show how
far the resize alone moves the statistics, not the real network's FIDs.

For each pair it prints FID and KID under both resizes, their difference and the relative
difference (legacy − clean) / clean.

    .venv/bin/python benchmarks/fid_resize.py                         # ~2 min on one core
    .venv/bin/python benchmarks/fid_resize.py --inception /models/inception-2015-12-05.pt --samples 256
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from drape.data.synth import generate_split  # noqa: E402
from drape.eval.features import FeatureNetworks, load_inception  # noqa: E402
from drape.eval.metrics import batch_records, summarize  # noqa: E402
from tests.unit.test_eval_metrics import write_tiny_inception  # noqa: E402


def targets(split: str, samples: int, resolution: tuple[int, int], seed: int) -> np.ndarray:
    drawn = generate_split(seed=seed, split=split, num_samples=samples, num_identities=16, num_garments=16, resolution=resolution)
    return np.stack([np.asarray(sample.target.convert("RGB")) for sample in drawn])


def degrade(images: np.ndarray) -> np.ndarray:
    """Blur (radius 1) and JPEG (quality 40): the softness and artefacts of a weak model's outputs."""
    out = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).filter(ImageFilter.GaussianBlur(1)).save(buffer, "JPEG", quality=40)
        out.append(np.asarray(Image.open(buffer).convert("RGB")))
    return np.stack(out)


def measure(path: str, reference: np.ndarray, other: np.ndarray) -> dict[str, dict[str, float]]:
    result = {}
    for resize in ("clean", "legacy"):
        networks = FeatureNetworks(load_inception(path, resize))
        records = batch_records(networks, other, reference, paired=False)
        result[resize] = summarize(records, paired=False, kid_subset_size=len(reference), kid_subsets=10)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inception", help="a TorchScript Inception (default: the tests' stand-in)")
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--resolution", type=int, nargs=2, default=(256, 192), metavar=("HEIGHT", "WIDTH"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    resolution = (args.resolution[0], args.resolution[1])
    with tempfile.TemporaryDirectory() as scratch:
        path = args.inception or str(write_tiny_inception(Path(scratch) / "inception.pt"))
        network = args.inception or "the tests' stand-in (random rectified conv features, 16 of them)"
        reference = targets("control", args.samples, resolution, args.seed)
        pairs = {
            "degraded (blur 1 + JPEG 40)": degrade(reference),
            "another draw": targets("identity", args.samples, resolution, args.seed),
        }
        print(f"network: {network}; {args.samples} images a side at {resolution[0]}×{resolution[1]}")
        print(f"{'pair':<28} {'metric':<6} {'clean':>10} {'legacy':>10} {'legacy-clean':>13} {'relative':>9}")
        for name, other in pairs.items():
            result = measure(path, reference, other)
            for metric in ("fid", "kid"):
                clean, legacy = result["clean"][metric], result["legacy"][metric]
                relative = (legacy - clean) / clean if clean else float("nan")
                print(f"{name:<28} {metric:<6} {clean:>10.5f} {legacy:>10.5f} {legacy - clean:>13.5f} {relative:>9.2%}")


if __name__ == "__main__":
    main()

"""Outputs the gate refuses before any threshold: transparent ones, and constant ones.

A transparent pixel would be judged on whatever lies under it once alpha is dropped, so an
output with any is refused, named. A constant output (one flat colour, a tiny dynamic range,
noise around one level, or one colour over nearly the whole frame) is what a collapsed model
writes; the value checks would fail it only by accident of their thresholds (identity first), so
it is refused explicitly, naming the file, what was measured and the bound. The bounds sit far
below any photograph's: a try-on output (a person, a garment) spans tens of levels at least, and
a studio shot's flat background covers at most two thirds of the synthetic control set's frames.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

MIN_STD = 2.0  # levels of 255: the largest of the channels' spreads over the frame
MIN_LUMA_SPAN = 10.0  # levels of 255: luma between its 1st and 99th percentile
MAX_ONE_COLOUR = 0.95  # the largest share of the frame one exact RGB colour may cover
NAMED = 3  # constant outputs listed by name in a report; the rest are counted


def opaque_rgb(image: Image.Image, path: Path) -> np.ndarray:
    """The image as RGB, refused when any pixel is transparent: alpha would be dropped silently and a
    half-empty output judged on what lies under it."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        alpha = np.asarray(image.convert("RGBA"))[..., 3]
        if (alpha < 255).any():
            share = float((alpha < 255).mean())
            raise ValueError(f"{path}: {share:.0%} of its pixels are transparent; the gate judges opaque RGB outputs")
    return np.asarray(image.convert("RGB"))


def constant_problem(image: np.ndarray, name: str) -> str | None:
    """Why the (H, W, 3) uint8 `image` called `name` is constant, with the measure and its bound;
    None when it is not: some channel's std over the frame ≥ MIN_STD (per channel: a flat red
    frame has a large std across its channels), luma span ≥ MIN_LUMA_SPAN and no colour
    on more than MAX_ONE_COLOUR of the frame."""
    values = np.asarray(image, dtype=np.float32)
    std = float(values.reshape(-1, values.shape[-1] if values.ndim == 3 else 1).std(axis=0).max())
    if std < MIN_STD:
        return f"{name}: pixel std {std:.2f} levels, at least {MIN_STD:g} expected (one flat colour)"
    luma = values[..., :3] @ np.array([0.299, 0.587, 0.114], np.float32) if values.ndim == 3 else values
    low, high = np.percentile(luma, [1, 99])
    if high - low < MIN_LUMA_SPAN:
        return (
            f"{name}: its luma spans {high - low:.1f} levels (1st to 99th percentile), "
            f"at least {MIN_LUMA_SPAN:g} expected (a near-constant image)"
        )
    share, colour = _one_colour_share(np.asarray(image))
    if share > MAX_ONE_COLOUR:
        return (
            f"{name}: {share:.1%} of its pixels are one colour {colour}, at most {MAX_ONE_COLOUR:.0%} expected (a constant frame)"
        )
    return None


def _one_colour_share(image: np.ndarray) -> tuple[float, str]:
    """The share of the frame its median packed colour covers, and that colour: any colour on over
    half the frame is the median, so this finds it in linear time (no sort, no histogram)."""
    pixels = image.reshape(-1, image.shape[-1] if image.ndim == 3 else 1).astype(np.uint32)
    packed = pixels[:, 0] << 16 | pixels[:, min(1, pixels.shape[1] - 1)] << 8 | pixels[:, -1]
    middle = len(packed) // 2
    median = np.partition(packed, middle)[middle]
    colour = f"rgb({median >> 16}, {(median >> 8) & 255}, {median & 255})"
    return float((packed == median).mean()), colour


def constant_outputs(outputs: np.ndarray, keys: list[str], directory: str | Path) -> list[str]:
    """The gate's problems for constant outputs (`constant_problem`), each named as
    `directory/<key>.png`: the first NAMED in full, then a count; empty when none is."""
    found = [problem for key, image in zip(keys, outputs) if (problem := constant_problem(image, f"{Path(directory) / key}.png"))]
    if not found:
        return []
    lines = [f"constant output {line}: the model has collapsed" for line in found[:NAMED]]
    if len(found) > NAMED:
        lines.append(f"{len(found)} of {len(keys)} outputs are constant in all ({len(found) - NAMED} more not listed)")
    return lines


def refuse_constant(outputs: np.ndarray, keys: list[str], directory: str | Path) -> None:
    """ValueError naming the first constant output in `directory` (a reference must not be one)."""
    for key, image in zip(keys, outputs):
        if problem := constant_problem(image, f"{Path(directory) / key}.png"):
            raise ValueError(f"{problem}; a reference set of outputs may not hold a constant image")

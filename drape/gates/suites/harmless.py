"""The wider harmless suite: kinds of change a reviewer accepts that `drape.gates.suites.nuisance` never
produced, measured to fail the first calibration: tone curves (gamma, S-curves: not just gain
and offset), sharpening, denoising, resampling filters other than bicubic, and compound
registrations (a sub-pixel shift then a recompression, a small scale and rotation then JPEG, a
tone curve then sharpening then JPEG), each the kind a delivery path or an editor applies.

`gates.nuisance_suite: wide` measures the floors and change tolerances on `NUISANCE` plus these
(`suite`); each variant takes (images, meta, rng) like a corruption and returns uint8 copies of
the same shape (tests/unit/test_harmless.py bounds each one).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

from drape.gates.suites.corruptions import Corruption
from drape.gates.suites.nuisance import NUISANCE, jpeg, shift


def _each(images: np.ndarray, edit) -> np.ndarray:
    return np.stack([np.asarray(edit(Image.fromarray(image)).convert("RGB")) for image in images])


def _curve(images: np.ndarray, curve) -> np.ndarray:
    table = np.clip(np.round(curve(np.arange(256) / 255.0) * 255), 0, 255).astype(np.uint8)
    return table[images]


def gamma(value: float) -> Corruption:
    """Every channel through x ** `value` (below 1: lighter mid-tones; above: darker)."""
    return lambda images, meta, rng: _curve(images, lambda x: x**value)


def s_curve(strength: float) -> Corruption:
    """Mid-tone contrast up (`strength` > 0) or down, ends fixed: x - strength · sin(2πx) / 2π."""
    return lambda images, meta, rng: _curve(images, lambda x: x - strength * np.sin(2 * np.pi * x) / (2 * np.pi))


def sharpen(radius: float, percent: int) -> Corruption:
    """An unsharp mask (`radius` px, `percent` strength), as a delivery path sharpens thumbnails."""
    return lambda images, meta, rng: _each(images, lambda image: image.filter(ImageFilter.UnsharpMask(radius, percent, 2)))


def denoise(size: int) -> Corruption:
    """A `size`×`size` median filter: what a denoiser leaves of fine texture."""
    return lambda images, meta, rng: _each(images, lambda image: image.filter(ImageFilter.MedianFilter(size)))


def resampled(factor: float, method: Image.Resampling) -> Corruption:
    """Down to `factor` and back up with `method` (Lanczos, bilinear: not only bicubic)."""

    def round_trip(images, meta, rng):
        def once(image):
            small = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
            return image.resize(small, method).resize(image.size, method)

        return _each(images, once)

    return round_trip


def similarity(scale: float, degrees: float) -> Corruption:
    """Scaled by `scale` and turned by `degrees` about the centre, bilinear (a re-framed photo)."""

    def moved(images, meta, rng):
        def once(image):
            angle = np.deg2rad(degrees)
            a, b = np.cos(angle) / scale, np.sin(angle) / scale
            cx, cy = image.width / 2, image.height / 2
            matrix = (a, b, cx - a * cx - b * cy, -b, a, cy + b * cx - a * cy)
            return image.transform(image.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.BILINEAR)

        return _each(images, once)

    return moved


def chain(*steps: Corruption) -> Corruption:
    """`steps` one after the other (a compound change)."""

    def applied(images, meta, rng):
        for step in steps:
            images = step(images, meta, rng)
        return images

    return applied


WIDER: dict[str, Corruption] = {
    "gamma 0.85": gamma(0.85),
    "gamma 1.15": gamma(1.15),
    "s-curve +0.15": s_curve(0.15),
    "s-curve -0.15": s_curve(-0.15),
    "sharpen r1.5 60%": sharpen(1.5, 60),
    "denoise median 3": denoise(3),
    "resampled lanczos 0.6": resampled(0.6, Image.Resampling.LANCZOS),
    "resampled bilinear 0.85": resampled(0.85, Image.Resampling.BILINEAR),
    "shift 0.5 px + jpeg q70": chain(shift(0.5, 0.25), jpeg(70)),
    "scale 1.02 + rotate 1° + jpeg q80": chain(similarity(1.02, 1.0), jpeg(80)),
    "gamma 1.1 + sharpen + jpeg q75": chain(gamma(1.1), sharpen(1.0, 50), jpeg(75)),
    "denoise + resampled 0.8 + shift 1 px": chain(denoise(3), resampled(0.8, Image.Resampling.BICUBIC), shift(1, 0)),
}


# The harmless kinds the wide suite lacks that a per-sample drift rule (`gates.identity.max_warp`) must
# pass (issue 67; the removed aligned checks failed gamma 1.1, the unsharp mask and the shift + JPEG q75):
# a mild JPEG, gamma 0.9 and 1.1, a stronger unsharp mask than the wide suite's, a whole-pixel shift then JPEG q75
DRIFT_EXTRA: dict[str, Corruption] = {
    "jpeg q90": jpeg(90),
    "gamma 0.9": gamma(0.9),
    "gamma 1.1": gamma(1.1),
    "sharpen r2 100%": sharpen(2.0, 100),
    "shift 1 px + jpeg q75": chain(shift(1, 0), jpeg(75)),
}


def drift_suite() -> dict[str, Corruption]:
    """The harmless kinds a per-sample drift rule is measured on (benchmarks/drift_margins.py): the
    wide suite and `DRIFT_EXTRA`. Not a gate's floor suite: the gate's floors stay on `suite`."""
    return {**suite("wide"), **DRIFT_EXTRA}


def suite(name: str) -> dict[str, Corruption]:
    """The harmless suite a gate measures its floors on: 'standard' (`NUISANCE`) or 'wide' (and `WIDER`)."""
    if name == "standard":
        return NUISANCE
    if name == "wide":
        return {**NUISANCE, **WIDER}
    raise ValueError(f"gates.nuisance_suite {name!r}: expected 'standard' or 'wide'")

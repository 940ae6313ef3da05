"""The nuisance suite: changes a reviewer accepts, which a gate must pass (issue 18's calibration side).

`drape.gates.suites.corruptions.CLEAN` holds the two mild variants the gates were first tuned on (noise,
JPEG q90). This suite is the harder, wider one the gates are to be calibrated on: misregistration
from sub-pixel to 2 px, a few percent of global brightness, contrast and white balance, ordinary
re-encoding (JPEG q60 and q75) and resizing, and slight blur. Each variant takes (images, meta,
rng) like a corruption and returns uint8 copies of the same shape; none of them moves the picture
more than a reviewer would shrug at (tests/unit/test_nuisance.py bounds each one).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageFilter

from drape.gates.suites.corruptions import Corruption


def _each(images: np.ndarray, edit) -> np.ndarray:
    return np.stack([np.asarray(edit(Image.fromarray(image)).convert("RGB")) for image in images])


def shift(dx: float, dy: float) -> Corruption:
    """The whole image moved by (dx, dy) pixels, bilinear for fractions; the uncovered edge is black."""

    def moved(images, meta, rng):
        return _each(
            images,
            lambda image: image.transform(
                image.size, Image.Transform.AFFINE, (1, 0, -dx, 0, 1, -dy), resample=Image.Resampling.BILINEAR, fillcolor=None
            ),
        )

    return moved


def _photometric(images: np.ndarray, gain: np.ndarray, offset: float = 0.0, contrast: float = 1.0) -> np.ndarray:
    values = images.astype(np.float32)
    mean = values.mean(axis=(1, 2, 3), keepdims=True)
    values = (values - mean) * contrast + mean  # contrast about each image's own mean
    return np.clip(values * gain + offset, 0, 255).round().astype(np.uint8)


def brightness(fraction: float) -> Corruption:
    """Every pixel scaled by 1 + `fraction` (a light a few percent brighter or dimmer)."""
    return lambda images, meta, rng: _photometric(images, np.array(1 + fraction, dtype=np.float32))


def contrast(fraction: float) -> Corruption:
    """Contrast about the image's mean changed by `fraction`."""
    return lambda images, meta, rng: _photometric(images, np.array(1.0, dtype=np.float32), contrast=1 + fraction)


def white_balance(red: float, blue: float) -> Corruption:
    """Red and blue channels scaled by 1 + `red` and 1 + `blue` (a warmer or cooler light)."""
    gain = np.array([1 + red, 1.0, 1 + blue], dtype=np.float32)
    return lambda images, meta, rng: _photometric(images, gain)


def jpeg(quality: int) -> Corruption:
    def encoded(images, meta, rng):
        def once(image):
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=quality)
            return Image.open(buffer)

        return _each(images, once)

    return encoded


def resized(factor: float) -> Corruption:
    """Down to `factor` of the size and back up (a thumbnail re-served at full size)."""

    def round_trip(images, meta, rng):
        def once(image):
            small = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
            return image.resize(small, Image.Resampling.BICUBIC).resize(image.size, Image.Resampling.BICUBIC)

        return _each(images, once)

    return round_trip


def blur(radius: float) -> Corruption:
    return lambda images, meta, rng: _each(images, lambda image: image.filter(ImageFilter.GaussianBlur(radius)))


NUISANCE: dict[str, Corruption] = {
    "shift 0.5 px": shift(0.5, 0.5),
    "shift 1 px": shift(1, 0),
    "shift 2 px": shift(2, -1),
    "brightness +6%": brightness(0.06),
    "brightness -6%": brightness(-0.06),
    "contrast +5%": contrast(0.05),
    "contrast -5%": contrast(-0.05),
    "white balance warm": white_balance(0.04, -0.04),
    "white balance cool": white_balance(-0.04, 0.04),
    "jpeg q75": jpeg(75),
    "jpeg q60": jpeg(60),
    "resized 0.75": resized(0.75),
    "blur 0.5 px": blur(0.5),
}

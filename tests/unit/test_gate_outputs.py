"""The gate reads opaque RGB outputs only: any transparency is refused, the file named (a constant
output fails the gate by name: tests/unit/test_trust_outputs.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from drape.gates.run import read_outputs


def _noise(mode: str = "RGB") -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 4), dtype=np.uint8)
    pixels[..., 3] = 255
    return Image.fromarray(pixels[..., : len(mode)], mode)


def _half_transparent() -> Image.Image:
    pixels = np.asarray(_noise("RGBA")).copy()
    pixels[8:, :, 3] = 128
    return Image.fromarray(pixels, "RGBA")


def _transparent_palette() -> Image.Image:
    image = _noise().convert("P")
    image.info["transparency"] = 0
    return image


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Image.fromarray(np.zeros((16, 16, 4), np.uint8), "RGBA"), "100% of its pixels are transparent"),
        (_half_transparent, "50% of its pixels are transparent"),
        (_transparent_palette, "of its pixels are transparent"),
    ],
)
def test_transparent_and_constant_outputs_are_refused_naming_the_file(tmp_path, make, message):
    make().save(tmp_path / "control-00000.png")
    with pytest.raises(ValueError, match=message) as error:
        read_outputs(tmp_path, ["control-00000"])
    assert "control-00000.png" in str(error.value)


def test_an_opaque_rgba_output_is_read_as_its_rgb(tmp_path):
    image = _noise("RGBA")
    image.save(tmp_path / "control-00000.png")
    (array,) = read_outputs(tmp_path, ["control-00000"])
    assert (array == np.asarray(image)[..., :3]).all()

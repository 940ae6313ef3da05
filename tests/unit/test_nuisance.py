"""The nuisance suite: each variant keeps shape and dtype, changes the picture, and stays small."""

from __future__ import annotations

import numpy as np
import pytest

from drape.gates.suites.nuisance import NUISANCE, shift


@pytest.fixture(scope="module")
def images():
    """Smooth images with edges (a gradient and a square): what misregistration and blur act on."""
    y, x = np.mgrid[0:64, 0:64]
    base = np.stack([x * 3, y * 3, (x + y) * 1.5], axis=-1).astype(np.float32)
    base[20:44, 20:44] = [200, 60, 40]
    return np.stack([base, base[::-1]]).astype(np.uint8)


@pytest.mark.parametrize("name", sorted(NUISANCE))
def test_each_nuisance_variant_is_a_small_real_change(images, name):
    out = NUISANCE[name](images, [{}, {}], np.random.default_rng(0))
    assert out.shape == images.shape and out.dtype == np.uint8
    difference = np.abs(out.astype(np.int16) - images.astype(np.int16))
    assert difference.mean() > 0.1, "a variant that changes nothing calibrates nothing"
    assert difference.mean() < 16, f"{name} moves pixels by {difference.mean():.1f} on average: more than a nuisance"


def test_a_whole_pixel_shift_moves_the_picture_by_that_pixel(images):
    out = shift(1, 0)(images, [{}, {}], np.random.default_rng(0))
    np.testing.assert_array_equal(out[:, :, 1:], images[:, :, :-1])

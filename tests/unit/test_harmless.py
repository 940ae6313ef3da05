"""The wider harmless suite: each kind keeps shape and dtype, changes the picture, and stays small;
the gate measures its floors on it when configured, and a threshold 'nuisance' sits its margin below."""

from __future__ import annotations

import numpy as np
import pytest

from drape.config import GatesConfig
from drape.gates.run import _value_threshold
from drape.gates.suites.harmless import WIDER, gamma, s_curve, similarity, suite
from drape.gates.suites.nuisance import NUISANCE
from drape.gates.verdict.floor import Level


@pytest.fixture(scope="module")
def images():
    y, x = np.mgrid[0:64, 0:64]
    base = np.stack([x * 3, y * 3, (x + y) * 1.5], axis=-1).astype(np.float32)
    base[20:44, 20:44] = [200, 60, 40]
    base += np.random.default_rng(0).normal(0, 4, base.shape)  # a fine texture: what a denoiser acts on
    base = base.clip(0, 255)
    return np.stack([base, base[::-1]]).astype(np.uint8)


@pytest.mark.parametrize("name", sorted(WIDER))
def test_each_wider_kind_is_a_small_real_change(images, name):
    out = WIDER[name](images, [{}, {}], np.random.default_rng(0))
    assert out.shape == images.shape and out.dtype == np.uint8
    difference = np.abs(out.astype(np.int16) - images.astype(np.int16))
    assert difference.mean() > 0.1, "a kind that changes nothing calibrates nothing"
    assert difference.mean() < 16, f"{name} moves pixels by {difference.mean():.1f} on average: more than harmless"


def test_tone_curves_against_their_formulas():
    ramp = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, axis=-1)
    out = gamma(1.15)(ramp, [{}], None).astype(np.float64)
    np.testing.assert_allclose(out[..., 0].ravel(), np.round(255 * (np.arange(256) / 255) ** 1.15), atol=0)
    curved = s_curve(0.15)(ramp, [{}], None)[..., 0].ravel().astype(int)
    assert curved[0] == 0 and curved[255] == 255 and curved[128] in (127, 128, 129)
    assert curved[64] < 64 < 192 < curved[192]  # mid-tone contrast up: darks darker, lights lighter


def test_a_similarity_of_one_changes_nothing_and_a_turn_moves_the_corners(images):
    np.testing.assert_array_equal(similarity(1.0, 0.0)(images, [{}, {}], None), images)
    turned = similarity(1.0, 5.0)(images, [{}, {}], None)
    assert np.abs(turned.astype(int) - images.astype(int))[:, :8, :8].mean() > 1


def test_suites_and_the_margin_below_the_floor():
    assert suite("standard") is NUISANCE and set(suite("wide")) == set(NUISANCE) | set(WIDER)
    with pytest.raises(ValueError, match="expected 'standard' or 'wide'"):
        suite("widest")
    floor = Level(0.8, "gamma 1.15")
    assert _value_threshold("identity", "nuisance", floor, {"identity": 0.05}) == (
        pytest.approx(0.75),
        "nuisance floor (gamma 1.15) less margin 0.05",
    )
    assert _value_threshold("identity", "nuisance", floor) == (0.8, "nuisance floor (gamma 1.15)")
    assert _value_threshold("identity", 0.7, floor, {"identity": 0.05}) == (0.7, "config")  # a number is the number
    GatesConfig(nuisance_suite="wide", floor_margin={"identity": 0.05})
    with pytest.raises(ValueError):
        GatesConfig(floor_margin={"identity": 0.9})
    with pytest.raises(ValueError):
        GatesConfig(floor_margin={"faces": 0.1})

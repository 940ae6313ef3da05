"""The regression suite: each regression redraws the control sample with one attribute moved, and
changes the picture where that attribute is and nowhere else."""

from __future__ import annotations

import numpy as np
import pytest

from drape.data.synth import redraw
from drape.gates.suites.corruptions import _box
from drape.gates.suites.regressions import REGRESSIONS, applicable, render
from tests.conftest import tiny_config

RESOLUTION = 128


@pytest.fixture(scope="module")
def control(tmp_path_factory):
    from drape.data.dataset import synthesize_split

    config = tiny_config(tmp_path_factory.mktemp("regressions"), data={"resolution": RESOLUTION})
    return config, synthesize_split(config, "control", 12)


def test_a_sample_redrawn_unchanged_is_the_same_sample(control):
    config, arrays = control
    for meta, target in zip(arrays["meta"], arrays["target"]):
        np.testing.assert_array_equal(np.asarray(redraw(config.seed, meta).target), target)


def test_redrawing_needs_a_synthetic_key(control):
    config, arrays = control
    with pytest.raises(ValueError, match="expected '<split>-<index>'"):
        redraw(config.seed, {**arrays["meta"][0], "key": "photo_0193"})


def _outside(meta: dict, name: str, shape, pad: int) -> np.ndarray:
    keep = np.ones(shape[:2], dtype=bool)
    x0, y0, x1, y1 = _box(meta, name, shape, pad)
    keep[y0:y1, x0:x1] = False
    return keep


CASES = [(check, name) for check, suite in REGRESSIONS.items() for name in suite]


@pytest.mark.parametrize("check, name", CASES)
def test_each_regression_changes_its_own_part_of_the_picture(control, check, name):
    config, arrays = control
    regression = REGRESSIONS[check][name]
    redrawn = render(regression, arrays["meta"], config.seed)
    assert redrawn.shape == arrays["target"].shape and redrawn.dtype == np.uint8
    shown = applicable(regression, arrays["meta"], redrawn, arrays["target"])
    assert shown.sum() >= 4, f"{name} shows on only {shown.sum()} of 12 samples"
    for meta, image, target, used in zip(arrays["meta"], redrawn, arrays["target"], shown):
        moved = np.abs(image.astype(np.int16) - target.astype(np.int16)).max(axis=-1) >= 8
        if check == "texture":  # the mark changes, nothing outside its box
            assert not (moved & _outside(meta, "logo_box", image.shape, 2)).any(), name
        elif check == "coherence":  # the garment changes, the face does not
            assert not moved[~_outside(meta, "face_box", image.shape, 0)].any(), name
        elif name.startswith(("face", "nose", "eyes", "other hair")):  # the head changes, the logo does not
            assert not moved[~_outside(meta, "logo_box", image.shape, 0)].any(), name
        assert used == (moved.sum() >= 4 and regression.applies(meta))

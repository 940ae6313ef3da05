"""Constant outputs (drape/gates/checks/degenerate.py): one colour, near-constant or mostly one colour is
named with the measure and its bound; low contrast and flat backdrops are not constant."""

from __future__ import annotations

import numpy as np
import pytest

from drape.data.dataset import load_control_dir
from drape.gates.checks.degenerate import MAX_ONE_COLOUR, MIN_LUMA_SPAN, MIN_STD, constant_outputs, constant_problem

RNG = np.random.default_rng(51)


def _mostly_one_colour() -> np.ndarray:
    image = np.zeros((64, 48, 3), np.uint8)
    image[:4, :22] = RNG.integers(0, 256, (4, 22, 3))  # 2.9% of the frame has content
    return image


CONSTANT = {
    "all black": (lambda: np.zeros((64, 48, 3), np.uint8), rf"pixel std 0\.00 levels, at least {MIN_STD:g}"),
    "one colour": (lambda: np.full((64, 48, 3), (200, 30, 30), np.uint8), "pixel std .* levels, at least"),
    "noise under the bound": (
        lambda: np.clip(128 + RNG.normal(0, 0.8, (64, 48, 3)), 0, 255).round().astype(np.uint8),
        "pixel std 0.[0-9]+ levels",
    ),
    "a tiny range": (
        lambda: RNG.integers(124, 132, (64, 48, 3), dtype=np.uint8),
        rf"luma spans [0-9.]+ levels .*at least {MIN_LUMA_SPAN:g}",
    ),
    "one colour on 97% of the frame": (
        _mostly_one_colour,
        rf"9[0-9.]+% of its pixels are one colour rgb\(0, 0, 0\), at most {MAX_ONE_COLOUR:.0%}",
    ),
}


@pytest.mark.parametrize("variant", list(CONSTANT))
def test_constant_outputs_are_named_with_the_measure_and_the_bound(variant):
    make, message = CONSTANT[variant]
    problem = constant_problem(make(), "outputs/control-00003.png")
    assert problem is not None and problem.startswith("outputs/control-00003.png: "), problem
    assert __import__("re").search(message, problem), problem


def _low_contrast() -> np.ndarray:
    """A foggy photograph: a soft gradient and a figure, all within 95..140."""
    rows, cols = np.mgrid[0:64, 0:48]
    luma = 100 + 25 * rows / 63 + 5 * np.sin(cols / 4)
    luma[20:50, 16:32] += 10
    return np.repeat(luma[..., None], 3, axis=2).round().astype(np.uint8)


def _studio_shot() -> np.ndarray:
    """A figure on a flat white backdrop covering 85% of the frame."""
    image = np.full((64, 48, 3), 255, np.uint8)
    image[10:36, 10:28] = RNG.integers(0, 200, (26, 18, 3))
    return image


@pytest.mark.parametrize("make", [_low_contrast, _studio_shot], ids=["low contrast", "studio backdrop"])
def test_legitimate_low_contrast_and_flat_backdrop_outputs_pass(make):
    assert constant_problem(make(), "x.png") is None


def test_the_synthetic_control_targets_are_never_constant(tiny_dataset):
    control, _ = load_control_dir(tiny_dataset[0])
    assert constant_outputs(control["target"], control["keys"], "outputs") == []


def test_a_report_names_three_constant_outputs_and_counts_the_rest():
    outputs = np.zeros((5, 16, 16, 3), np.uint8)
    lines = constant_outputs(outputs, [f"k{i}" for i in range(5)], "run/outputs")
    assert [line.split(":")[0] for line in lines[:3]] == [f"constant output run/outputs/k{i}.png" for i in range(3)]
    assert lines[3] == "5 of 5 outputs are constant in all (2 more not listed)"

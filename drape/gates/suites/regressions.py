"""The regression suite: what a model gets subtly wrong, which a gate must fail (issue 18's measuring side).

Each regression draws the control sample again (`drape.data.synth.redraw`: the same pose,
background and light) with one attribute of its identity or garment moved a little, so nothing
but the regression differs from the ground truth:
- identity drift: skin tone a quarter and half a step towards its neighbour in the generator's
  palette, a wider or narrower face (jawline), a longer or shorter nose, eyes set wider or closer,
  another hair colour;
- the mark: each letter replaced by one of similar shape (R→P, Q→O, K→X …), lower case, turned
  12°, its right third lost, another colour;
- the garment: hue turned 30°, the pattern a third denser, a hem 12% shorter, a pocket added,
  a fit 12% looser or tighter.

A regression is judged by the check it is listed under in `REGRESSIONS`; `applicable` says which samples it
really changes (a solid garment has no pattern to densify, a pocket behind an arm does not show).
Only synthetic control sets can be redrawn: their keys and metadata say how each sample was made.
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from drape.data.synth import Garment, Identity, garment_of, identity_of, redraw
from drape.data.synth_draw import GARMENT_COLOURS, HAIR_COLOURS, PLAIN, SKIN_TONES, Variation

Edit = Callable[[Identity, Garment], tuple[Identity, Garment, Variation]]

LOOK_ALIKE = {"A": "4", "K": "X", "Z": "2", "M": "N", "R": "P", "O": "Q", "D": "O", "X": "Y", "W": "V", "Q": "O"}


@dataclass(frozen=True)
class Regression:
    edit: Edit
    applies: Callable[[dict], bool] = lambda meta: True


def _blend(a: tuple[int, ...], b: tuple[int, ...], share: float) -> tuple[int, ...]:
    return tuple(int(round(x + (y - x) * share)) for x, y in zip(a, b))


def _neighbour_tone(skin: tuple[int, ...]) -> tuple[int, ...]:
    """The palette's next tone (darker, or lighter for the darkest)."""
    index = min(range(len(SKIN_TONES)), key=lambda i: sum(abs(a - b) for a, b in zip(SKIN_TONES[i], skin)))
    return SKIN_TONES[index + 1] if index + 1 < len(SKIN_TONES) else SKIN_TONES[index - 1]


def skin_tone(share: float) -> Edit:
    def edit(identity, garment):
        return replace(identity, skin=_blend(identity.skin, _neighbour_tone(identity.skin), share)), garment, PLAIN

    return edit


def _moved(value: float, step: float, low: float, high: float) -> float:
    """`value` moved by `step`, the other way when that leaves the generator's range [low, high]."""
    return value + step if low <= value + step <= high else value - step


def face(field: str, step: float, low: float, high: float) -> Edit:
    def edit(identity, garment):
        return replace(identity, **{field: _moved(getattr(identity, field), step, low, high)}), garment, PLAIN

    return edit


def other_hair(identity, garment):
    index = HAIR_COLOURS.index(tuple(identity.hair)) if tuple(identity.hair) in HAIR_COLOURS else 0
    return replace(identity, hair=HAIR_COLOURS[(index + 1) % len(HAIR_COLOURS)]), garment, PLAIN


def look_alike(identity, garment):
    return identity, replace(garment, logo="".join(LOOK_ALIKE.get(c, c) for c in garment.logo)), PLAIN


def lower_case(identity, garment):
    return identity, replace(garment, logo=garment.logo.lower()), PLAIN


def mark_colour(identity, garment):
    """The mark in another palette colour that still stands out from the plate."""
    options = [c for c in GARMENT_COLOURS if c not in (tuple(garment.logo_colour), tuple(garment.colour))]
    far = [c for c in options if sum(abs(a - b) for a, b in zip(c, garment.colour)) > 200] or options
    return identity, replace(garment, logo_colour=far[0]), PLAIN


def drawn(**changes) -> Edit:
    return lambda identity, garment: (identity, garment, Variation(**changes))


def _turned(colour: tuple[int, ...], degrees: float) -> tuple[int, ...]:
    h, lightness, s = colorsys.rgb_to_hls(*(c / 255 for c in colour))
    return tuple(int(round(c * 255)) for c in colorsys.hls_to_rgb((h + degrees / 360) % 1, lightness, s))


def garment_hue(identity, garment):
    return identity, replace(garment, colour=_turned(garment.colour, 30), accent=_turned(garment.accent, 30)), PLAIN


def _coloured(meta: dict) -> bool:
    """A hue to turn: not white, black or grey."""
    r, g, b = meta["garment"]["colour"]
    return max(r, g, b) - min(r, g, b) > 40


def _patterned(meta: dict) -> bool:
    return meta["garment"]["pattern"] != "solid"


def _has_look_alike(meta: dict) -> bool:
    return any(c in LOOK_ALIKE for c in meta["garment"]["logo"])


REGRESSIONS: dict[str, dict[str, Regression]] = {
    "identity": {
        "skin tone 1/4 step": Regression(skin_tone(0.25)),
        "skin tone 1/2 step": Regression(skin_tone(0.5)),
        "face wider or narrower": Regression(face("face_aspect", 0.08, 0.7, 1.0)),
        "nose longer or shorter": Regression(face("nose_length", 0.06, 0.12, 0.28)),
        "eyes wider or closer": Regression(face("eye_spacing", 0.06, 0.3, 0.5)),
        "other hair colour": Regression(other_hair),
    },
    "texture": {
        "look-alike letters": Regression(look_alike, _has_look_alike),
        "lower case": Regression(lower_case),
        "mark turned 12 deg": Regression(drawn(logo_angle=12.0)),
        "mark's right third lost": Regression(drawn(logo_erased=0.34)),
        "mark in another colour": Regression(mark_colour),
    },
    "coherence": {
        "garment hue turned 30 deg": Regression(garment_hue, _coloured),
        "pattern a third denser": Regression(drawn(pattern_scale=0.67), _patterned),
        "hem 12% shorter": Regression(drawn(length=0.88)),
        "pocket added": Regression(drawn(pocket=True)),
        "fit 12% looser": Regression(drawn(fit=1.12)),
        "fit 12% tighter": Regression(drawn(fit=0.88)),
    },
}


def render(regression: Regression, meta: list[dict], seed: int) -> np.ndarray:
    """The control samples' targets with `regression` (uint8, N×H×W×3); `seed` made the control set."""
    images = []
    for sample in meta:
        identity, garment, variation = regression.edit(identity_of(sample), garment_of(sample))
        images.append(np.asarray(redraw(seed, sample, identity=identity, garment=garment, variation=variation).target))
    return np.stack(images)


def applicable(regression: Regression, meta: list[dict], redrawn: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The samples `regression` really changes: it applies to them (a solid garment has no pattern
    to densify) and the redrawn picture shows it (at least 4 pixels moved by 8 levels or more in
    some channel: a pocket behind a crossed arm is not there to catch)."""
    moved = (np.abs(redrawn.astype(np.int16) - targets.astype(np.int16)).max(axis=-1) >= 8).reshape(len(meta), -1).sum(axis=1)
    return np.array([regression.applies(m) for m in meta], dtype=bool) & (moved >= 4)

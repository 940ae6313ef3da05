"""The likeness measure: how much of a shopper's face an output keeps, for the personalization gate
(`drape.shoppers.gate`), which asks whether an adapter holds the shopper *better than the base model*
on the same held-out photos, never whether one output passes a fixed threshold.

What is left of a face once the light (`drape.shoppers.likeness.light`), the registration and the
delivery path (`drape.shoppers.likeness.registration`) are undone, read two ways: the largest windowed
residual (a nose, a jaw, eyes that moved) and the skin tone's change in L*a*b* over the face's flat
skin (a tone no delivery path explains). It was the gates' opt-in `gates.identity.method: aligned`;
as a gate it failed harmless tone curves, sharpening and a shift + re-encoding (docs/gates.md,
"Telling a regression from noise"), so the gates dropped it. Compared between two models on the same
photos, seeds and delivery, what those harmless kinds do to it cancels; it still tells one person from
another where the pixel embedding mostly sees that a face was rendered at all (docs/personalization.md).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from drape.gates.checks.checks import lab as _lab
from drape.shoppers.likeness.light import outside, plausible_lights
from drape.shoppers.likeness.registration import FACE_PAD, _blur, _region, align_versions, change

# What counts as a full unit of change, per term: the same multiple (11.5×) of their 99th
# percentiles on the nuisance suite at 128 px (residual 0.0142, tone ΔE 1.85; measured with
# benchmarks/gate_validity.py's 32 samples), so each reaches a calibrated threshold at the same share
# of its nuisance floor and neither hides the other: a quarter step of skin tone (ΔE 2.5-5) and a
# nose 6% longer (a residual of 0.016-0.05) both show.
FACE_UNIT, TONE_UNIT = 0.163, 21.3
MAX_SHIFT = 2.5  # the registration searched, in pixels (the gates' old `identity.max_shift_pixels` default)


def face_ellipse(shape: tuple[int, ...], box, pad: float = FACE_PAD, share: float = 0.8) -> torch.Tensor:
    """bool (h, w) over `align`'s region of `box` (padded by `pad`): the ellipse inscribed in the box,
    scaled by `share`, where a face's own skin is (not the hair or a background of a similar colour)."""
    x0, y0, x1, y1 = _region(box, pad, shape)
    bx0, by0, bx1, by1 = box
    ys, xs = torch.meshgrid(torch.arange(y0, y1) + 0.5, torch.arange(x0, x1) + 0.5, indexing="ij")
    rx, ry = max((bx1 - bx0) * share / 2, 0.5), max((by1 - by0) * share / 2, 0.5)
    return ((xs - (bx0 + bx1) / 2) / rx) ** 2 + ((ys - (by0 + by1) / 2) / ry) ** 2 <= 1


def tone_difference(
    seen: torch.Tensor,
    expected: torch.Tensor,
    *,
    where: torch.Tensor | None = None,
    flat: float = 12.0,
    blur: float = 0.8,
    chroma: float = 8.0,
) -> float:
    """CIE76 ΔE of the median per-pixel L*a*b* change over the expected region's flat skin: pixels
    (inside `where`, when given) within `chroma` in a*b* (and 25 in L*) of its central colour where
    no channel of it has an edge (blurred gradient below `flat`), eroded by a sixteenth of the
    region (codecs bleed colour that far from an edge); the median, so what ringing is left does
    not steer it."""
    smooth = _blur(expected, blur)
    gradient = torch.zeros(smooth.shape[1:])
    gradient[1:-1, 1:-1] = (
        (smooth[:, 2:, 1:-1] - smooth[:, :-2, 1:-1]) ** 2 + (smooth[:, 1:-1, 2:] - smooth[:, 1:-1, :-2]) ** 2
    ).sqrt().amax(dim=0) / 2
    h, w = gradient.shape
    lab = torch.from_numpy(_lab(expected.permute(1, 2, 0).double().numpy()))
    centre = lab[h // 3 : max(2 * h // 3, h // 3 + 1), w // 3 : max(2 * w // 3, w // 3 + 1)].reshape(-1, 3).median(dim=0).values
    # skin: the central colour's hue and saturation (a*, b*) at a lighter or darker shade; white or
    # grey hair as light as the skin is not skin
    same = ((lab[..., 1:] - centre[1:]).norm(dim=-1) < chroma) & ((lab[..., 0] - centre[0]).abs() < 25)
    skin = same & (gradient < flat)
    if where is not None:
        skin &= where
    skin[[0, -1], :], skin[:, [0, -1]] = False, False
    reach = max(1, round(min(h, w) / 16))
    inner = -F.max_pool2d(-skin[None, None].float(), 2 * reach + 1, stride=1, padding=reach)[0, 0] > 0.5
    skin = inner if int(inner.sum()) >= 4 else skin
    if int(skin.sum()) < 4:
        return 0.0
    change = _lab(seen[:, skin].T.double().numpy()) - _lab(expected[:, skin].T.double().numpy())
    return float(np.linalg.norm(np.median(change, axis=0)))


def face_change(output: np.ndarray, source: np.ndarray, box, max_shift: float = MAX_SHIFT) -> tuple[float, float] | None:
    """(residual, skin-tone ΔE) of the face in `box`, against the source relit, registered
    (on both pictures blurred by 1 px) and delivered (`drape.shoppers.likeness.registration.delivered`) as the
    output is closest to; None when the box is empty."""
    # every light the rest of the picture cannot tell apart, none among them (under JPEG q60 a light
    # face's fit found a green gain of 0.974, and its tone read 2.59 ΔE relit against 1.18 with the
    # light left alone)
    lights = plausible_lights(output, source, outside(output.shape, [box]))
    every = [found for light in lights if (found := align_versions(output, source, box, light, max_shift=max_shift))]
    if not every:  # an empty box: no light gives a region
        return None
    seen, versions = every[0][0], [version for _, found in every for version in found]
    # the tone change no delivery path explains: the least against any version of the reference
    where = face_ellipse(output.shape, box)
    tone = min(tone_difference(seen, version, where=where) for version in versions)
    # likewise the residual: the least against any version (the closest in squared error can leave a
    # larger worst window: a blur matches a resampled face's mean error, not its edges)
    return min(change(seen, version) for version in versions), tone


def likeness_scores(outputs: np.ndarray, sources: np.ndarray, face_boxes: list, max_shift: float = MAX_SHIFT) -> np.ndarray:
    """Per sample, 1 less the larger of the face's residual (in units of `FACE_UNIT`) and its
    skin-tone ΔE (in units of `TONE_UNIT`), floored at 0: 1 is the source's face under another light.
    `max_shift`: the registration searched, in pixels (default 2.5)."""
    scores = []
    for output, source, box in zip(outputs, sources, face_boxes):
        terms = face_change(output, source, box, max_shift)
        scores.append(0.0 if terms is None else max(0.0, 1.0 - max(terms[0] / FACE_UNIT, terms[1] / TONE_UNIT)))
    return np.array(scores)

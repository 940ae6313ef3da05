"""The light the likeness measure undoes before it compares: what the rest of a picture says a global
change of brightness, contrast and white balance did to it (`drape.shoppers.likeness.face`).

Each channel of the output is fitted as gain × reference + offset on 4×4 blocks where the model
should have changed nothing, robustly; where that rest cannot tell lights apart (a background of one
dark range), each plausible light is tried (`plausible_lights`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F


@dataclass(frozen=True)
class Light:
    gain: np.ndarray  # (3,) per channel
    offset: np.ndarray  # (3,) per channel

    def apply(self, image: np.ndarray) -> np.ndarray:
        return image.astype(np.float32) * self.gain + self.offset


def fit_light(
    output: np.ndarray,
    reference: np.ndarray,
    where: np.ndarray | None = None,
    *,
    block: int = 4,
    rounds: int = 2,
    outlier: float = 3.0,
    ridge: float = 10.0,
    shared: bool = False,
) -> Light:
    """Per-channel gain and offset (with `shared`, one offset for the three channels: `_shared_offset`)
    taking `reference` to `output`, fitted on the blocks inside
    `where` (bool H×W: where the model should have changed nothing; the whole picture when None or
    when it leaves fewer than 8 blocks), robustly: blocks fitting `outlier` times worse than the
    median block (and by over 3 levels) are dropped, `rounds` times. The fit is a pure gain (the
    means' ratio) plus a slope about it shrunk by `ridge` (levels²): a picture of one flat colour
    gets that gain alone. The ridge is light: the rest of a picture can be mostly flat (a white
    shirt, a background, hair), and with 100 levels² a 5% contrast change there was taken for a
    fraction of it (the dropped blocks were the contrasted ones), leaving a mark's residual as large
    as a turned mark's and a light face's tone up to 6 ΔE off. Blocks whose output is all at either
    end of the range (in a channel) are left out of that channel's fit."""
    pool = lambda image: F.avg_pool2d(torch.from_numpy(image.astype(np.float32)).permute(2, 0, 1)[None], block)[0]  # noqa: E731
    x, y = pool(reference).reshape(3, -1).numpy(), pool(output).reshape(3, -1).numpy()
    chosen = np.ones(x.shape[1], dtype=bool)
    if where is not None:
        inside = pool(where[..., None].astype(np.float32) * np.ones(3, np.float32))[0].reshape(-1).numpy() > 0.99
        chosen = inside if inside.sum() >= 8 else chosen
    # a block whose output is all at either end of the range says only that the light took it there
    # or beyond: a light skin's red at 255 under a brighter light is not a gain of 1
    railed = (y >= 254.5) | (y <= 0.5)
    gain, offset = np.ones(3, np.float32), np.zeros(3, np.float32)
    for round_ in range(rounds + 1):
        uses = [chosen & ~railed[c] if (chosen & ~railed[c]).sum() >= 8 else chosen for c in range(3)]
        gain, offset = (_shared_offset if shared else _per_channel)(x, y, uses, ridge)
        if round_ < rounds:
            error = np.abs(x * gain[:, None] + offset[:, None] - y).sum(axis=0)
            chosen = chosen & (error <= max(outlier * float(np.median(error[chosen])), 3.0))
    return Light(np.clip(gain, 0.5, 2.0), offset)


def _per_channel(x: np.ndarray, y: np.ndarray, uses: list[np.ndarray], ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """A gain and an offset per channel over the blocks in `uses` (per channel): a pure gain
    (brightness, white balance: the means' ratio) plus the ridge slope of what it leaves (contrast),
    so a few flat colours cannot swing the slope."""
    gain, offset = np.ones(3, np.float32), np.zeros(3, np.float32)
    for c in range(3):
        xc, yc = x[c, uses[c]], y[c, uses[c]]
        pure = float(yc.mean() / max(xc.mean(), 1.0))
        left = yc - pure * xc
        gain[c] = pure + float(((xc - xc.mean()) * (left - left.mean())).mean() / (xc.var() + ridge))
        offset[c] = float(yc.mean() - gain[c] * xc.mean())
    return gain, offset


def _shared_offset(x: np.ndarray, y: np.ndarray, uses: list[np.ndarray], ridge: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel gains and one offset shared by the channels, by least squares over the blocks in
    `uses` (per channel), each gain shrunk towards its channel's pure gain (the means' ratio) by
    `ridge` levels² per block. One offset: a brightness or white balance is a gain, a contrast
    change is one gain about one grey level, so its offset is the channels' own; a rest of one dark
    colour (a background) then still tells a contrast change (gain 1.05, offset -3.5) from a
    brightness one, where a free offset per channel traded the gain for it (1.03 and -2.6 on red,
    0.99 on green: a bright garment then read 9 levels off)."""
    normal, right = np.zeros((4, 4)), np.zeros(4)
    for c in range(3):
        xc, yc = x[c, uses[c]].astype(np.float64), y[c, uses[c]].astype(np.float64)
        pure = float(yc.mean() / max(xc.mean(), 1.0))
        weight = ridge * len(xc)
        normal[c, c] += float(xc @ xc) + weight
        normal[c, 3] += float(xc.sum())
        normal[3, c] += float(xc.sum())
        normal[3, 3] += len(xc)
        right[c] += float(xc @ yc) + weight * pure
        right[3] += float(yc.sum())
    solution = np.linalg.solve(normal, right)
    return solution[:3].astype(np.float32), np.full(3, solution[3], dtype=np.float32)


NO_LIGHT = Light(np.ones(3, np.float32), np.zeros(3, np.float32))
# The one-offset fit's ridge (levels² per block): three channels pin its offset, so it needs little
# (with 10, a contrast +5% over a background spanning 25 levels was fitted as a gain of 1.008)
SHARED_RIDGE = 1.0


def plausible_lights(output: np.ndarray, reference: np.ndarray, where: np.ndarray | None) -> tuple[Light, ...]:
    """The lights the rest of the picture (`where`) cannot tell apart, to try in turn: the fit with an
    offset per channel, the fit with one offset, and none. Where the rest spans a narrow range (a
    dark background), a contrast change and a small offset, or a re-encoding's colour noise, fit it
    alike and part only on a brighter garment: at 128 px, under JPEG q60, a dark rest's fit found a
    red gain of 1.08 (offset -7.4) and read a print 0.038 off where no light read 0.017; under
    contrast +5% the per-channel fit read a white shirt 0.035 off, every light tried 0.016 (the true light: 0.002)."""
    return fit_light(output, reference, where), fit_light(output, reference, where, shared=True, ridge=SHARED_RIDGE), NO_LIGHT


def outside(shape: tuple[int, ...], boxes: list, mask: np.ndarray | None = None) -> np.ndarray:
    """Where the light is fitted: outside `boxes` (what is judged) and, when given, outside `mask`
    (where the model paints, for the garment check: a garment whose hue turned is not light)."""
    where = np.ones(shape[:2], dtype=bool) if mask is None else mask <= 127
    height, width = shape[:2]
    for x0, y0, x1, y1 in boxes:
        where[max(int(y0), 0) : min(int(np.ceil(y1)), height), max(int(x0), 0) : min(int(np.ceil(x1)), width)] = False
    return where

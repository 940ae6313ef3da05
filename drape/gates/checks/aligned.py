"""Aligned comparison: what is left of a difference once the light and the registration are undone.

A reviewer shrugs at an output that is a pixel or two off, a few percent brighter, cooler or
flatter, re-encoded or slightly soft (`drape.gates.suites.nuisance`), and flags one whose nose, jaw, skin
tone, letters or hem moved (`drape.gates.suites.regressions`). The first kind changes the whole picture
smoothly; the second changes one place. So, per region (a face box, a logo box):
- light: each channel of the output is fitted as gain × reference + offset over the whole picture
  (4×4 blocks, the worst fifth of them dropped twice, so the region itself and misregistered edges do
  not steer the fit): global brightness, contrast and white balance are undone, a local change is not;
  where the rest of the picture cannot tell lights apart (a dark background: a contrast change, an
  offset and a codec's colour noise fit it alike), each plausible light is tried (`plausible_lights`);
- registration: the reference region is moved by the sub-pixel shift (quarter pixels, up to
  `max_shift`) that best matches the output's luminance, and its chroma where the region's
  luminance hardly varies (`registration_chroma`; a mark's always: `MARK_REGISTRATION_CHROMA`;
  for the face, both a little blurred first: else a fractional shift wins on a soft output by the
  blur its interpolation adds); a mark is also registered against each delivered version of the
  reference (resampling rings, and moves a small mark's edges a quarter pixel);
- delivery: the reference also softened, re-encoded and resampled (`drape.gates.suites.nuisance.delivered`),
  compared with the output: for a face, the least change over every version (`drape.gates.checks.face`);
  for a mark or a garment, the version closest over the rest of the picture (how soft and how
  encoded the output is where nothing should change; of versions about as close there, the one
  closest over the region), so a mark melted on its own is not matched by a soft reference;
- residual: both slightly blurred (codec ringing, resampling), the colour distance per pixel in
  YCbCr with chroma at half resolution as codecs keep it (weighted a quarter, a mark's a half:
  `MARK_CHROMA`), averaged over small windows; its largest
  value, as a share of full scale, is what the region changed where it changed most;
- skin tone (faces): the median L*a*b* change over the face ellipse's flat skin, the least against
  any delivered version of the reference (a tone change no delivery path explains).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from drape.gates.checks.checks import _YCC as _YCC_ARRAY
from drape.gates.checks.light import Light, outside, plausible_lights
from drape.gates.suites.nuisance import delivered

_YCC = torch.tensor(_YCC_ARRAY, dtype=torch.float32)  # RGB → YCbCr (JPEG), the one transform the checks use


def _centred_colour(tensor: torch.Tensor, chroma: float) -> torch.Tensor:
    """(..., 3, H, W) RGB → (..., 3·H·W): luminance and both chroma channels (weighted by `chroma`),
    each less its mean: what registration matches."""
    ycc = torch.einsum("ij,...jhw->...ihw", _YCC * torch.tensor([1.0, chroma, chroma])[:, None], tensor)
    return (ycc - ycc.mean(dim=(-2, -1), keepdim=True)).flatten(-3)


def registration_chroma(region: torch.Tensor) -> float:
    """How much registration weighs chroma for `region` (3, h, w): a quarter where its luminance
    varies less than 0.4 times as much as its chroma (a red mark on a blue shirt is nearly one
    luminance), else none (codecs blur and shift chroma, and on a mark of mostly chroma at 0.45 a
    whole picture softened by 0.75 px was then registered a fraction off)."""
    ycc = torch.einsum("ij,jhw->ihw", _YCC, region).flatten(1)
    spread = ycc.std(dim=1)
    return 0.25 if float(spread[0]) < 0.4 * float(spread[1:].norm()) else 0.0


_FACE_PAD, _GARMENT_PAD = 0.15, 0.05  # a face box and a garment mask's box grow by these shares of their size


def _region(box, pad: float, shape) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = box
    grow = pad * max(x1 - x0, y1 - y0)
    height, width = shape[:2]
    return (
        max(int(np.floor(x0 - grow)), 0),
        max(int(np.floor(y0 - grow)), 0),
        min(int(np.ceil(x1 + grow)), width),
        min(int(np.ceil(y1 + grow)), height),
    )


def _padded(picture: torch.Tensor, region: tuple[int, int, int, int], margin: int) -> torch.Tensor:
    """(C, h + 2 margin, w + 2 margin): `region` (x0, y0, x1, y1) of `picture` and `margin` around, edges replicated."""
    x0, y0, x1, y1 = region
    return F.pad(picture[None], (margin,) * 4, mode="replicate")[0][:, y0 : y1 + 2 * margin, x0 : x1 + 2 * margin]


def _blur(tensor: torch.Tensor, sigma: float) -> torch.Tensor:
    """(C, H, W) blurred with a separable Gaussian, edges replicated."""
    radius = max(int(np.ceil(2 * sigma)), 1)
    taps = torch.exp(-(torch.arange(-radius, radius + 1, dtype=torch.float32) ** 2) / (2 * sigma**2))
    taps = (taps / taps.sum())[None, None]
    channels = tensor.shape[0]
    out = F.pad(tensor[None], (radius, radius, radius, radius), mode="replicate")
    out = F.conv2d(out, taps[..., None, :].expand(channels, 1, 1, -1), groups=channels)
    return F.conv2d(out, taps[..., :, None].expand(channels, 1, -1, 1), groups=channels)[0]


def _ycc(tensor: torch.Tensor) -> torch.Tensor:
    """(..., 3, H, W) RGB → YCbCr, chroma smoothed 2×2 (half resolution, as codecs keep it)."""
    ycc = torch.einsum("ij,...jhw->...ihw", _YCC, tensor)
    flat = ycc.reshape(-1, *ycc.shape[-3:])
    chroma = F.avg_pool2d(F.pad(flat[:, 1:], (0, 1, 0, 1), mode="replicate"), 2, stride=1)
    return torch.cat([flat[:, :1], chroma], dim=1).reshape(ycc.shape)


def _shifted(crop: torch.Tensor, shifts: torch.Tensor, size: tuple[int, int], margin: int, stride: int = 1) -> torch.Tensor:
    """(K, C, h, w): `crop` (C, H, W) sampled at its inner window (offset `margin`) moved by each
    (dx, dy); every `stride`-th row and column of the window only."""
    channels, height, width = crop.shape
    h, w = size
    whole = shifts.round()
    if len(shifts) == 1 and stride == 1 and bool((shifts == whole).all()):
        # a whole-pixel move (most often none) is a window of the crop: what sampling gives there
        dx, dy = int(whole[0, 0]), int(whole[0, 1])
        return crop[None, :, margin + dy : margin + dy + h, margin + dx : margin + dx + w]
    rows, columns = torch.arange(0, h, stride, dtype=torch.float32), torch.arange(0, w, stride, dtype=torch.float32)
    ys, xs = torch.meshgrid(rows, columns, indexing="ij")
    gx = (xs[None] + margin + shifts[:, 0, None, None]) * 2 / width + 1 / width - 1
    gy = (ys[None] + margin + shifts[:, 1, None, None]) * 2 / height + 1 / height - 1
    grid = torch.stack([gx, gy], dim=-1)
    return F.grid_sample(crop.expand(len(shifts), -1, -1, -1), grid, mode="bilinear", padding_mode="border", align_corners=False)


def _shift_grid(max_shift: float, step: float = 0.25) -> torch.Tensor:
    values = torch.arange(-max_shift, max_shift + step / 2, step)
    return torch.cartesian_prod(values, values)


def align(
    output: np.ndarray,
    reference: np.ndarray,
    box,
    light: Light,
    *,
    max_shift: float = 2.5,
    pad: float = 0.15,
    softness: tuple[float, ...] = (0.35, 0.6, 0.85),
    reencode: bool = False,
    every: bool = False,
    registration_blur: float = 0.0,
    delivery_from: np.ndarray | None = None,
    also: Sequence[Light] = (),
    reregister: bool = False,
    chroma: float | None = None,
):
    """(output region, relit reference region moved to match it), float (3, h, w) tensors (0-255),
    for `box` padded by `pad` of its size; None when the box is empty. With `reencode`, the
    reference may also be compared re-encoded or resampled (`reencoded`), whichever is closest;
    `every`: (output region, every such version of the reference region) instead. The version
    is the one closest over the region itself, or, with `delivery_from` (bool H×W), over those
    pixels of the whole picture (`closest_over`): a mark melted on its own meets the sharp one;
    then `also` (other lights, `plausible_lights`) are tried as `light` is, on the same registration,
    and of every light's versions the one closest over the region is compared; with `reregister`,
    each such version is also compared registered on its own (`_reregistered`). `chroma`: how much
    registration weighs chroma (None: `registration_chroma`'s rule)."""
    x0, y0, x1, y1 = _region(box, pad, output.shape)
    if x1 - x0 < 2 or y1 - y0 < 2:
        return None
    margin = int(np.ceil(max_shift)) + 1
    relit = torch.from_numpy(np.clip(light.apply(reference), 0, 255)).permute(2, 0, 1)
    seen = torch.from_numpy(output[y0:y1, x0:x1].astype(np.float32)).permute(2, 0, 1)
    shift = _register(seen, _padded(relit, (x0, y0, x1, y1), margin), margin, max_shift, registration_blur, chroma)
    region = lambda picture: _shifted(_padded(picture, (x0, y0, x1, y1), margin), shift[None], (y1 - y0, x1 - x0), margin)[0]  # noqa: E731
    if delivery_from is not None:
        candidates = []
        for other in (light, *also):
            lit = relit if other is light else torch.from_numpy(np.clip(other.apply(reference), 0, 255)).permute(2, 0, 1)
            whole = [*softened(lit, softness), *reencoded(lit)]
            # of the versions as close over the rest as the closest (within `DELIVERY_TIE`), the one
            # closest over the region: on the rest a blur and a resampling can fit about as well, and
            # only the region tells them apart; a mark melted on a sharp picture has no such tie
            for k in closest_over(output, whole, shift, delivery_from, margin):
                crop = _padded(whole[k], (x0, y0, x1, y1), margin)
                candidates.append(_shifted(crop, shift[None], (y1 - y0, x1 - x0), margin)[0])
                if reregister:
                    candidates.append(_reregistered(seen, crop, margin, max_shift, registration_blur, chroma))
        return seen, min(candidates, key=lambda candidate: float((seen - candidate).pow(2).sum()))
    others = [region(picture) for picture in reencoded(relit)] if reencode else []
    if every:
        return seen, [*softened(region(relit), softness), *others]
    return seen, match_softness(seen, region(relit), softness, others)


def _reregistered(
    seen: torch.Tensor, crop: torch.Tensor, margin: int, max_shift: float, blur: float, chroma: float | None
) -> torch.Tensor:
    """`crop` (a delivered version of the reference region, `margin` around) moved to match `seen` by
    its own registration: a resampled picture's ringing moves a small sharp mark's edges, and
    registered on the sharp reference it lands a quarter pixel off the resampled one (the held-apart
    control set's sample 16 at 128 px, an orange mark on black resized 0.75: 0.041 of full scale
    at the sharp one's shift, 0.008 at its own)."""
    shift = _register(seen, crop, margin, max_shift, blur, chroma)
    return _shifted(crop, shift[None], (seen.shape[1], seen.shape[2]), margin)[0]


DELIVERY_TIE = 1.25  # versions within this factor of the closest's squared error over the rest are tied


def _register(
    seen: torch.Tensor, crop: torch.Tensor, margin: int, max_shift: float, blur: float, chroma: float | None = None
) -> torch.Tensor:
    """The (dx, dy) that best moves `crop` (the reference region with `margin` around) onto `seen`:
    whole pixels up to `max_shift`, then quarters around the best, by normalised correlation of
    luminance and chroma weighted by `chroma` (None: `registration_chroma`'s). With `blur`, both
    compared that blurred: a fractional shift's interpolation (itself a blur) then cannot win by
    making the reference as soft as a resized or re-encoded output. It reads at most 65,536 points
    of the region per candidate (a 1024 px garment: every third row and column), in chunks of at
    most 8 M values."""
    height, width = seen.shape[1:]
    stride = max(1, int(np.ceil(np.sqrt(height * width / 65536))))
    probe = _blur(crop, blur) if blur > 0 else crop
    chroma = registration_chroma(seen) if chroma is None else chroma
    target = _centred_colour((_blur(seen, blur) if blur > 0 else seen)[:, ::stride, ::stride], chroma)
    per_chunk = max(1, 8_000_000 // target.numel())  # a candidate's values: as many as the target's

    def best_of(shifts: torch.Tensor) -> torch.Tensor:
        scores = []
        for start in range(0, len(shifts), per_chunk):
            moved = _centred_colour(_shifted(probe, shifts[start : start + per_chunk], (height, width), margin, stride), chroma)
            scores.append((moved * target).sum(dim=1) / (moved.norm(dim=1) * target.norm()).clamp_min(1e-6))
        return shifts[int(torch.cat(scores).argmax())]

    coarse = best_of(_shift_grid(float(np.floor(max_shift)), 1.0))
    return best_of((coarse + _shift_grid(0.75, 0.25)).clamp(-max_shift, max_shift))


def closest_over(
    output: np.ndarray, versions: list[torch.Tensor], shift: torch.Tensor, where: np.ndarray, margin: int
) -> list[int]:
    """The indices of `versions` (whole reference pictures, float (3, H, W)) that, moved by `shift`,
    are about as close to `output` over `where` as the closest (within `DELIVERY_TIE` of its
    squared error; bool H×W; the frame's outer `margin` pixels left out: a shifted output shows
    there whatever lay outside the picture)."""
    height, width = output.shape[:2]
    mask = torch.from_numpy(where.copy())
    mask[:margin], mask[-margin:], mask[:, :margin], mask[:, -margin:] = False, False, False, False
    seen = torch.from_numpy(output.astype(np.float32)).permute(2, 0, 1)
    whole = (0, 0, width, height)
    errors = [
        float(
            (_shifted(_padded(version, whole, margin), shift[None], (height, width), margin)[0] - seen)
            .pow(2)
            .sum(dim=0)[mask]
            .sum()
        )
        for version in versions
    ]
    best = min(errors)
    return [k for k, error in enumerate(errors) if error <= DELIVERY_TIE * best + 1e-6]


def reencoded(relit: torch.Tensor) -> list[torch.Tensor]:
    """The relit reference picture (float (3, H, W), 0-255) through each accepted delivery path."""
    image = relit.clamp(0, 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return [torch.from_numpy(picture.astype(np.float32)).permute(2, 0, 1) for picture in delivered(image)]


def match_softness(
    seen: torch.Tensor, expected: torch.Tensor, softness: tuple[float, ...], others: list[torch.Tensor] | tuple = ()
) -> torch.Tensor:
    """Of `expected` blurred by each σ in `softness` (0: as it is) and the re-encoded `others`, the
    one closest to `seen`: an output a little softer than the reference or re-encoded is compared
    with a reference treated the same way, so only a change no delivery path makes (a melted mark,
    a longer nose) is left as a difference."""
    candidates = [*softened(expected, softness), *others]
    errors = [float((seen - candidate).pow(2).sum()) for candidate in candidates]
    return candidates[int(np.argmin(errors))]


def softened(expected: torch.Tensor, softness: tuple[float, ...]) -> list[torch.Tensor]:
    """`expected` as it is and blurred by each σ in `softness`."""
    return [expected, *(_blur(expected, sigma) for sigma in softness if sigma > 0)]


def residual(
    seen: torch.Tensor,
    expected: torch.Tensor,
    *,
    blur: float = 0.6,
    window: int = 2,
    chroma: float = 1.0,
    where: torch.Tensor | None = None,
) -> float:
    """The largest colour distance between two aligned regions averaged over `window`² pixels, both
    blurred by `blur` px, as a share of full scale; chroma (at half resolution) weighted by `chroma`;
    only windows whose top-left pixel is in `where` (bool, h×w) when given."""
    difference = _ycc(_blur(seen, blur)) - _ycc(_blur(expected, blur))
    difference[1:] *= chroma
    distance = difference.pow(2).sum(dim=0).sqrt()[None, None]
    size = min(window, distance.shape[-2], distance.shape[-1])
    pooled = F.avg_pool2d(distance, size, stride=1)[0, 0]
    if where is not None:
        pooled = pooled[where[: pooled.shape[0], : pooled.shape[1]]]
    return float(pooled.max()) / 255.0 if pooled.numel() else 0.0


# What counts as a full unit of change for a mark and a garment (the face's: drape.gates.checks.face)
MARK_UNIT, CLOTH_UNIT = 0.3, 0.3
BLUR, WINDOW, CHROMA = 1.0, 3, 0.25  # the comparison's scale, window and chroma weight (benchmarks/README.md)
# a mark is a colour on a plate, and on a plate of nearly its luminance (purple on red, red on blue)
# it is seen in chroma: its registration and residual weigh chroma at these. At 128 px, a purple K
# on red turned 12° read 0.021 at a quarter weight, under the nuisance floor (0.027, a print resized
# 0.75); registered on luminance only, a red Z on blue moved half a pixel read 0.051 at a half
MARK_REGISTRATION_CHROMA, MARK_CHROMA = 0.25, 0.5


def _change(regions, where: torch.Tensor | None = None, chroma: float = CHROMA) -> float:
    return residual(*regions, blur=BLUR, window=WINDOW, chroma=chroma, where=where)


def aligned_texture_scores(
    outputs: np.ndarray, targets: np.ndarray, logo_boxes: list, face_boxes: list, max_shift: float
) -> np.ndarray:
    """Per sample, 1 less the logo region's aligned residual in units of `MARK_UNIT`, floored at 0:
    another letter, case, angle, colour, a lost part, a mirrored or melted mark all leave a residual
    where they differ; a mark a pixel off, relit, or in a picture re-encoded, resampled or a little
    softer as a whole does not (the reference is made as soft and encoded as the picture around the
    mark shows: `align`'s `delivery_from`)."""
    scores = []
    for output, target, box, face in zip(outputs, targets, logo_boxes, face_boxes):
        rest = outside(output.shape, [face, box])
        light, *also = plausible_lights(output, target, rest)
        # how soft and how encoded the output is, read off the picture beyond the mark (and the face,
        # judged on its own): a whole picture resized or re-encoded is compared with a reference made
        # as soft, a mark melted on its own with the sharp one
        beyond = outside(output.shape, [face, _region(box, 0.5, output.shape)])
        regions = align(
            output,
            target,
            box,
            light,
            max_shift=max_shift,
            pad=0.1,
            delivery_from=beyond,
            registration_blur=0.5,
            also=also,
            reregister=True,
            chroma=MARK_REGISTRATION_CHROMA,
        )
        scores.append(0.0 if regions is None else max(0.0, 1.0 - _change(regions, chroma=MARK_CHROMA) / MARK_UNIT))
    return np.array(scores)


def aligned_coherence_scores(
    outputs: np.ndarray, references: np.ndarray, face_boxes: list, masks: np.ndarray, max_shift: float
) -> np.ndarray:
    """Per sample, 1 less the garment region's aligned residual in units of `CLOTH_UNIT`, floored at
    0, over the region (`masks`) grown by `max_shift` + 1 px and inside the frame by as much: a
    turned hue, a denser pattern, a hem or fit that moved, a part added or lost leave a residual there."""
    scores = []
    for output, reference, face, mask in zip(outputs, references, face_boxes, masks):
        region = mask > 127
        if not region.any():
            scores.append(0.0)
            continue
        ys, xs = np.nonzero(region)
        box = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        rest = outside(output.shape, [face], mask)
        light, *also = plausible_lights(output, reference, rest)
        regions = align(
            output,
            reference,
            box,
            light,
            max_shift=max_shift,
            pad=_GARMENT_PAD,
            delivery_from=rest,
            registration_blur=1.0,
            also=also,
        )
        if regions is None:
            scores.append(0.0)
            continue
        reach = int(np.ceil(max_shift)) + 1
        grown = torch.from_numpy(region.astype(np.float32))[None, None]
        grown = F.max_pool2d(grown, 2 * reach + 1, stride=1, padding=reach)[0, 0]
        # the frame's outer `reach` pixels are not judged: an output a pixel or two off shows there
        # whatever lay outside the picture (black, in the nuisance suite)
        grown[:reach], grown[-reach:], grown[:, :reach], grown[:, -reach:] = 0, 0, 0, 0
        x0, y0, x1, y1 = _region(box, _GARMENT_PAD, output.shape)  # the region align compared
        where = grown[y0:y1, x0:x1] > 0
        scores.append(max(0.0, 1.0 - _change(regions, where) / CLOTH_UNIT))
    return np.array(scores)

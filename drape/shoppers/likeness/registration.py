"""Registration for the likeness measure (`drape.shoppers.likeness.face`): the reference face moved,
softened, re-encoded and resampled to meet the output, and the residual left between them.

Once one of the gates' opt-in checks (`gates.*.method: aligned`, removed: they failed tone curves,
sharpening and a shift + re-encoding at every resolution, docs/gates.md); kept here for the one user
that compares a face with itself rather than gating on a threshold, the personalization gate
(`drape.shoppers.gate`). Per face box:
- registration: the reference region is moved by the sub-pixel shift (whole pixels, then quarter
  pixels, up to `max_shift`) that best matches the output's luminance (and its chroma where the
  region's luminance hardly varies: `registration_chroma`), both a little blurred first (else a
  fractional shift wins on a soft output by the blur its interpolation adds);
- delivery: the reference also softened (`softened`), re-encoded and resampled (`delivered`);
- residual: both slightly blurred (codec ringing, resampling), the colour distance per pixel in
  YCbCr with chroma at half resolution as codecs keep it, averaged over small windows; its largest
  value, as a share of full scale, is what the face changed where it changed most.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from drape.gates.checks.checks import _YCC as _YCC_ARRAY
from drape.gates.suites.nuisance import jpeg, resized
from drape.shoppers.likeness.light import Light

_YCC = torch.tensor(_YCC_ARRAY, dtype=torch.float32)  # RGB → YCbCr (JPEG), the one transform the checks use
FACE_PAD = 0.15  # a face box grows by this share of its size
BLUR, WINDOW, CHROMA = 1.0, 3, 0.25  # the residual's scale, window and chroma weight

# What an accepted delivery path may do to a whole picture, searched like the light and the
# registration: re-encoding at ordinary JPEG qualities and a resampling round trip. The values are
# deliberately not the nuisance suite's own (q60, q75, q90; 0.75). Qualities every 5: two encodings 15
# apart quantise a face's chroma differently enough that at 128 px q75 read a skin-tone change of 2.2 ΔE
# against the nearest of q55/70/85, 1.3 against the nearest of these (a quarter step of tone is 2.5+).
CODEC_QUALITIES = (52, 57, 62, 67, 72, 77, 82, 87, 92)
RESAMPLING = (0.7, 0.8, 0.9)


def delivered(image: np.ndarray) -> list[np.ndarray]:
    """`image` (uint8 H×W×3) re-encoded at each of `CODEC_QUALITIES` and resampled at each of
    `RESAMPLING` and back, as uint8 pictures of the same size."""
    batch = image[None]
    paths = [jpeg(quality) for quality in CODEC_QUALITIES] + [resized(factor) for factor in RESAMPLING]
    return [path(batch, [{}], np.random.default_rng(0))[0] for path in paths]


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


def reencoded(relit: torch.Tensor) -> list[torch.Tensor]:
    """The relit reference picture (float (3, H, W), 0-255) through each accepted delivery path."""
    image = relit.clamp(0, 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return [torch.from_numpy(picture.astype(np.float32)).permute(2, 0, 1) for picture in delivered(image)]


def align_versions(
    output: np.ndarray,
    reference: np.ndarray,
    box,
    light: Light,
    *,
    max_shift: float = 2.5,
    pad: float = FACE_PAD,
    softness: tuple[float, ...] = (0.35, 0.6, 0.85),
    registration_blur: float = 1.0,
) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """(output region, every version of the relit reference region moved to match it), float (3, h, w)
    tensors (0-255), for `box` padded by `pad` of its size; None when the box is empty. The versions:
    the reference as it is, blurred by each σ in `softness`, and through each delivery path
    (`reencoded`), all moved by the one shift registration finds (`_register`, on both blurred by
    `registration_blur`)."""
    x0, y0, x1, y1 = _region(box, pad, output.shape)
    if x1 - x0 < 2 or y1 - y0 < 2:
        return None
    margin = int(np.ceil(max_shift)) + 1
    relit = torch.from_numpy(np.clip(light.apply(reference), 0, 255)).permute(2, 0, 1)
    seen = torch.from_numpy(output[y0:y1, x0:x1].astype(np.float32)).permute(2, 0, 1)
    shift = _register(seen, _padded(relit, (x0, y0, x1, y1), margin), margin, max_shift, registration_blur)

    def region(picture: torch.Tensor) -> torch.Tensor:
        return _shifted(_padded(picture, (x0, y0, x1, y1), margin), shift[None], (y1 - y0, x1 - x0), margin)[0]

    return seen, [*softened(region(relit), softness), *(region(picture) for picture in reencoded(relit))]


def change(seen: torch.Tensor, expected: torch.Tensor) -> float:
    """The residual (`residual`) at the likeness measure's scale, window and chroma weight."""
    return residual(seen, expected, blur=BLUR, window=WINDOW, chroma=CHROMA)

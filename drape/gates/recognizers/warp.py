"""Drift of the same face as local geometry: how far parts of the face moved against each other.

A recognizer forgives a face whose lower half is squashed or whose eyes moved: it is built to call
that the same person. Its descriptors also move under what a delivery path does to fine detail (a
median filter, sharpening, re-encoding), as far as under a 10% squash of the lower face, so a limit
on a descriptor distance cannot separate the two per sample (on real portraits at 256 px a mild
denoise reached 0.130, the weakest squash 0.090). Geometry can: no harmless change moves one part of
a face against another. Resampling, codecs, tone curves, sharpening and denoising leave every
feature where it was, and a shift, a small scale or a turn moves all of them alike.

`face_warp` measures it. The face box of the source and of the output, grown by `PAD`, is resampled
so the box is `FACE_SIDE` px wide (the same measure at every resolution), taken as luminance and
blurred by `BLUR` px. Each `PATCH`² patch of the source on a grid (`STEP`) is found in the output
by normalised cross-correlation within `REACH` px (invariant to a patch's brightness and contrast:
a gamma or a white balance changes neither), to a fraction of a pixel (a parabola through the
peak). Patches without structure in two directions (a cheek, a plain forehead: the smaller
eigenvalue of their structure tensor under `TEXTURE` of the face's median, or `MIN_STRUCTURE`)
cannot say where they went and are left out, as are patches whose search reaches outside the
frame or into its outer `FRAME` px (a shifted picture shows black there). One similarity transform (shift, scale, turn) is
fitted to the displacements by least squares and undone by cropping the output where it moved, and
the patches are matched again about their own place (a correlation peak's parabola is biased at half
a pixel, by an amount that depends on the patch); what a second similarity fit leaves is the face's
own change of shape. The measure is the largest residual, each patch's taken per axis as the median
of its own and its grid neighbours' (a feature that moved moves the patches around it; a lone
patch's error, an edge clipped by sharpening, does not), as a share of the face box's width.
Measured on real portraits: benchmarks/drift_margins.py, docs/recognizers.md.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter

from drape.gates.recognizers import box_region

FACE_SIDE, PAD, BLUR = 96, 0.12, 1.0  # the face box resampled to 96 px wide, grown by 12%, blurred by 1 px
PATCH, STEP, REACH = 16, 6, 12  # patches of 16 px every 6 px, each searched within 12 px (12.5% of the face)
# a patch needs structure of a quarter of the face's median and at least MIN_STRUCTURE (a mean squared
# gradient of 0.5 levels² per px²; real faces' medians are 12-37 at 128 px); the frame's outer 3 px are not judged
TEXTURE, MIN_STRUCTURE, FRAME = 0.25, 0.5, 3
_LUMA = np.array([0.299, 0.587, 0.114])


def _face_crop(
    image: np.ndarray, box, moved: np.ndarray | None = None, mode: Image.Resampling = Image.Resampling.BICUBIC
) -> np.ndarray:
    """The face box of `image` (H×W×C, or H×W) grown by `PAD`, resampled to `FACE_SIDE` px across the
    box; with `moved` (a, b, tx, ty: the similarity x' = a x - b y + tx, y' = b x + a y + ty in the
    crop's pixels), what lies at the moved place of each crop pixel, in one resampling."""
    x0, y0, x1, y1 = (float(v) for v in box)
    side = round(FACE_SIDE * (1 + 2 * PAD))
    left, top = x0 - PAD * (x1 - x0), y0 - PAD * (y1 - y0)
    kx, ky = (x1 - x0) * (1 + 2 * PAD) / side, (y1 - y0) * (1 + 2 * PAD) / side
    a, b, tx, ty = (1.0, 0.0, 0.0, 0.0) if moved is None else (float(v) for v in moved)
    plane = image.astype(np.float32) @ _LUMA.astype(np.float32) if image.ndim == 3 else image.astype(np.float32)
    matrix = (kx * a, -kx * b, left + kx * tx, ky * b, ky * a, top + ky * ty)
    crop = Image.fromarray(np.ascontiguousarray(plane), mode="F").transform(
        (side, side), Image.Transform.AFFINE, matrix, resample=mode
    )
    return np.asarray(crop, dtype=np.float32)


def _blurred(plane: np.ndarray) -> np.ndarray:
    """`plane` blurred by `BLUR` px (edges replicated), float64."""
    return gaussian_filter(plane.astype(np.float64), BLUR, mode="nearest", truncate=3.0)


def _grid(side: int) -> np.ndarray:
    """(N, 2): each patch's top-left corner (x, y) in the face crop."""
    starts = np.arange(0, side - PATCH + 1, STEP)
    ys, xs = np.meshgrid(starts, starts, indexing="ij")
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def _box_sums(planes: np.ndarray) -> np.ndarray:
    """(..., H - PATCH + 1, W - PATCH + 1): the sum of each `PATCH`² window of `planes` (..., H, W),
    by an integral image."""
    integral = np.zeros((*planes.shape[:-2], planes.shape[-2] + 1, planes.shape[-1] + 1))
    integral[..., 1:, 1:] = planes.cumsum(-2).cumsum(-1)
    return (
        integral[..., PATCH:, PATCH:]
        - integral[..., :-PATCH, PATCH:]
        - integral[..., PATCH:, :-PATCH]
        + integral[..., :-PATCH, :-PATCH]
    )


def _structure(source: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """Per patch, the smaller eigenvalue of its structure tensor (mean over the patch): how well it
    shows where it moved in both directions."""
    gy, gx = np.gradient(source)
    sums = _box_sums(np.stack([gx * gx, gy * gy, gx * gy])) / (PATCH * PATCH)
    xx, yy, xy = (plane[corners[:, 1], corners[:, 0]] for plane in sums)
    return (xx + yy) / 2 - np.sqrt(((xx - yy) / 2) ** 2 + xy**2)


def _displacements(source: np.ndarray, output: np.ndarray, corners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((N, 2) displacement (dx, dy) of each source patch in the output, to a fraction of a pixel;
    (N,) the peak normalised cross-correlation). The correlations by FFT: a patch and its search
    window (`PATCH` + 2 `REACH` px) correlate without wrapping round."""
    size = PATCH + 2 * REACH
    padded = np.pad(output, REACH, mode="edge")
    patches = np.stack([source[y : y + PATCH, x : x + PATCH] for x, y in corners])
    windows = np.stack([padded[y : y + size, x : x + size] for x, y in corners])
    patches = patches - patches.mean(axis=(1, 2), keepdims=True)
    patches /= np.maximum(np.sqrt((patches**2).sum(axis=(1, 2))), 1e-6)[:, None, None]
    spectrum = np.fft.rfft2(windows) * np.conj(np.fft.rfft2(patches, s=(size, size)))
    span = 2 * REACH + 1
    products = np.fft.irfft2(spectrum, s=(size, size))[:, :span, :span]
    local_sum, local_squares = _box_sums(windows), _box_sums(windows**2)
    ncc = products / np.sqrt(np.maximum(local_squares - local_sum**2 / (PATCH * PATCH), 1e-6))
    count = len(corners)
    iy, ix = np.unravel_index(ncc.reshape(count, -1).argmax(axis=1), (span, span))
    rows = np.arange(count)
    dy = iy - REACH + _vertex(ncc, rows, iy, ix, 1)
    dx = ix - REACH + _vertex(ncc, rows, iy, ix, 0)
    return np.stack([dx, dy], axis=1), ncc[rows, iy, ix]


def _vertex(ncc: np.ndarray, rows: np.ndarray, iy: np.ndarray, ix: np.ndarray, axis: int) -> np.ndarray:
    """The sub-pixel offset of each peak along `axis` (1: y, 0: x): the vertex of the parabola through
    it and its two neighbours; 0 at the search's edge or where the three points are not a peak."""
    last = ncc.shape[1] - 1
    at = iy if axis == 1 else ix
    inner = (at > 0) & (at < last)
    before, after = np.clip(at - 1, 0, last), np.clip(at + 1, 0, last)
    if axis == 1:
        low, mid, high = ncc[rows, before, ix], ncc[rows, iy, ix], ncc[rows, after, ix]
    else:
        low, mid, high = ncc[rows, iy, before], ncc[rows, iy, ix], ncc[rows, iy, after]
    curve = low - 2 * mid + high
    offset = np.where(curve < 0, 0.5 * (low - high) / np.where(curve < 0, curve, -1.0), 0.0)
    return np.where(inner, np.clip(offset, -0.5, 0.5), 0.0)


def _inside(image_shape: tuple[int, ...], box, corners: np.ndarray) -> np.ndarray:
    """bool per patch: its search window lies inside the frame, off its outer `FRAME` px."""
    height, width = image_shape[:2]
    valid = np.zeros((height, width), np.float32)
    valid[FRAME : height - FRAME, FRAME : width - FRAME] = 1
    crop = _face_crop(valid, box, mode=Image.Resampling.BILINEAR)
    padded = np.pad(crop, REACH)  # beyond the crop: outside what was compared
    size = PATCH + 2 * REACH
    return np.array([bool((padded[y : y + size, x : x + size] > 0.999).all()) for x, y in corners])


def _similarity(points: np.ndarray, moved: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((a, b, tx, ty) of the least-squares similarity transform from `points` to `moved`, (N, 2)
    what it leaves)."""
    count = len(points)
    design = np.zeros((2 * count, 4))
    design[0::2] = np.column_stack([points[:, 0], -points[:, 1], np.ones(count), np.zeros(count)])
    design[1::2] = np.column_stack([points[:, 1], points[:, 0], np.zeros(count), np.ones(count)])
    target = moved.reshape(-1)
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    return solution, (design @ solution - target).reshape(-1, 2)


def _neighbourhood_median(corners: np.ndarray, residuals: np.ndarray) -> np.ndarray:
    """Each patch's residual, per axis the median of its own and those of the kept patches within
    one grid step of it: a feature that moved moves its neighbours too, a lone patch's error (an
    edge clipped by sharpening) does not move the median."""
    gap = np.abs(corners[:, None, :] - corners[None, :, :]).max(axis=2)
    near = np.where((gap <= STEP)[..., None], residuals[None, :, :], np.nan)
    return np.nanmedian(near, axis=1)


def face_warp(output: np.ndarray, source: np.ndarray, box) -> float:
    """How far parts of the face in `box` moved against each other from `source` to `output` (RGB
    uint8, the same frame): the largest neighbourhood-averaged residual of the patches'
    displacements after one similarity transform, as a share of the face box's width. NaN when
    fewer than 6 patches have structure and lie inside the frame (nothing to judge)."""
    box_region(box, source.shape, 0.0)  # a box that is not a box inside the image is bad input
    source_plane, output_plane = _blurred(_face_crop(source, box)), _blurred(_face_crop(output, box))
    corners = _grid(source_plane.shape[-1])
    structure = _structure(source_plane, corners)
    kept = _inside(source.shape, box, corners)
    if kept.any():
        kept &= structure >= max(TEXTURE * float(np.median(structure[kept])), MIN_STRUCTURE)
    if int(kept.sum()) < 6:
        return float("nan")
    corners, centres = corners[kept], corners[kept] + PATCH / 2
    # first the face's own shift, scale and turn, undone by cropping the output where it moved (one
    # resampling, as the source's): the patches are then matched about their own place, where a
    # correlation peak's parabola has no bias (at half a pixel it has, and by how much depends on the
    # patch: a 0.5 px shift read as a warp of 0.007 of the face)
    moves, _ = _displacements(source_plane, output_plane, corners)
    moved, _ = _similarity(centres, centres + moves)
    output_plane = _blurred(_face_crop(output, box, moved))
    moves, _ = _displacements(source_plane, output_plane, corners)
    _, residuals = _similarity(centres, centres + moves)
    smoothed = _neighbourhood_median(corners, residuals)
    return float(np.linalg.norm(smoothed, axis=1).max() / FACE_SIDE)


def face_warps(outputs: np.ndarray, sources: np.ndarray, boxes: list) -> np.ndarray:
    """`face_warp` of each output against its source."""
    return np.array([face_warp(output, source, box) for output, source, box in zip(outputs, sources, boxes)])

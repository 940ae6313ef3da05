"""Corruptions a reviewer would catch, applied to clean outputs to prove the gate catches them too.

Each corruption takes (images, meta, rng) for a batch of control samples and returns corrupted
copies; `donors` (other samples of the batch) supply another identity's face or another garment's
logo. Clean variants (mild noise, JPEG re-encoding) are what a good model's outputs look like and
must pass. Used by `drape gate calibrate`, benchmarks/gate_validity.py and the tests.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageFilter

Corruption = Callable[[np.ndarray, list[dict], np.random.Generator], np.ndarray]


def _box(meta: dict, name: str, shape: tuple[int, ...], pad: int = 0) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = meta[name]
    height, width = shape[:2]
    return (
        max(int(np.floor(x0)) - pad, 0),
        max(int(np.floor(y0)) - pad, 0),
        min(int(np.ceil(x1)) + pad, width),
        min(int(np.ceil(y1)) + pad, height),
    )


def _donor(meta: list[dict], index: int, key: str) -> int:
    """The next sample whose `key` (identity_id, garment_id) differs from sample `index`'s."""
    for step in range(1, len(meta)):
        other = (index + step) % len(meta)
        if meta[other][key] != meta[index][key]:
            return other
    return (index + 1) % len(meta)


def _edit_region(images: np.ndarray, meta: list[dict], name: str, pad: int, edit) -> np.ndarray:
    out = images.copy()
    for i, image in enumerate(out):
        x0, y0, x1, y1 = _box(meta[i], name, image.shape, pad)
        if x1 > x0 and y1 > y0:
            image[y0:y1, x0:x1] = edit(image[y0:y1, x0:x1], i)
    return out


def _resize(patch: np.ndarray, width: int, height: int) -> np.ndarray:
    return np.asarray(Image.fromarray(patch).resize((width, height), Image.Resampling.BILINEAR))


# --- clean variants: what a good output looks like ------------------------------------------------


def mild_noise(images, meta, rng):
    return np.clip(images + rng.normal(0, 3, images.shape), 0, 255).astype(np.uint8)


def jpeg(images, meta, rng, quality: int = 90):
    out = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
        out.append(np.asarray(Image.open(buffer).convert("RGB")))
    return np.stack(out)


# --- identity ------------------------------------------------------------------------------------


def _paste_from_donor(images, meta, box: str, differing: str) -> np.ndarray:
    """Each sample's `box` region replaced by that region of a sample whose `differing` id differs."""

    def edit(patch, i):
        donor = _donor(meta, i, differing)
        x0, y0, x1, y1 = _box(meta[donor], box, images[donor].shape)
        return _resize(images[donor][y0:y1, x0:x1], patch.shape[1], patch.shape[0])

    return _edit_region(images, meta, box, 0, edit)


def other_face(images, meta, rng):
    """The face of another identity pasted into the face box."""
    return _paste_from_donor(images, meta, "face_box", "identity_id")


def skin_tone_shift(images, meta, rng):
    """Skin pixels of the face pushed towards another tone."""

    def edit(patch, i):
        shift = np.array([40, -25, -45]) if patch.mean() > 110 else np.array([70, 45, 25])
        return np.clip(patch.astype(int) + shift, 0, 255).astype(np.uint8)

    return _edit_region(images, meta, "face_box", 0, edit)


def face_warp(images, meta, rng):
    """Face geometry squeezed: the central band of the face stretched over the whole box."""

    def edit(patch, i):
        h, w = patch.shape[:2]
        return _resize(patch[h // 4 : h - h // 4 or h, :], w, h)

    return _edit_region(images, meta, "face_box", 0, edit)


# --- logo ----------------------------------------------------------------------------------------


def logo_blur(images, meta, rng):
    """The logo melted: blurred past recognition, damage reaching past the shift tolerance."""
    return _edit_region(
        images, meta, "logo_box", 2, lambda p, i: np.asarray(Image.fromarray(p).filter(ImageFilter.GaussianBlur(2)))
    )


def logo_elastic(images, meta, rng):
    """The logo alone warped by a smooth random displacement field."""

    def edit(patch, i):
        h, w = patch.shape[:2]
        ys, xs = np.mgrid[0:h, 0:w]
        phase = rng.uniform(0, 2 * np.pi, 2)
        dx = 2.0 * np.sin(2 * np.pi * ys / max(h, 1) + phase[0])
        dy = 2.0 * np.sin(2 * np.pi * xs / max(w, 1) + phase[1])
        src_x, src_y = np.clip((xs + dx).round().astype(int), 0, w - 1), np.clip((ys + dy).round().astype(int), 0, h - 1)
        return patch[src_y, src_x]

    return _edit_region(images, meta, "logo_box", 0, edit)


def logo_mirror(images, meta, rng):
    """The logo mirrored left to right."""
    return _edit_region(images, meta, "logo_box", 0, lambda p, i: p[:, ::-1])


def logo_swap(images, meta, rng):
    """Another garment's logo in place of this one."""
    return _paste_from_donor(images, meta, "logo_box", "garment_id")


# --- cloth ---------------------------------------------------------------------------------------


def _garment_region(images, meta, masks, transform):
    out = images.copy()
    for i, (image, mask) in enumerate(zip(images, masks)):
        region = mask > 127
        moved_image, moved_mask = transform(image, region, i)
        out[i][region] = np.asarray(Image.fromarray(image).filter(ImageFilter.BoxBlur(3)))[region]  # hole filled
        out[i][moved_mask] = moved_image[moved_mask]
    return out


def garment_shift(images, meta, rng, masks=None, pixels: int = 4):
    """The garment moved sideways by `pixels`."""
    return _garment_region(
        images, meta, masks, lambda image, region, i: (np.roll(image, pixels, axis=1), np.roll(region, pixels, axis=1))
    )


def garment_scale(images, meta, rng, masks=None, factor: float = 0.8):
    """The garment shrunk about its centre."""

    def transform(image, region, i):
        h, w = region.shape
        ys, xs = np.nonzero(region)
        cy, cx = (ys.mean(), xs.mean()) if len(ys) else (h / 2, w / 2)
        grid_y, grid_x = np.mgrid[0:h, 0:w]
        src_y = np.clip(((grid_y - cy) / factor + cy).round().astype(int), 0, h - 1)
        src_x = np.clip(((grid_x - cx) / factor + cx).round().astype(int), 0, w - 1)
        return image[src_y, src_x], region[src_y, src_x]

    return _garment_region(images, meta, masks, transform)


def wrong_pattern(images, meta, rng, masks=None):
    """Another garment's cloth inside this garment's silhouette."""

    def transform(image, region, i):
        return images[_donor(meta, i, "garment_id")], region

    return _garment_region(images, meta, masks, transform)


def _skin(image: np.ndarray, meta: dict) -> np.ndarray:
    """The person's skin colour: the median of the face box's lower middle (cheeks, below the eyes)."""
    x0, y0, x1, y1 = _box(meta, "face_box", image.shape)
    h, w = y1 - y0, x1 - x0
    top, left = y0 + int(h * 0.55), x0 + int(w * 0.2)
    cheeks = image[top : max(y0 + int(h * 0.85), top + 1), left : max(x0 + int(w * 0.8), left + 1)]
    return np.median(cheeks.reshape(-1, 3), axis=0).astype(np.uint8)


def sleeve_missing(images, meta, rng, masks=None):
    """One sleeve gone: the garment below and outside the left shoulder becomes the bare arm (the
    person's skin colour), as a model that drops the sleeve renders it. Garments without sleeves
    (dresses) have none to lose: see `applicable`."""
    out = images.copy()
    for i, (image, mask) in enumerate(zip(images, masks)):
        points = meta[i].get("keypoints", {})
        # the shoulder on the image's left: the generator's `shoulder_l`, or OpenPose's `r_shoulder`
        # (the person's right, facing the camera) in an imported sample
        shoulder = points.get("shoulder_l") or points.get("r_shoulder")
        if shoulder is None:
            continue  # no shoulder to cut below: the sample stays as it is (and `applicable` skips it)
        (sx, sy) = shoulder
        ys, xs = np.mgrid[0 : mask.shape[0], 0 : mask.shape[1]]
        sleeve = (mask > 127) & (xs < sx + 1) & (ys > sy - 2)
        out[i][sleeve] = _skin(image, meta[i])
    return out


CLEAN: dict[str, Corruption] = {"mild noise": mild_noise, "jpeg q90": jpeg}
CORRUPTIONS: dict[str, dict[str, Corruption]] = {
    "identity": {"another identity's face": other_face, "skin-tone shift": skin_tone_shift, "face geometry warp": face_warp},
    "texture": {
        "logo blurred (melted)": logo_blur,
        "logo elastic warp": logo_elastic,
        "logo mirrored": logo_mirror,
        "logo replaced by another": logo_swap,
    },
    "coherence": {
        "garment shifted 4 px": garment_shift,
        "garment scaled 0.8": garment_scale,
        "wrong pattern": wrong_pattern,
        "sleeve missing": sleeve_missing,
    },
}
NEEDS_MASKS = {garment_shift, garment_scale, wrong_pattern, sleeve_missing}


MIRROR_SYMMETRIC = {"A", "M", "W"}  # mirroring these marks changes nothing a reviewer would flag
SLEEVED = {"tee", "long_sleeve"}  # drape.data.synth draws dresses sleeveless


def applicable(corruption: Corruption, meta: list[dict]) -> np.ndarray:
    """Which samples a corruption really damages (a mirrored 'A' is still an 'A'; a sleeveless dress
    has no sleeve to lose). An imported sample (VITON-HD, DressCode) has no drawn garment in its meta:
    its print is taken as not mirror-symmetric (a real print rarely is), and its sleeves as unknown, so
    the sleeve corruption is not counted on it."""
    if corruption is logo_mirror:
        return np.array([m.get("garment", {}).get("logo") not in MIRROR_SYMMETRIC for m in meta])
    if corruption is sleeve_missing:
        return np.array([m.get("garment", {}).get("category") in SLEEVED for m in meta])
    return np.ones(len(meta), dtype=bool)


def apply(corruption: Corruption, images: np.ndarray, meta: list[dict], masks: np.ndarray, seed: int = 0) -> np.ndarray:
    """Apply one corruption (or clean variant) to a batch with a fixed seed."""
    rng = np.random.default_rng(seed)
    if corruption in NEEDS_MASKS:
        return corruption(images, meta, rng, masks=masks)
    return corruption(images, meta, rng)

"""Synthetic try-on data with the structure the gates test.

Identities have fixed face attributes (skin tone, face shape, eye spacing, nose, hair) and are
photographed in several poses over different backgrounds. Garments are flat-lays with a
category (tee, long sleeve, dress), a colour, a pattern (solid, stripes, checks, dots) and a logo
rendered with a font. The target is the person wearing the garment: the garment texture and logo
are warped onto the posed torso, and arms crossing the body hide parts of it. Each sample also
carries the try-on inputs (agnostic image, its mask, a rendered pose map) and metadata (ids, face
box, logo box in the target, keypoints, garment mask).

Everything is drawn at `SUPERSAMPLE`× the output resolution and downsampled, so small logos and
faces stay legible at 64 px. Attributes are pure functions of (seed, id): the same identity looks
the same in every stage and in the control set. A non-square resolution (height, width), such as
VITON-HD's 1024×768, is drawn on a square of its longer side and cropped to its centre, the
person kept whole and the boxes and keypoints moved with the crop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
from PIL import Image, ImageFilter

from drape.config.data import height_width, json_resolution
from drape.data.portraits import PORTRAITS
from drape.data.synth_draw import (
    FACE,
    GARMENT,
    GARMENT_COLOURS,
    HAIR,
    HAIR_COLOURS,
    PLAIN,
    SKIN,
    SKIN_TONES,
    SUPERSAMPLE,
    Variation,
    downsample,
    make_pose,
    pick,
    pose_map,
    render_flat_lay,
    render_person,
)

CATEGORIES = ("tee", "long_sleeve", "dress")
PATTERNS = ("solid", "stripes", "checks", "dots")
ARM_POSES = ("down", "out", "crossed", "raised")
FACES = ("drawn", "portraits")  # data.synthetic.faces
LOGO_TEXTS = ("A", "K", "Z", "M", "R", "OK", "ZX", "DR", "W", "Q")
# data.synthetic.marks 'prices': a price tag's text (synth_draw draws a '$' mark on a wider plate, so
# PP-OCR reads it at 128 px; a changed price is a regression the OCR check must catch)
PRICE_TEXTS = ("$19", "$24", "$35", "$49", "$58", "$62", "$76", "$83", "$97")
MARKS = {"letters": LOGO_TEXTS, "prices": PRICE_TEXTS}  # data.synthetic.marks
# Stage emphasis: which patterns and arm poses each stage's samples draw from.
STAGE_BIAS: dict[str, dict[str, tuple[str, ...]]] = {
    "identity": {"patterns": ("solid",), "poses": ARM_POSES},
    "texture": {"patterns": ("stripes", "checks", "dots"), "poses": ("down", "out")},
    "geometry": {"patterns": PATTERNS, "poses": ("crossed", "raised", "out")},
    "denoise": {"patterns": PATTERNS, "poses": ARM_POSES},
    "control": {"patterns": PATTERNS, "poses": ARM_POSES},
}
# A control set of price tags (marks 'prices') is what the OCR check judges, and it judges only a tag
# every crop reads alike (drape.gates.checks.ocr.legible): an arm across the tag ('crossed') leaves it
# unread. Its control samples keep the arms off the tag, so their prices are judged (6 of 6 in
# configs/rehearsal-gate.yaml, where 'crossed' left 3 of 6; benchmarks/price_tags.py). `pick` draws
# one number whatever the count of poses: the samples' people and garments are `STAGE_BIAS`'s draw's.
LEGIBLE_CONTROL: dict[str, tuple[str, ...]] = {"patterns": PATTERNS, "poses": ("down", "out", "raised")}


def stage_bias(split: str, marks: str = "letters") -> dict[str, tuple[str, ...]]:
    """The patterns and arm poses `split`'s samples draw from (`STAGE_BIAS`; a price-tag control set's
    poses leave the tag in view: `LEGIBLE_CONTROL`)."""
    return LEGIBLE_CONTROL if split == "control" and marks == "prices" else STAGE_BIAS[split]


@dataclass(frozen=True)
class Identity:
    identity_id: int
    skin: tuple[int, int, int]
    face_aspect: float  # width / height of the face ellipse
    eye_spacing: float  # fraction of face width between eye centres
    nose_length: float  # fraction of face height
    hair: tuple[int, int, int]
    hair_long: bool
    portrait: str = ""  # a real face (drape.data.portraits) composed into the head; "": the drawn face


@dataclass(frozen=True)
class Garment:
    garment_id: int
    category: str
    colour: tuple[int, int, int]
    accent: tuple[int, int, int]
    pattern: str
    logo: str
    logo_colour: tuple[int, int, int]


@dataclass
class Sample:
    key: str
    target: Image.Image
    agnostic: Image.Image
    mask: Image.Image
    pose: Image.Image
    garment: Image.Image
    garment_mask: Image.Image
    meta: dict
    # conditioning a public dataset ships (`drape.data.shards.CONDITION_FIELDS`), where present
    conditions: dict[str, Image.Image] = field(default_factory=dict)


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng([abs(int(s)) for s in seed])


def make_identity(seed: int, identity_id: int, faces: str = "drawn") -> Identity:
    """The fixed face attributes of one identity; `faces` 'portraits': a real portrait's face
    (`drape.data.portraits.PORTRAITS`, by identity id) instead of the drawn one."""
    rng = _rng(seed, 1, identity_id)
    if faces not in FACES:
        raise ValueError(f"data.synthetic.faces {faces!r}: expected one of {', '.join(FACES)}")
    return Identity(
        identity_id,
        pick(rng, SKIN_TONES),
        float(rng.uniform(0.7, 1.0)),
        float(rng.uniform(0.3, 0.5)),
        float(rng.uniform(0.12, 0.28)),
        pick(rng, HAIR_COLOURS),
        bool(rng.integers(2)),
        PORTRAITS[identity_id % len(PORTRAITS)] if faces == "portraits" else "",
    )


def make_garment(seed: int, garment_id: int, marks: str = "letters") -> Garment:
    """The fixed attributes of one catalog garment; `marks` ('letters' or 'prices', `MARKS`) is what
    its logo plate says."""
    if marks not in MARKS:
        raise ValueError(f"data.synthetic.marks {marks!r}: expected one of {', '.join(MARKS)}")
    rng = _rng(seed, 2, garment_id)
    colour = pick(rng, GARMENT_COLOURS)
    others = [c for c in GARMENT_COLOURS if c != colour]
    return Garment(
        garment_id,
        pick(rng, CATEGORIES),
        colour,
        pick(rng, others),
        pick(rng, PATTERNS),
        pick(rng, MARKS[marks]),
        pick(rng, [c for c in others if sum(abs(a - b) for a, b in zip(c, colour)) > 200] or others),
    )


Resolution = int | tuple[int, int]  # a side, or (height, width)


def make_sample(
    seed: int,
    key: str,
    identity: Identity,
    garment: Garment,
    arm_pose: str,
    photo_seed: int,
    resolution: Resolution,
    variation: Variation = PLAIN,
) -> Sample:
    """One try-on training sample at `resolution` (a side, or (height, width)); `variation` draws it
    subtly otherwise (what `drape.gates.suites.regressions` needs), everything else the same."""
    height, width = height_width(resolution)
    side = max(height, width)
    square = _square_sample(seed, key, identity, garment, arm_pose, photo_seed, side, variation)
    if height == width:
        return square
    return _centre_crop(square, height, width, resolution)


def _square_sample(
    seed: int,
    key: str,
    identity: Identity,
    garment: Garment,
    arm_pose: str,
    photo_seed: int,
    resolution: int,
    variation: Variation,
) -> Sample:
    size = resolution * SUPERSAMPLE
    rng = _rng(seed, 3, photo_seed)
    points = make_pose(rng, arm_pose, size)
    photo, labels, face_box, logo_box = render_person(identity, garment, points, rng, size, variation)
    garment_mask = labels.point(lambda v: 255 if v == GARMENT else 0)
    masked = labels.point(lambda v: 255 if v in (GARMENT, SKIN) else 0).filter(ImageFilter.MaxFilter(2 * SUPERSAMPLE + 1))
    face = labels.point(lambda v: 255 if v in (FACE, HAIR) else 0)
    masked = Image.composite(Image.new("L", (size, size), 0), masked, face)
    scale = resolution / size
    meta = {
        "key": key,
        "identity_id": identity.identity_id,
        "garment_id": garment.garment_id,
        "arm_pose": arm_pose,
        "identity": _fields(identity),
        "garment": asdict(garment),
        "resolution": resolution,
        "face_box": [round(v * scale, 2) for v in face_box],
        "logo_box": [round(v * scale, 2) for v in logo_box],
        "keypoints": {name: [round(x * scale, 2), round(y * scale, 2)] for name, (x, y) in points.items()},
    }
    target, mask = downsample(photo, resolution), _binarise(masked, resolution)
    agnostic = Image.composite(Image.new("RGB", target.size, (128, 128, 128)), target, mask)
    return Sample(
        key,
        target,
        agnostic,
        mask,
        downsample(pose_map(points, size), resolution),
        downsample(render_flat_lay(garment, size), resolution),
        _binarise(garment_mask, resolution),
        meta,
    )


def _centre_crop(sample: Sample, height: int, width: int, resolution: Resolution) -> Sample:
    """`sample` (square, of the longer side) cut to height × width around its centre; boxes and keypoints moved with it."""
    side = sample.target.size[0]
    left, top = (side - width) // 2, (side - height) // 2
    box = (left, top, left + width, top + height)
    meta = dict(sample.meta)
    meta["resolution"] = json_resolution(resolution)
    for name in ("face_box", "logo_box"):
        x0, y0, x1, y1 = meta[name]
        meta[name] = [round(x0 - left, 2), round(y0 - top, 2), round(x1 - left, 2), round(y1 - top, 2)]
    meta["keypoints"] = {name: [round(x - left, 2), round(y - top, 2)] for name, (x, y) in meta["keypoints"].items()}
    images = {
        field: getattr(sample, field).crop(box) for field in ("target", "agnostic", "mask", "pose", "garment", "garment_mask")
    }
    return replace(sample, meta=meta, **images)


def _fields(identity: Identity) -> dict:
    """The identity as a sample's metadata records it; a drawn face has no `portrait` key, so drawn
    samples (the demo's, every test dataset) stay byte for byte what they were."""
    fields = asdict(identity)
    if not fields["portrait"]:
        del fields["portrait"]
    return fields


def _binarise(mask: Image.Image, resolution: int) -> Image.Image:
    return downsample(mask, resolution).point(lambda v: 255 if v >= 128 else 0)


def photo_seed(split: str, index: int) -> int:
    """The seed of sample `index`'s photo (pose, background) in `split`."""
    return list(STAGE_BIAS).index(split) * 1_000_003 + index


def redraw(
    seed: int, meta: dict, *, identity: Identity | None = None, garment: Garment | None = None, variation: Variation = PLAIN
) -> Sample:
    """Sample `meta` (as `generate_split` made it, with `seed`) drawn again: the same photo, with
    `identity`, `garment` or `variation` in place of its own. Without them, the same sample."""
    split, _, index = meta["key"].rpartition("-")
    if split not in STAGE_BIAS or not index.isdigit():
        raise ValueError(f"sample key {meta['key']!r}: expected '<split>-<index>' of a synthetic split")
    return make_sample(
        seed,
        meta["key"],
        identity or identity_of(meta),
        garment or garment_of(meta),
        meta["arm_pose"],
        photo_seed(split, int(index)),
        _resolution_of(meta["resolution"]),
        variation,
    )


def _resolution_of(value: int | list[int]) -> Resolution:
    return value if isinstance(value, int) else height_width(value)


def _tuples(fields: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}  # JSON made the colours lists


def identity_of(meta: dict) -> Identity:
    return Identity(**_tuples(meta["identity"]))


def garment_of(meta: dict) -> Garment:
    return Garment(**_tuples(meta["garment"]))


def generate_split(
    *,
    seed: int,
    split: str,
    num_samples: int,
    num_identities: int,
    num_garments: int,
    resolution: Resolution,
    faces: str = "drawn",
    marks: str = "letters",
):
    """Yield `num_samples` samples for a stage (or 'control'), biased by STAGE_BIAS[split]; `faces`:
    'drawn' (default) or 'portraits' (real faces, `make_identity`); `marks`: 'letters' (default) or
    'prices' (`make_garment`)."""
    bias = stage_bias(split, marks)
    split_index = list(STAGE_BIAS).index(split)
    rng = _rng(seed, 4, split_index)
    garments = [make_garment(seed, g, marks) for g in range(num_garments)]
    eligible = [g for g in garments if g.pattern in bias["patterns"]] or garments
    for index in range(num_samples):
        identity = make_identity(seed, int(rng.integers(num_identities)), faces)
        garment = eligible[int(rng.integers(len(eligible)))]
        arm_pose = pick(rng, bias["poses"])
        yield make_sample(seed, f"{split}-{index:05d}", identity, garment, arm_pose, photo_seed(split, index), resolution)

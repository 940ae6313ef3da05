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
the same in every stage and in the control set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

SUPERSAMPLE = 4
CATEGORIES = ("tee", "long_sleeve", "dress")
PATTERNS = ("solid", "stripes", "checks", "dots")
ARM_POSES = ("down", "out", "crossed", "raised")
LOGO_TEXTS = ("A", "K", "Z", "M", "R", "OK", "ZX", "DR", "W", "Q")
SKIN_TONES = ((255, 224, 196), (241, 194, 150), (224, 172, 105), (198, 134, 66), (141, 85, 36), (92, 56, 30))
HAIR_COLOURS = ((20, 20, 20), (90, 56, 37), (180, 140, 70), (200, 60, 30), (230, 230, 220))
GARMENT_COLOURS = (
    (200, 30, 40),
    (30, 90, 200),
    (30, 150, 70),
    (240, 200, 40),
    (120, 40, 160),
    (240, 240, 240),
    (30, 30, 30),
    (250, 130, 30),
)
LIMBS = (
    ("neck", "head"),
    ("shoulder_l", "shoulder_r"),
    ("shoulder_l", "elbow_l"),
    ("elbow_l", "wrist_l"),
    ("shoulder_r", "elbow_r"),
    ("elbow_r", "wrist_r"),
    ("shoulder_l", "hip_l"),
    ("shoulder_r", "hip_r"),
    ("hip_l", "hip_r"),
)

# Stage emphasis: which patterns and arm poses each stage's samples draw from.
STAGE_BIAS = {
    "identity": {"patterns": ("solid",), "poses": ARM_POSES},
    "texture": {"patterns": ("stripes", "checks", "dots"), "poses": ("down", "out")},
    "geometry": {"patterns": PATTERNS, "poses": ("crossed", "raised", "out")},
    "denoise": {"patterns": PATTERNS, "poses": ARM_POSES},
    "control": {"patterns": PATTERNS, "poses": ARM_POSES},
}


@dataclass(frozen=True)
class Identity:
    identity_id: int
    skin: tuple[int, int, int]
    face_aspect: float  # width / height of the face ellipse
    eye_spacing: float  # fraction of face width between eye centres
    nose_length: float  # fraction of face height
    hair: tuple[int, int, int]
    hair_long: bool


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


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng([abs(int(s)) for s in seed])


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def make_identity(seed: int, identity_id: int) -> Identity:
    """The fixed face attributes of one identity."""
    rng = _rng(seed, 1, identity_id)
    return Identity(
        identity_id,
        _pick(rng, SKIN_TONES),
        float(rng.uniform(0.7, 1.0)),
        float(rng.uniform(0.3, 0.5)),
        float(rng.uniform(0.12, 0.28)),
        _pick(rng, HAIR_COLOURS),
        bool(rng.integers(2)),
    )


def make_garment(seed: int, garment_id: int) -> Garment:
    """The fixed attributes of one catalog garment."""
    rng = _rng(seed, 2, garment_id)
    colour = _pick(rng, GARMENT_COLOURS)
    others = [c for c in GARMENT_COLOURS if c != colour]
    return Garment(
        garment_id,
        _pick(rng, CATEGORIES),
        colour,
        _pick(rng, others),
        _pick(rng, PATTERNS),
        _pick(rng, LOGO_TEXTS),
        _pick(rng, [c for c in others if sum(abs(a - b) for a, b in zip(c, colour)) > 200] or others),
    )


def garment_texture(garment: Garment, width: int, height: int) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """The torso texture (pattern + logo) and the logo box in texture pixels."""
    image = Image.new("RGB", (width, height), garment.colour)
    draw = ImageDraw.Draw(image)
    step = max(width // 6, 4)
    if garment.pattern == "stripes":
        for y in range(0, height, step):
            draw.rectangle([0, y, width, y + step // 2 - 1], fill=garment.accent)
    elif garment.pattern == "checks":
        for y in range(0, height, step):
            for x in range((y // step) % 2 * step, width, 2 * step):
                draw.rectangle([x, y, x + step - 1, y + step - 1], fill=garment.accent)
    elif garment.pattern == "dots":
        for y in range(step // 2, height, step):
            for x in range(step // 2, width, step):
                draw.ellipse([x - step // 4, y - step // 4, x + step // 4, y + step // 4], fill=garment.accent)
    box = _draw_logo(draw, garment, width, height)
    return image, box


def _draw_logo(draw: ImageDraw.ImageDraw, garment: Garment, width: int, height: int) -> tuple[int, int, int, int]:
    """Draw the logo on a plate in the chest area; returns its box (x0, y0, x1, y1)."""
    plate_w, plate_h = int(width * 0.56), int(height * 0.36)
    x0, y0 = (width - plate_w) // 2, int(height * 0.14)
    plate = tuple(255 - c for c in garment.logo_colour) if garment.pattern != "solid" else garment.colour
    draw.rectangle([x0, y0, x0 + plate_w, y0 + plate_h], fill=plate)
    font = ImageFont.load_default(size=max(int(plate_h * 0.9), 6))
    left, top, right, bottom = draw.textbbox((0, 0), garment.logo, font=font)
    tx = x0 + (plate_w - (right - left)) // 2 - left
    ty = y0 + (plate_h - (bottom - top)) // 2 - top
    draw.text(
        (tx, ty),
        garment.logo,
        fill=garment.logo_colour,
        font=font,
        stroke_width=max(plate_h // 14, 1),
        stroke_fill=garment.logo_colour,
    )
    return x0, y0, x0 + plate_w, y0 + plate_h


def _perspective_coefficients(source: list[tuple[float, float]], target: list[tuple[float, float]]) -> list[float]:
    """PIL PERSPECTIVE data mapping output points `target` back to input points `source`."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(target, source):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs.extend([u, v])
    return np.linalg.solve(np.array(rows, float), np.array(rhs, float)).tolist()


def _forward_map(quad: list[tuple[float, float]], width: int, height: int, point: tuple[float, float]) -> tuple[float, float]:
    coeffs = _perspective_coefficients(quad, [(0, 0), (width, 0), (width, height), (0, height)])
    a, b, c, d, e, f, g, h = coeffs
    x, y = point
    w = g * x + h * y + 1
    return (a * x + b * y + c) / w, (d * x + e * y + f) / w


def make_pose(rng: np.random.Generator, arm_pose: str, size: float) -> dict[str, tuple[float, float]]:
    """Keypoints in canvas pixels for one photo."""
    cx = size * (0.5 + rng.uniform(-0.06, 0.06))
    lean = rng.uniform(-0.04, 0.04) * size
    shoulder_y, hip_y = size * rng.uniform(0.36, 0.40), size * rng.uniform(0.70, 0.74)
    half = size * rng.uniform(0.15, 0.18)
    hip_half = half * rng.uniform(0.8, 0.95)
    points = {
        "neck": (cx + lean, shoulder_y - size * 0.03),
        "head": (cx + lean, size * 0.19),
        "shoulder_l": (cx - half + lean, shoulder_y),
        "shoulder_r": (cx + half + lean, shoulder_y),
        "hip_l": (cx - hip_half, hip_y),
        "hip_r": (cx + hip_half, hip_y),
    }
    arm = size * 0.17
    for side, sign in (("l", -1), ("r", 1)):
        sx, sy = points[f"shoulder_{side}"]
        if arm_pose == "down":
            elbow, wrist = (sx + sign * arm * 0.25, sy + arm), (sx + sign * arm * 0.35, sy + 2 * arm)
        elif arm_pose == "out":
            elbow, wrist = (sx + sign * arm * 0.7, sy + arm * 0.7), (sx + sign * arm * 1.3, sy + arm * 1.3)
        elif arm_pose == "crossed":
            elbow = (sx + sign * arm * 0.2, sy + arm)
            wrist = (cx - sign * half * 0.6, sy + arm * (1.15 if side == "l" else 1.45))
        else:  # raised: the right arm goes up, the left stays down
            elbow = (sx + sign * arm * 0.6, sy - arm * 0.6) if side == "r" else (sx - arm * 0.25, sy + arm)
            wrist = (sx + sign * arm * 0.6, sy - arm * 1.5) if side == "r" else (sx - arm * 0.35, sy + 2 * arm)
        points[f"elbow_{side}"], points[f"wrist_{side}"] = elbow, wrist
    return {name: (float(x), float(y)) for name, (x, y) in points.items()}


# Label values of the part map drawn alongside the photo.
BACKGROUND, GARMENT, SKIN, FACE, HAIR, LEGS = 0, 1, 2, 3, 4, 5


def _texture_size(garment: Garment) -> tuple[int, int]:
    """Pixels of the flat torso texture: taller for a dress."""
    return 96 * SUPERSAMPLE // 4, (150 if garment.category == "dress" else 110) * SUPERSAMPLE // 4


def _torso_quad(points: dict, category: str, size: float) -> list[tuple[float, float]]:
    (slx, sly), (srx, sry) = points["shoulder_l"], points["shoulder_r"]
    (hlx, hly), (hrx, hry) = points["hip_l"], points["hip_r"]
    if category == "dress":
        flare, hem = size * 0.06, size * 0.18
        return [(slx, sly), (srx, sry), (hrx + flare, hry + hem), (hlx - flare, hly + hem)]
    return [(slx, sly), (srx, sry), (hrx, hry), (hlx, hly)]


def _draw_both(photo: ImageDraw.ImageDraw, labels: ImageDraw.ImageDraw, label: int, method: str, *args, **kwargs):
    getattr(photo, method)(*args, **kwargs)
    kwargs = {k: (label if k == "fill" else v) for k, v in kwargs.items() if k != "outline"}
    getattr(labels, method)(*args, **kwargs)


def render_person(
    identity: Identity, garment: Garment, points: dict, rng: np.random.Generator, size: int
) -> tuple[Image.Image, Image.Image, tuple, tuple]:
    """Draw the person wearing the garment: (photo, part labels, face box, logo box) in canvas px."""
    top, bottom = _pick(rng, GARMENT_COLOURS), _pick(rng, SKIN_TONES)
    photo = Image.new("RGB", (size, size), tuple(int(0.6 * t + 0.4 * b) for t, b in zip(top, bottom)))
    labels = Image.new("L", (size, size), BACKGROUND)
    draw, lab = ImageDraw.Draw(photo), ImageDraw.Draw(labels)
    draw.rectangle([0, int(size * rng.uniform(0.75, 0.9)), size, size], fill=tuple(int(c * 0.7) for c in top))
    limb = max(int(size * 0.05), 2)
    (hlx, hly), (hrx, hry) = points["hip_l"], points["hip_r"]
    for hx, hy in ((hlx, hly), (hrx, hry)):  # legs
        _draw_both(draw, lab, LEGS, "line", [(hx, hy), (hx, size)], fill=(40, 40, 70), width=limb * 2)
    quad = _torso_quad(points, garment.category, size)
    tex_w, tex_h = _texture_size(garment)
    texture, logo_box = garment_texture(garment, tex_w, tex_h)
    coeffs = _perspective_coefficients([(0, 0), (tex_w, 0), (tex_w, tex_h), (0, tex_h)], quad)
    warped = texture.transform((size, size), Image.Transform.PERSPECTIVE, coeffs, Image.Resampling.BILINEAR)
    quad_mask = Image.new("L", (size, size), 0)
    ImageDraw.Draw(quad_mask).polygon(quad, fill=255)
    photo.paste(warped, (0, 0), quad_mask)
    lab.polygon(quad, fill=GARMENT)
    corners = [
        _forward_map(quad, tex_w, tex_h, p)
        for p in ((logo_box[0], logo_box[1]), (logo_box[2], logo_box[1]), (logo_box[2], logo_box[3]), (logo_box[0], logo_box[3]))
    ]
    logo_bbox = (min(x for x, _ in corners), min(y for _, y in corners), max(x for x, _ in corners), max(y for _, y in corners))
    _draw_arms(draw, lab, identity, garment, points, limb)
    face_box = _draw_head(draw, lab, identity, points, size)
    return photo, labels, face_box, logo_bbox


def _draw_arms(draw, lab, identity: Identity, garment: Garment, points: dict, limb: int) -> None:
    sleeve_to_wrist = garment.category == "long_sleeve"
    for side in ("l", "r"):
        shoulder, elbow, wrist = points[f"shoulder_{side}"], points[f"elbow_{side}"], points[f"wrist_{side}"]
        _draw_both(draw, lab, SKIN, "line", [shoulder, elbow, wrist], fill=identity.skin, width=limb * 2, joint="curve")
        if garment.category != "dress":  # sleeves cover the upper arm, or the whole arm for long sleeves
            sleeve_end = wrist if sleeve_to_wrist else tuple((s + 2 * e) / 3 for s, e in zip(shoulder, elbow))
            path = [shoulder, elbow, sleeve_end] if sleeve_to_wrist else [shoulder, sleeve_end]
            _draw_both(draw, lab, GARMENT, "line", path, fill=garment.colour, width=int(limb * 2.6), joint="curve")
        wx, wy = wrist
        _draw_both(draw, lab, SKIN, "ellipse", [wx - limb, wy - limb, wx + limb, wy + limb], fill=identity.skin)


def _draw_head(draw, lab, identity: Identity, points: dict, size: int) -> tuple:
    (nx, ny), (hx, hy) = points["neck"], points["head"]
    face_h = size * 0.2
    face_w = face_h * identity.face_aspect
    _draw_both(draw, lab, SKIN, "rectangle", [nx - face_w * 0.22, hy, nx + face_w * 0.22, ny + size * 0.01], fill=identity.skin)
    box = (hx - face_w / 2, hy - face_h / 2, hx + face_w / 2, hy + face_h / 2)
    if identity.hair_long:
        _draw_both(
            draw,
            lab,
            HAIR,
            "rectangle",
            [box[0] - face_w * 0.08, hy - face_h * 0.1, box[2] + face_w * 0.08, hy + face_h * 0.55],
            fill=identity.hair,
        )
    _draw_both(draw, lab, FACE, "ellipse", list(box), fill=identity.skin)
    _draw_both(
        draw,
        lab,
        HAIR,
        "chord",
        [box[0] - face_w * 0.04, box[1] - face_h * 0.08, box[2] + face_w * 0.04, box[3] - face_h * 0.3],
        180,
        360,
        fill=identity.hair,
    )
    eye_dx, eye_y, eye_r = face_w * identity.eye_spacing / 2, hy - face_h * 0.02, face_h * 0.06
    for ex in (hx - eye_dx, hx + eye_dx):
        draw.ellipse([ex - eye_r, eye_y - eye_r, ex + eye_r, eye_y + eye_r], fill=(25, 25, 35))
    shade = tuple(int(c * 0.72) for c in identity.skin)
    draw.line(
        [(hx, eye_y + eye_r), (hx, eye_y + eye_r + face_h * identity.nose_length)], fill=shade, width=max(int(face_w * 0.07), 1)
    )
    mouth_y = hy + face_h * 0.3
    draw.line(
        [(hx - face_w * 0.15, mouth_y), (hx + face_w * 0.15, mouth_y)], fill=(150, 50, 60), width=max(int(face_h * 0.04), 1)
    )
    return box


def render_flat_lay(garment: Garment, size: int) -> Image.Image:
    """The catalog image: the garment laid flat, front view, on a light background."""
    image = Image.new("RGB", (size, size), (235, 235, 230))
    source_w, source_h = _texture_size(garment)
    tex_w = int(size * 0.5)
    tex_h = min(int(tex_w * source_h / source_w), int(size * 0.85))
    texture, _ = garment_texture(garment, source_w, source_h)
    x0, y0 = (size - tex_w) // 2, (size - tex_h) // 2
    draw = ImageDraw.Draw(image)
    if garment.category != "dress":
        sleeve_len = size * (0.38 if garment.category == "long_sleeve" else 0.14)
        for sign, sx in ((-1, x0), (1, x0 + tex_w)):
            draw.line(
                [(sx, y0 + size * 0.05), (sx + sign * sleeve_len * 0.7, y0 + size * 0.05 + sleeve_len)],
                fill=garment.colour,
                width=int(size * 0.11),
            )
    image.paste(texture.resize((tex_w, tex_h), Image.Resampling.LANCZOS), (x0, y0))
    return image


def _pose_map(points: dict, size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for index, (a, b) in enumerate(LIMBS):
        hue = (index * 255) // len(LIMBS)
        draw.line([points[a], points[b]], fill=(hue, 255 - hue, (hue * 3) % 256), width=max(size // 40, 2))
    return image


def _downsample(image: Image.Image, resolution: int) -> Image.Image:
    return image.resize((resolution, resolution), Image.Resampling.LANCZOS if image.mode == "RGB" else Image.Resampling.BOX)


def make_sample(
    seed: int, key: str, identity: Identity, garment: Garment, arm_pose: str, photo_seed: int, resolution: int
) -> Sample:
    """One try-on training sample at `resolution` (square)."""
    size = resolution * SUPERSAMPLE
    rng = _rng(seed, 3, photo_seed)
    points = make_pose(rng, arm_pose, size)
    photo, labels, face_box, logo_box = render_person(identity, garment, points, rng, size)
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
        "identity": asdict(identity),
        "garment": asdict(garment),
        "resolution": resolution,
        "face_box": [round(v * scale, 2) for v in face_box],
        "logo_box": [round(v * scale, 2) for v in logo_box],
        "keypoints": {name: [round(x * scale, 2), round(y * scale, 2)] for name, (x, y) in points.items()},
    }
    target, mask = _downsample(photo, resolution), _binarise(masked, resolution)
    agnostic = Image.composite(Image.new("RGB", target.size, (128, 128, 128)), target, mask)
    return Sample(
        key,
        target,
        agnostic,
        mask,
        _downsample(_pose_map(points, size), resolution),
        _downsample(render_flat_lay(garment, size), resolution),
        _binarise(garment_mask, resolution),
        meta,
    )


def _binarise(mask: Image.Image, resolution: int) -> Image.Image:
    return _downsample(mask, resolution).point(lambda v: 255 if v >= 128 else 0)


def generate_split(*, seed: int, split: str, num_samples: int, num_identities: int, num_garments: int, resolution: int):
    """Yield `num_samples` samples for a stage (or 'control'), biased by STAGE_BIAS[split]."""
    bias = STAGE_BIAS[split]
    split_index = list(STAGE_BIAS).index(split)
    rng = _rng(seed, 4, split_index)
    garments = [make_garment(seed, g) for g in range(num_garments)]
    eligible = [g for g in garments if g.pattern in bias["patterns"]] or garments
    for index in range(num_samples):
        identity = make_identity(seed, int(rng.integers(num_identities)))
        garment = eligible[int(rng.integers(len(eligible)))]
        arm_pose = _pick(rng, bias["poses"])
        yield make_sample(seed, f"{split}-{index:05d}", identity, garment, arm_pose, split_index * 1_000_003 + index, resolution)

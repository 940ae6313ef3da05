"""Drawing the synthetic data (`drape.data.synth`): posed people wearing garments, flat-lays, logos, pose maps.

Everything is drawn at `SUPERSAMPLE`× the output resolution and downsampled. `render_person` also
paints a label map (`BACKGROUND` … `LEGS`) from which the masks and boxes a sample carries are cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from drape.data.portraits import compose_face

if TYPE_CHECKING:
    from drape.data.synth import Garment, Identity

SUPERSAMPLE = 4
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


@dataclass(frozen=True)
class Variation:
    """Drawing changes that are not attributes of a garment: what `drape.gates.suites.regressions` makes a
    model get subtly wrong. The default draws the garment as it is."""

    logo_angle: float = 0.0  # degrees the mark is turned on its plate
    logo_erased: float = 0.0  # share of the mark's width lost on its right side
    pattern_scale: float = 1.0  # the pattern's period, relative
    length: float = 1.0  # the torso part's length from the shoulders, relative (a shorter hem < 1)
    fit: float = 1.0  # the torso's width about its centre line, relative (looser > 1)
    pocket: bool = False  # a patch pocket added low on the left


PLAIN = Variation()
# the logo plate as shares of the torso texture's width and height: a letter mark, and a price tag
# ('$…', data.synthetic.marks 'prices'), wider so three glyphs stand about as tall as one letter
LETTER_PLATE, PRICE_PLATE = (0.56, 0.36), (0.84, 0.34)
# a price's strokes are the plate's height over this: thin, so '$', 6, 8 and 9 keep their counters. At
# 20 the rehearsal-gate's control set (256x192) had 5 of 6 tags legible and harmless kinds misread 2
# of them, as often as a melted logo; at 30, 6 of 6 and none (benchmarks/price_tags.py)
PRICE_STROKE = 30


def pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def garment_texture(
    garment: Garment, width: int, height: int, variation: Variation = PLAIN
) -> tuple[Image.Image, tuple[int, int, int, int]]:
    """The torso texture (pattern + logo) and the logo box in texture pixels."""
    image = Image.new("RGB", (width, height), garment.colour)
    draw = ImageDraw.Draw(image)
    step = max(int(width // 6 * variation.pattern_scale), 4)
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
    if variation.pocket:
        pocket = [width * 0.14, height * 0.62, width * 0.36, height * 0.84]
        draw.rectangle(pocket, fill=garment.accent, outline=garment.logo_colour, width=max(width // 40, 1))
    box = _draw_logo(image, garment, width, height, variation)
    return image, box


def _fitted_font(draw: ImageDraw.ImageDraw, text: str, plate_w: int, plate_h: int, *, fit: bool):
    """The default font at 90% of the plate's height; with `fit` (a price tag), smaller where the
    text would not fit 92% of the plate's width (letter marks are drawn as they always were)."""
    size = max(int(plate_h * 0.9), 6)
    font = ImageFont.load_default(size=size)
    left, _, right, _ = draw.textbbox((0, 0), text, font=font)
    if fit and right - left > plate_w * 0.92:
        font = ImageFont.load_default(size=max(int(size * plate_w * 0.92 / (right - left)), 6))
    return font


def _draw_logo(
    image: Image.Image, garment: Garment, width: int, height: int, variation: Variation = PLAIN
) -> tuple[int, int, int, int]:
    """Draw the logo on a plate in the chest area; returns its box (x0, y0, x1, y1). A turned or
    partly lost mark (`variation`) is drawn on the plate alone, then pasted: it stays on the plate."""
    price = garment.logo.startswith("$")
    share_w, share_h = PRICE_PLATE if price else LETTER_PLATE
    plate_w, plate_h = int(width * share_w), int(height * share_h)
    stroke = max(round(plate_h / PRICE_STROKE), 1) if price else max(plate_h // 14, 1)
    x0, y0 = (width - plate_w) // 2, int(height * 0.14)
    plate = tuple(255 - c for c in garment.logo_colour) if garment.pattern != "solid" else garment.colour
    altered = variation.logo_angle != 0 or variation.logo_erased > 0
    canvas = Image.new("RGB", (plate_w + 1, plate_h + 1), plate) if altered else image
    ox, oy = (0, 0) if altered else (x0, y0)
    draw = ImageDraw.Draw(canvas)
    draw.rectangle([ox, oy, ox + plate_w, oy + plate_h], fill=plate)
    font = _fitted_font(draw, garment.logo, plate_w, plate_h, fit=price)
    left, top, right, bottom = draw.textbbox((0, 0), garment.logo, font=font)
    tx = ox + (plate_w - (right - left)) // 2 - left
    ty = oy + (plate_h - (bottom - top)) // 2 - top
    draw.text(
        (tx, ty),
        garment.logo,
        fill=garment.logo_colour,
        font=font,
        stroke_width=stroke,
        stroke_fill=garment.logo_colour,
    )
    if altered:
        if variation.logo_erased > 0:  # the right part of the mark lost
            erased_from = tx + left + (right - left) * (1 - variation.logo_erased)
            draw.rectangle([erased_from, 0, plate_w + 1, plate_h + 1], fill=plate)
        if variation.logo_angle:
            canvas = canvas.rotate(variation.logo_angle, resample=Image.Resampling.BICUBIC, fillcolor=plate)
        image.paste(canvas, (x0, y0))
    return x0, y0, x0 + plate_w, y0 + plate_h


def _perspective_coefficients(source: list[tuple[float, float]], target: list[tuple[float, float]]) -> list[float]:
    """PIL PERSPECTIVE data mapping output points `target` back to input points `source`."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(target, source):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs.extend([u, v])
    return np.linalg.solve(np.array(rows, float), np.array(rhs, float)).tolist()


def _forward_map(quad: list[tuple[float, float]], width: float, height: float, point: tuple[float, float]) -> tuple[float, float]:
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


def _torso_quad(points: dict, category: str, size: float, variation: Variation = PLAIN) -> list[tuple[float, float]]:
    (slx, sly), (srx, sry) = points["shoulder_l"], points["shoulder_r"]
    (hlx, hly), (hrx, hry) = points["hip_l"], points["hip_r"]
    if category == "dress":
        flare, hem = size * 0.06, size * 0.18
        quad = [(slx, sly), (srx, sry), (hrx + flare, hry + hem), (hlx - flare, hly + hem)]
    else:
        quad = [(slx, sly), (srx, sry), (hrx, hry), (hlx, hly)]
    if variation.length != 1.0:  # the hem moves along the sides, from the shoulders
        (ax, ay), (bx, by), (cx, cy), (dx, dy) = quad
        f = variation.length
        quad = [(ax, ay), (bx, by), (bx + (cx - bx) * f, by + (cy - by) * f), (ax + (dx - ax) * f, ay + (dy - ay) * f)]
    if variation.fit != 1.0:  # wider or narrower about the centre line, row by row
        top, bottom = (quad[0][0] + quad[1][0]) / 2, (quad[3][0] + quad[2][0]) / 2  # the centre line's ends
        quad = [
            (top + (quad[0][0] - top) * variation.fit, quad[0][1]),
            (top + (quad[1][0] - top) * variation.fit, quad[1][1]),
            (bottom + (quad[2][0] - bottom) * variation.fit, quad[2][1]),
            (bottom + (quad[3][0] - bottom) * variation.fit, quad[3][1]),
        ]
    return quad


def _draw_both(photo: ImageDraw.ImageDraw, labels: ImageDraw.ImageDraw, label: int, method: str, *args, **kwargs):
    getattr(photo, method)(*args, **kwargs)
    kwargs = {k: (label if k == "fill" else v) for k, v in kwargs.items() if k != "outline"}
    getattr(labels, method)(*args, **kwargs)


def render_person(
    identity: Identity, garment: Garment, points: dict, rng: np.random.Generator, size: int, variation: Variation = PLAIN
) -> tuple[Image.Image, Image.Image, tuple, tuple]:
    """Draw the person wearing the garment: (photo, part labels, face box, logo box) in canvas px."""
    top, bottom = pick(rng, GARMENT_COLOURS), pick(rng, SKIN_TONES)
    photo = Image.new("RGB", (size, size), tuple(int(0.6 * t + 0.4 * b) for t, b in zip(top, bottom)))
    labels = Image.new("L", (size, size), BACKGROUND)
    draw, lab = ImageDraw.Draw(photo), ImageDraw.Draw(labels)
    draw.rectangle([0, int(size * rng.uniform(0.75, 0.9)), size, size], fill=tuple(int(c * 0.7) for c in top))
    limb = max(int(size * 0.05), 2)
    (hlx, hly), (hrx, hry) = points["hip_l"], points["hip_r"]
    for hx, hy in ((hlx, hly), (hrx, hry)):  # legs
        _draw_both(draw, lab, LEGS, "line", [(hx, hy), (hx, size)], fill=(40, 40, 70), width=limb * 2)
    quad = _torso_quad(points, garment.category, size, variation)
    tex_w, tex_h = _texture_size(garment)
    texture, logo_box = garment_texture(garment, tex_w, tex_h, variation)
    shown = tex_h * min(variation.length, 1.0)  # a shorter garment shows the top of its texture, unsquashed
    coeffs = _perspective_coefficients([(0, 0), (tex_w, 0), (tex_w, shown), (0, shown)], quad)
    warped = texture.transform((size, size), Image.Transform.PERSPECTIVE, coeffs, Image.Resampling.BILINEAR)
    quad_mask = Image.new("L", (size, size), 0)
    ImageDraw.Draw(quad_mask).polygon(quad, fill=255)
    photo.paste(warped, (0, 0), quad_mask)
    lab.polygon(quad, fill=GARMENT)
    corners = [
        _forward_map(quad, tex_w, shown, p)
        for p in ((logo_box[0], logo_box[1]), (logo_box[2], logo_box[1]), (logo_box[2], logo_box[3]), (logo_box[0], logo_box[3]))
    ]
    logo_bbox = (min(x for x, _ in corners), min(y for _, y in corners), max(x for x, _ in corners), max(y for _, y in corners))
    _draw_arms(draw, lab, identity, garment, points, limb)
    face_box = _draw_head(draw, lab, identity, points, size)
    if identity.portrait:  # a real face over the drawn one (drape.data.portraits): what a face recognizer can see
        face_box = compose_face(photo, labels, identity.portrait, points["head"], size * 0.2, FACE)
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


def pose_map(points: dict, size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for index, (a, b) in enumerate(LIMBS):
        hue = (index * 255) // len(LIMBS)
        draw.line([points[a], points[b]], fill=(hue, 255 - hue, (hue * 3) % 256), width=max(size // 40, 2))
    return image


def downsample(image: Image.Image, resolution: int) -> Image.Image:
    return image.resize((resolution, resolution), Image.Resampling.LANCZOS if image.mode == "RGB" else Image.Resampling.BOX)

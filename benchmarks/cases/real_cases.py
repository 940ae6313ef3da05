"""Real-image cases for the recognizers: faces and text from photographs that ship in installed
packages, so the identity and text checks are measured on real faces and real text, not only on
the synthetic generator's (which no face detector or OCR model reads).

- Faces: scikit-image's astronaut (Eileen Collins) and matplotlib's Grace Hopper portrait, each
  framed around the face at a random scale and place and resized to the gate's resolution (a
  shopper photo's head and shoulders); `swap_face` pastes the other person's face into the box (a
  try-on that drifted to another identity), `erase_face` covers the face with a real texture,
  `drift_face` resizes a band of the face (eyes set closer, a squashed jaw: the same person drifted).
- Text: a word rendered in a plate on a real texture (brick, grass, gravel: skimage's), as a
  garment's printed logo or price tag.

Both packages ship these pictures in their wheels; nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from drape.data.portraits import FACE_BOXES, portrait  # noqa: F401  (re-exported: the packaged portraits, read once)


def texture(name: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """A `size`² RGB crop of one of skimage's texture photographs ('brick', 'grass', 'gravel', 'coffee')."""
    from skimage import data

    picture = np.asarray(getattr(data, name)())
    picture = np.stack([picture] * 3, axis=-1) if picture.ndim == 2 else picture[..., :3]
    side = min(picture.shape[:2])
    crop = int(rng.integers(side // 2, side + 1))
    y, x = (int(rng.integers(0, picture.shape[i] - crop + 1)) for i in (0, 1))
    return np.asarray(
        Image.fromarray(np.ascontiguousarray(picture[y : y + crop, x : x + crop])).resize((size, size), Image.Resampling.BICUBIC)
    )


@dataclass(frozen=True)
class FaceScene:
    image: np.ndarray  # RGB uint8, size × size
    box: tuple[float, float, float, float]  # the face box, in the scene's pixels
    person: str


def face_scene(person: str, size: int, rng: np.random.Generator) -> FaceScene:
    """`person`'s portrait framed so the face is 28-40% of the width at a random place, at `size` px."""
    picture, (x0, y0, x1, y1) = portrait(person), FACE_BOXES[person]
    face = x1 - x0
    side = min(face / rng.uniform(0.28, 0.40), *picture.shape[:2])
    left = np.clip((x0 + x1) / 2 - side * rng.uniform(0.35, 0.65), 0, picture.shape[1] - side)
    top = np.clip((y0 + y1) / 2 - side * rng.uniform(0.35, 0.6), 0, picture.shape[0] - side)
    frame = Image.fromarray(picture).crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.BICUBIC)
    scale = size / side
    box = ((x0 - left) * scale, (y0 - top) * scale, (x1 - left) * scale, (y1 - top) * scale)
    return FaceScene(np.asarray(frame), tuple(round(float(v), 2) for v in box), person)  # type: ignore[arg-type]


def _feathered(size: tuple[int, int]) -> Image.Image:
    mask = Image.new("L", size, 0)
    ImageDraw.Draw(mask).ellipse((size[0] * 0.06, size[1] * 0.04, size[0] * 0.94, size[1] * 0.98), fill=255)
    return mask.filter(ImageFilter.GaussianBlur(max(size) / 16))


def swap_face(scene: FaceScene, other: str) -> np.ndarray:
    """The scene with `other`'s face (its portrait's face box) blended into the scene's face box."""
    x0, y0, x1, y1 = (int(round(v)) for v in scene.box)
    source = Image.fromarray(portrait(other)).crop(FACE_BOXES[other]).resize((x1 - x0, y1 - y0), Image.Resampling.BICUBIC)
    image = Image.fromarray(scene.image.copy())
    image.paste(source, (x0, y0), _feathered(source.size))
    return np.asarray(image)


def drift_face(scene: FaceScene, top: float, bottom: float, factor: float, axis: int) -> np.ndarray:
    """The scene with the band of the face box from `top` to `bottom` (shares of its height) resized by
    `factor` along `axis` (1: across, 0: down) about its centre: a drift of the same face."""
    image = scene.image
    x0, y0, x1, y1 = (int(round(v)) for v in scene.box)
    h = y1 - y0
    b0, b1 = y0 + int(top * h), y0 + int(bottom * h)
    band = Image.fromarray(image[b0:b1, x0:x1])
    size = (max(1, round(band.width * factor)), band.height) if axis == 1 else (band.width, max(1, round(band.height * factor)))
    scaled = np.asarray(band.resize(size, Image.Resampling.BICUBIC))
    out, (bh, bw) = image.copy(), (b1 - b0, x1 - x0)
    canvas = np.asarray(band.resize((bw, bh), Image.Resampling.BICUBIC)).copy()
    sy, sx = max(0, (scaled.shape[0] - bh) // 2), max(0, (scaled.shape[1] - bw) // 2)
    dy, dx = max(0, (bh - scaled.shape[0]) // 2), max(0, (bw - scaled.shape[1]) // 2)
    piece = scaled[sy : sy + bh, sx : sx + bw]
    canvas[dy : dy + piece.shape[0], dx : dx + piece.shape[1]] = piece
    out[b0:b1, x0:x1] = canvas
    return out


def erase_face(scene: FaceScene, rng: np.random.Generator, name: str = "brick") -> np.ndarray:
    """The scene with its face box (grown by a tenth) covered by a real texture: no face left."""
    x0, y0, x1, y1 = scene.box
    grow = 0.1 * (x1 - x0)
    left, top = max(int(x0 - grow), 0), max(int(y0 - grow), 0)
    right, bottom = min(int(np.ceil(x1 + grow)), scene.image.shape[1]), min(int(np.ceil(y1 + grow)), scene.image.shape[0])
    patch = texture(name, max(right - left, bottom - top), rng)[: bottom - top, : right - left]
    image = scene.image.copy()
    image[top:bottom, left:right] = patch
    return image


@dataclass(frozen=True)
class TextScene:
    image: np.ndarray  # RGB uint8, size × size
    box: tuple[float, float, float, float]  # the printed word's plate
    word: str


def text_scene(word: str, size: int, rng: np.random.Generator, *, ground: str = "brick") -> TextScene:
    """`word` printed dark on a light plate, a third of the picture wide, on a real texture."""
    image = Image.fromarray(texture(ground, size, rng))
    font = ImageFont.load_default(max(8, round(size * rng.uniform(0.07, 0.09))))
    left, top, right, bottom = (int(v) for v in font.getbbox(word))
    pad = max(2, round(size * 0.02))
    width, height = right - left + 2 * pad, bottom - top + 2 * pad
    if width + 2 * pad >= size or height + 2 * pad >= size:
        raise ValueError(f"text_scene: {word!r} does not fit a {size} px picture")
    x, y = int(rng.integers(pad, size - width - pad)), int(rng.integers(pad, size - height - pad))
    draw = ImageDraw.Draw(image)
    plate = tuple(int(v) for v in rng.integers(215, 250, size=3))
    ink = tuple(int(v) for v in rng.integers(0, 60, size=3))
    draw.rectangle((x, y, x + width, y + height), fill=plate)
    draw.text((x + pad - left, y + pad - top), word, font=font, fill=ink)
    return TextScene(np.asarray(image), (float(x), float(y), float(x + width), float(y + height)), word)


WORDS = ("SALE", "NIKE", "$49.99", "TOKYO", "OPEN", "RUN 42", "LIMITED", "ZARA")


def print_word(image: np.ndarray, word: str, box: tuple[float, float, float, float], ink: tuple[int, ...]) -> np.ndarray:
    """`image` with `word` printed in `box` (x0, y0, x1, y1) on a light plate, the font as large as fits."""
    picture = Image.fromarray(image.copy())
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    draw = ImageDraw.Draw(picture)
    draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=(236, 232, 224))
    pad = max(1, round((y1 - y0) * 0.15))
    font_size = y1 - y0 - 2 * pad
    while font_size > 6:
        font = ImageFont.load_default(font_size)
        left, top, right, bottom = (int(v) for v in font.getbbox(word))
        if right - left <= x1 - x0 - 2 * pad and bottom - top <= y1 - y0 - 2 * pad:
            break
        font_size -= 1
    draw.text((x0 + pad - left, y0 + pad - top), word, font=font, fill=ink)
    return np.asarray(picture)


def real_control(size: int, count: int, seed: int = 0) -> dict:
    """A control set of `count` real samples at `size` px, in the gate's shape (keys, target, mask,
    meta with face_box and logo_box): the two portraits in turn, framed at random, each with a word of
    `WORDS` printed on the chest (the logo box; `meta['word']`) and the area below the face as the
    garment mask."""
    rng = np.random.default_rng(seed)
    keys, targets, masks, meta = [], [], [], []
    for index in range(count):
        scene = face_scene(("astronaut", "hopper")[index % 2], size, rng)
        x0, y0, x1, y1 = scene.box
        word = WORDS[int(rng.integers(len(WORDS)))]
        width, height = min(size * 0.42, size - 4.0), max(size * 0.1, 12.0)
        left = float(np.clip((x0 + x1) / 2 - width / 2 + rng.uniform(-0.1, 0.1) * size, 2, size - width - 2))
        top = float(np.clip(y1 + (y1 - y0) * 0.35, 2, size - height - 2))
        logo = (round(left, 2), round(top, 2), round(left + width, 2), round(top + height, 2))
        ink = tuple(int(v) for v in rng.integers(0, 70, size=3))
        mask = np.zeros((size, size), np.uint8)
        mask[int(min(y1 + (y1 - y0) * 0.2, size - 2)) :, :] = 255
        keys.append(f"real-{index:04d}")
        targets.append(print_word(scene.image, word, logo, ink))
        masks.append(mask)
        meta.append({"face_box": list(scene.box), "logo_box": list(logo), "word": word, "person": scene.person, "ink": ink})
    return {"keys": keys, "target": np.stack(targets), "mask": np.stack(masks), "meta": meta}

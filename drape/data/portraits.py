"""Real faces for synthetic scenes: portraits that installed packages ship (scikit-image's astronaut,
Eileen Collins; matplotlib's Grace Hopper), composed into the generator's drawn heads when
`data.synthetic.faces` is 'portraits', so a real recognizer (dlib, an ArcFace-family model) sees a
face in every control target at every supported resolution; the drawn cartoon faces it mostly does
not (dlib finds 4 of 16 drawn faces at 64 and 128 px, 2 at 256: benchmarks/control_faces.py).

Both pictures come from the wheels' own data folders: nothing is downloaded. Two people only: a
portrait identity is one of them (`PORTRAITS[identity_id % 2]`); the generator's other attributes
(pose, garment, background) still vary per sample.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

PORTRAITS = ("astronaut", "hopper")
# each portrait's face box in the full picture (dlib's HOG detection of it)
FACE_BOXES = {"astronaut": (175.0, 76.0, 265.0, 166.0), "hopper": (161.0, 137.0, 376.0, 352.0)}
# the face is taken with this share of its box around it (forehead, chin, cheeks), feathered
GROW = 0.15


@cache
def portrait(name: str) -> np.ndarray:
    """The full portrait, RGB uint8: 'astronaut' (skimage) or 'hopper' (matplotlib); read once."""
    if name == "astronaut":
        from skimage import data

        picture = np.ascontiguousarray(data.astronaut())
    elif name == "hopper":
        from matplotlib import cbook

        with Image.open(str(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))) as image:
            picture = np.asarray(image.convert("RGB"))
    else:
        raise ValueError(f"portrait {name!r}: expected one of {', '.join(PORTRAITS)}")
    picture.flags.writeable = False
    return picture


def portrait_face(name: str, side: int) -> tuple[Image.Image, Image.Image]:
    """(the face of portrait `name` with `GROW` of its box around it, resized to `side`², its feathered
    elliptical mask): what `compose_face` pastes."""
    x0, y0, x1, y1 = FACE_BOXES[name]
    grow = GROW * (x1 - x0)
    face = Image.fromarray(portrait(name)).crop((x0 - grow, y0 - grow, x1 + grow, y1 + grow))
    face = face.resize((side, side), Image.Resampling.LANCZOS)
    mask = Image.new("L", (side, side), 0)
    ImageDraw.Draw(mask).ellipse((side * 0.1, side * 0.05, side * 0.9, side * 1.0), fill=255)
    return face, mask.filter(ImageFilter.GaussianBlur(side / 20))


def compose_face(
    photo: Image.Image, labels: Image.Image, name: str, centre: tuple[float, float], height: float, label: int
) -> tuple:
    """Paste portrait `name`'s face into `photo` centred at `centre`, the face box `height` px square;
    its ellipse labelled `label` in `labels`. Returns the face box (x0, y0, x1, y1) in `photo`'s px."""
    side = max(round(height * (1 + 2 * GROW)), 4)
    left, top = round(centre[0] - side / 2), round(centre[1] - side / 2)
    face, mask = portrait_face(name, side)
    photo.paste(face, (left, top), mask)
    labels.paste(label, (left, top, left + side, top + side), mask.point(lambda v: 255 if v >= 128 else 0))
    inner = side / (1 + 2 * GROW)
    return (left + side / 2 - inner / 2, top + side / 2 - inner / 2, left + side / 2 + inner / 2, top + side / 2 + inner / 2)

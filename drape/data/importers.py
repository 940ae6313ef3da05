"""Public try-on dataset layouts → drape samples (the fields and meta the synthetic generator gives).

VITON-HD::

    <root>/{train,test}_pairs.txt                 "<person>.jpg <cloth>.jpg" per line
    <root>/{train,test}/image/<person>.jpg        the shopper photo (768×1024)
    <root>/{train,test}/cloth/<cloth>.jpg         catalog garment; cloth-mask/<cloth>.jpg its mask
    <root>/{train,test}/image-parse-v3/<person>.png   human parsing (LIP labels)
    <root>/{train,test}/openpose_json/<person>_keypoints.json   OpenPose BODY_25
    <root>/{train,test}/agnostic-v3.2/<person>.jpg    clothing-agnostic photo (optional here)
    <root>/{train,test}/agnostic-mask/<person>_mask.png   the agnostic mask it ships (optional: used as the mask)
    <root>/{train,test}/openpose_img/<person>_rendered.png  rendered skeleton (optional: used as the pose map)
    <root>/{train,test}/image-densepose/<person>.jpg  DensePose (optional: carried as the densepose field)

DressCode::

    <root>/{upper_body,lower_body,dresses}/{train_pairs,test_pairs_paired,test_pairs_unpaired}.txt
                                                  "<id>_0.jpg <id>_1.jpg" per line
    <root>/<category>/images/<id>_0.jpg (person), <id>_1.jpg (garment)
    <root>/<category>/keypoints/<id>_2.json       {"keypoints": [[x, y, score, index], ...]} (18 points)
    <root>/<category>/label_maps/<id>_4.png       parsing (DressCode labels)
    <root>/<category>/skeletons/<id>_5.jpg        rendered skeleton (optional: used as the pose map)
    <root>/<category>/dense/<id>_5.png            DensePose (optional: carried as the densepose field)

Conditioning the source ships is carried as optional shard fields (`CONDITION_FIELDS`): the label
map (``parse``), and ``densepose``, ``skeleton`` and ``agnostic_mask`` where present.

Which pairs form which split is `drape.data.sources` (the official splits); every file opened here
must resolve inside the source root (`contained_file`).

Images keep their aspect: each is padded (white, centred) to the dataset resolution's aspect and
resized to it, so VITON-HD's and DressCode's 768×1024 photos go to `data.resolution: [1024, 768]`
by scale alone, and to a square with bands at the sides. The inpainting
mask is the garment and arm (or leg) region, dilated, minus the face; the face box (identity
gate) comes from the parsing; these sources carry no logo annotation, so the brand-critical box
(texture gate) is the chest of the worn garment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from drape.config.data import height_width, json_resolution
from drape.data.sources import (  # noqa: F401 - SourceError, detect_layout, list_pairs re-exported
    DRESSCODE_CATEGORIES,
    LAYOUTS,
    TEST_UNPAIRED,
    SourceError,
    contained_file,
    detect_layout,
    list_pairs,
)
from drape.data.synth import Sample

# label ids of the parsers each dataset ships
VITON_LABELS = {"face": (4, 13), "hair": (1, 2), "garment": (5, 6, 7), "limbs": (14, 15)}
DRESSCODE_LABELS: dict[str, Any] = {  # label ids per part (per category for garment and limbs)
    "face": (11,),
    "hair": (2,),
    "garment": {"upper_body": (4,), "lower_body": (5, 6), "dresses": (7,)},
    "limbs": {"upper_body": (14, 15), "lower_body": (12, 13), "dresses": (12, 13, 14, 15)},
}
# OpenPose 18-point skeleton (BODY_25 shares these indices for the points used here)
KEYPOINT_NAMES = ("nose", "neck", "r_shoulder", "r_elbow", "r_wrist", "l_shoulder", "l_elbow", "l_wrist")
LIMBS = ((1, 2), (2, 3), (3, 4), (1, 5), (5, 6), (6, 7), (1, 0))


def _open(path: Path, mode: str) -> Image.Image:
    if not path.is_file():
        raise SourceError(f"{path}: missing")
    try:
        with Image.open(path) as image:
            return image.convert(mode) if mode != "P" else image.copy()
    except Exception as error:  # noqa: BLE001 - any decoder failure names the file
        raise SourceError(f"{path}: not a readable image ({error})") from None


class _Letterbox:
    """Pads a w×h image, centred, to the aspect of `resolution` (a side, or (height, width)) and
    resizes it to that: nothing is cropped or stretched. Maps points too."""

    def __init__(self, size: tuple[int, int], resolution: int | tuple[int, int]):
        width, height = size
        self.height, self.width = height_width(resolution)
        scale = min(self.width / width, self.height / height)
        canvas = (max(width, round(self.width / scale)), max(height, round(self.height / scale)))
        self.canvas, self.dx, self.dy = canvas, (canvas[0] - width) // 2, (canvas[1] - height) // 2
        self.scale, self.resolution = self.width / canvas[0], resolution

    def image(self, image: Image.Image, fill, nearest: bool = False) -> Image.Image:
        canvas = Image.new(image.mode, self.canvas, fill)
        canvas.paste(image, (self.dx, self.dy))
        resample = Image.Resampling.NEAREST if nearest else Image.Resampling.LANCZOS
        return canvas.resize((self.width, self.height), resample)

    def point(self, x: float, y: float) -> list[float]:
        return [round((x + self.dx) * self.scale, 2), round((y + self.dy) * self.scale, 2)]


def _labels_in(labels: np.ndarray, ids) -> np.ndarray:
    return np.isin(labels, np.asarray(ids))


def _box(region: np.ndarray, fallback: list[float]) -> list[float]:
    ys, xs = np.nonzero(region)
    if len(xs) == 0:
        return fallback
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def _chest_box(garment: np.ndarray) -> list[float]:
    height, width = garment.shape
    x0, y0, x1, y1 = _box(garment, [width * 0.3, height * 0.4, width * 0.7, height * 0.7])
    width, height = x1 - x0, y1 - y0
    return [x0 + 0.25 * width, y0 + 0.15 * height, x1 - 0.25 * width, y0 + 0.5 * height]


def _pose_image(points: dict[int, list[float]], height: int, width: int) -> Image.Image:
    image = Image.new("RGB", (width, height), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for index, (a, b) in enumerate(LIMBS):
        if a in points and b in points:
            hue = (index * 255) // len(LIMBS)
            draw.line(
                [tuple(points[a]), tuple(points[b])],
                fill=(hue, 255 - hue, (hue * 3) % 256),
                width=max(max(height, width) // 40, 2),
            )
    return image


def _mask(labels: np.ndarray, garment_ids, limb_ids, face_ids) -> np.ndarray:
    image = Image.fromarray((_labels_in(labels, (*garment_ids, *limb_ids)) * 255).astype(np.uint8))
    region = np.asarray(image.filter(ImageFilter.MaxFilter(2 * max(max(labels.shape) // 32, 1) + 1))) > 0
    return region & ~_labels_in(labels, face_ids)


def _sample(key: str, letterbox: _Letterbox, files: dict, keypoints: dict, ids: dict, meta: dict) -> Sample:
    """The drape sample of one pair's opened `files` (person, labels, cloth[, cloth_mask, agnostic,
    shipped_mask, shipped_pose]), letterboxed to the dataset resolution."""
    resolution, height, width = letterbox.resolution, letterbox.height, letterbox.width
    target = letterbox.image(files["person"], (255, 255, 255))
    labels = np.asarray(letterbox.image(files["labels"], 0, nearest=True))
    if files.get("shipped_mask") is not None:  # the dataset's own agnostic mask, as it ships it
        mask = np.asarray(letterbox.image(files["shipped_mask"], 0, nearest=True)) >= 128
    else:
        mask = _mask(labels, ids["garment"], ids["limbs"], ids["face"] + ids["hair"])
    mask_image = Image.fromarray((mask * 255).astype(np.uint8))
    grey = Image.new("RGB", target.size, (128, 128, 128))
    agnostic = files.get("agnostic")
    agnostic_image = (
        letterbox.image(agnostic, (255, 255, 255)) if agnostic is not None else Image.composite(grey, target, mask_image)
    )
    garment_square = _Letterbox(files["cloth"].size, resolution)
    flat = garment_square.image(files["cloth"], (255, 255, 255))
    if files.get("cloth_mask") is not None:  # clean catalog background
        cutout = garment_square.image(files["cloth_mask"], 0).point(lambda v: 255 if v >= 128 else 0)
        flat = Image.composite(flat, Image.new("RGB", flat.size, (255, 255, 255)), cutout)
    worn = _labels_in(labels, ids["garment"])
    points = {index: letterbox.point(x, y) for index, (x, y) in keypoints.items()}
    shipped_pose = files.get("shipped_pose")
    pose = letterbox.image(shipped_pose, (0, 0, 0)) if shipped_pose is not None else _pose_image(points, height, width)
    meta = {
        **meta,
        "key": key,
        "resolution": json_resolution(resolution),
        "face_box": _box(_labels_in(labels, ids["face"]), [width * 0.4, 0.0, width * 0.6, height * 0.2]),
        "logo_box": _chest_box(worn),
        "logo_box_source": "chest of the worn garment (no logo annotation)",
        "keypoints": {KEYPOINT_NAMES[i] if i < len(KEYPOINT_NAMES) else str(i): p for i, p in points.items()},
        "conditioning": sorted(
            name for name in ("agnostic", "shipped_mask", "shipped_pose", "densepose") if files.get(name) is not None
        ),
    }
    worn_image = Image.fromarray((worn * 255).astype(np.uint8))
    return Sample(key, target, agnostic_image, mask_image, pose, flat, worn_image, meta, _conditions(letterbox, files, labels))


def _conditions(letterbox: _Letterbox, files: dict, labels: np.ndarray) -> dict[str, Image.Image]:
    """The conditioning the dataset ships, letterboxed like the photo: its label map (labels as grey
    levels), and DensePose, rendered skeleton and agnostic mask where present."""
    carried = {"parse": Image.fromarray(labels.astype(np.uint8), mode="L")}
    for name, source, fill in (("densepose", "densepose", (0, 0, 0)), ("skeleton", "shipped_pose", (0, 0, 0))):
        if files.get(source) is not None:
            carried[name] = letterbox.image(files[source], fill, nearest=name == "densepose")
    if files.get("shipped_mask") is not None:
        carried["agnostic_mask"] = letterbox.image(files["shipped_mask"], 0, nearest=True)
    return carried


def _openpose(path: Path) -> dict[int, tuple[float, float]]:
    if not path.is_file():
        raise SourceError(f"{path}: missing (OpenPose keypoints)")
    try:
        data = json.loads(path.read_text())
        flat = data["people"][0]["pose_keypoints_2d"] if "people" in data else [v for p in data["keypoints"] for v in p[:3]]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise SourceError(f"{path}: not OpenPose keypoints ({type(error).__name__}: {error})") from None
    return {i: (float(flat[3 * i]), float(flat[3 * i + 1])) for i in range(len(flat) // 3) if float(flat[3 * i + 2]) > 0}


def _optional(root: Path, relative: str, mode: str) -> Image.Image | None:
    path = contained_file(root, relative)
    return _open(path, mode) if path.is_file() else None


def _viton_files(root: Path, pair: dict, stem: str) -> tuple[dict, Path]:
    base = pair["folder"]
    files = {
        "person": _open(contained_file(root, f"{base}/image/{pair['person']}"), "RGB"),
        "labels": _open(contained_file(root, f"{base}/image-parse-v3/{stem}.png"), "P"),
        "cloth": _open(contained_file(root, f"{base}/cloth/{pair['cloth']}"), "RGB"),
        "cloth_mask": _optional(root, f"{base}/cloth-mask/{pair['cloth']}", "L"),
        "agnostic": _optional(root, f"{base}/agnostic-v3.2/{pair['person']}", "RGB"),
        "shipped_mask": _optional(root, f"{base}/agnostic-mask/{stem}_mask.png", "L"),
        "shipped_pose": _optional(root, f"{base}/openpose_img/{stem}_rendered.png", "RGB"),
        "densepose": _optional(root, f"{base}/image-densepose/{pair['person']}", "RGB"),
    }
    return files, contained_file(root, f"{base}/openpose_json/{stem}_keypoints.json")


def _dresscode_files(root: Path, pair: dict, stem: str) -> tuple[dict, Path]:
    base, ident = pair["category"], stem.rsplit("_", 1)[0]
    files = {
        "person": _open(contained_file(root, f"{base}/images/{pair['person']}"), "RGB"),
        "labels": _open(contained_file(root, f"{base}/label_maps/{ident}_4.png"), "P"),
        "cloth": _open(contained_file(root, f"{base}/images/{pair['cloth']}"), "RGB"),
        "shipped_pose": _optional(root, f"{base}/skeletons/{ident}_5.jpg", "RGB"),
        "densepose": _optional(root, f"{base}/dense/{ident}_5.png", "RGB"),
    }
    return files, contained_file(root, f"{base}/keypoints/{ident}_2.json")


def _ids(layout: str, category: str | None) -> dict:
    if layout == "viton-hd":
        return {k: tuple(v) for k, v in VITON_LABELS.items()}
    assert category is not None, "a DressCode pair names its category"
    return {
        "face": DRESSCODE_LABELS["face"],
        "hair": DRESSCODE_LABELS["hair"],
        "garment": DRESSCODE_LABELS["garment"][category],
        "limbs": DRESSCODE_LABELS["limbs"][category],
    }


def load_pair(root: str | Path, layout: str, pair: dict, resolution: int | tuple[int, int]) -> Sample:
    """One pair from `drape.data.sources.list_pairs` as a Sample at `resolution`; every file it opens
    must resolve inside `root`."""
    root = Path(root)
    person_stem, cloth_stem = Path(pair["person"]).stem, Path(pair["cloth"]).stem
    reader = _viton_files if layout == "viton-hd" else _dresscode_files
    files, keypoints_path = reader(root, pair, person_stem)
    person, labels = files["person"], files["labels"]
    key_scale = 1.0
    if layout == "dresscode" and labels.size != person.size:
        key_scale = person.width / labels.width  # DressCode's keypoints and label maps share one (smaller) grid
        labels = labels.resize(person.size, Image.Resampling.NEAREST)
    if labels.size != person.size:
        raise SourceError(
            f"{pair['person']}: parsing is {labels.size[0]}×{labels.size[1]}, the photo "
            f"{person.size[0]}×{person.size[1]}; expected the same size"
        )
    files["labels"] = Image.fromarray(np.asarray(labels).astype(np.uint8), mode="L")
    keypoints = {i: (x * key_scale, y * key_scale) for i, (x, y) in _openpose(keypoints_path).items()}
    source = "viton-hd" if layout == "viton-hd" else "dresscode"
    meta = {"source": source, "split": pair["split"], "paired": pair["split"] != TEST_UNPAIRED}
    meta |= {"category": pair["category"]} if "category" in pair else {}
    meta |= {"identity_id": f"{source}-{person_stem}", "garment_id": f"{source}-{cloth_stem}"}
    return _sample(pair["key"], _Letterbox(person.size, resolution), files, keypoints, _ids(layout, pair.get("category")), meta)

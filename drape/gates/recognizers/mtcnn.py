"""MTCNN face detection and five landmarks (Zhang et al. 2016), for the ArcFace template alignment.

Three cascaded networks: P-Net proposes faces over an image pyramid (a 12×12 window, stride 2),
R-Net refines the proposals on 24×24 crops, O-Net on 48×48 crops gives the final box and the five
landmarks ArcFace's template is defined on (eye centres, nose tip, mouth corners). Each stage
keeps boxes over its probability threshold, regresses them, and suppresses overlaps (NMS).

The weights are the ones facenet-pytorch ships (`facenet_pytorch/data/{pnet,rnet,onet}.pt`, state
dicts of the original Caffe models), read with `torch.load(weights_only=True)` (tensors only, no
unpickled code) from a local folder: `weights_dir`, or the installed facenet-pytorch's data folder.
facenet-pytorch itself is never imported (it pins torch < 2.3 and imports torchvision); the Makefile
installs its wheel with --no-deps for the weights. The networks and the cascade follow its
`models/mtcnn.py` and `models/utils/detect_face.py` (thresholds 0.6/0.7/0.7, pyramid factor 0.709).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

THRESHOLDS, FACTOR, MIN_FACE = (0.6, 0.7, 0.7), 0.709, 20


def weights_folder(weights_dir: str | Path | None = None) -> Path:
    """The folder with pnet.pt, rnet.pt and onet.pt: `weights_dir`, or facenet-pytorch's installed data."""
    if weights_dir is None:
        spec = importlib.util.find_spec("facenet_pytorch")  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "mtcnn: no weights_dir and no facenet-pytorch installed (pip install --no-deps facenet-pytorch==2.6.0)"
            )
        weights_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    folder = Path(weights_dir)
    missing = [name for name in ("pnet.pt", "rnet.pt", "onet.pt") if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"mtcnn: {folder} lacks {', '.join(missing)} (MTCNN's state dicts)")
    return folder


def _stage(layers: list[tuple[str, nn.Module]]) -> nn.Module:
    module = nn.Module()
    for name, layer in layers:
        module.add_module(name, layer)
    return module


def _convs(channels: list[int], kernels: list[int]) -> list[tuple[str, nn.Module]]:
    layers: list[tuple[str, nn.Module]] = []
    for i, (c_in, c_out, k) in enumerate(zip(channels, channels[1:], kernels), start=1):
        layers += [(f"conv{i}", nn.Conv2d(c_in, c_out, k)), (f"prelu{i}", nn.PReLU(c_out))]
    return layers


def _load(module: nn.Module, path: Path) -> nn.Module:
    state = torch.load(path, map_location="cpu", weights_only=True)
    module.load_state_dict(state)
    return module.eval()


class Mtcnn:
    """Faces and their five landmarks in an RGB uint8 image (`detect`)."""

    def __init__(self, weights_dir: str | Path | None = None):
        folder = weights_folder(weights_dir)
        pnet = _stage(_convs([3, 10, 16, 32], [3, 3, 3]) + [("conv4_1", nn.Conv2d(32, 2, 1)), ("conv4_2", nn.Conv2d(32, 4, 1))])
        rnet = _stage(_convs([3, 28, 48, 64], [3, 3, 2]) + [("dense4", nn.Linear(576, 128)), ("prelu4", nn.PReLU(128))])
        rnet.add_module("dense5_1", nn.Linear(128, 2))
        rnet.add_module("dense5_2", nn.Linear(128, 4))
        onet = _stage(_convs([3, 32, 64, 64, 128], [3, 3, 3, 2]) + [("dense5", nn.Linear(1152, 256)), ("prelu5", nn.PReLU(256))])
        for name, size in (("dense6_1", 2), ("dense6_2", 4), ("dense6_3", 10)):
            onet.add_module(name, nn.Linear(256, size))
        self.pnet, self.rnet, self.onet = (
            _load(m, folder / f"{n}.pt") for m, n in ((pnet, "pnet"), (rnet, "rnet"), (onet, "onet"))
        )

    def _p(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n: Any = self.pnet  # layers added by name (_stage)
        x = n.prelu1(n.conv1(x))
        x = n.prelu3(n.conv3(n.prelu2(n.conv2(F.max_pool2d(x, 2, 2, ceil_mode=True)))))
        return n.conv4_2(x), F.softmax(n.conv4_1(x), dim=1)

    def _r(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n: Any = self.rnet  # layers added by name (_stage)
        x = F.max_pool2d(n.prelu1(n.conv1(x)), 3, 2, ceil_mode=True)
        x = n.prelu3(n.conv3(F.max_pool2d(n.prelu2(n.conv2(x)), 3, 2, ceil_mode=True)))
        x = n.prelu4(n.dense4(x.permute(0, 3, 2, 1).reshape(len(x), -1)))  # the Caffe weights' order
        return n.dense5_2(x), F.softmax(n.dense5_1(x), dim=1)

    def _o(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n: Any = self.onet  # layers added by name (_stage)
        x = F.max_pool2d(n.prelu1(n.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(n.prelu2(n.conv2(x)), 3, 2, ceil_mode=True)
        x = n.prelu4(n.conv4(F.max_pool2d(n.prelu3(n.conv3(x)), 2, 2, ceil_mode=True)))
        x = n.prelu5(n.dense5(x.permute(0, 3, 2, 1).reshape(len(x), -1)))
        return n.dense6_2(x), n.dense6_3(x), F.softmax(n.dense6_1(x), dim=1)

    @torch.no_grad()
    def detect(self, image: np.ndarray, min_face: int = MIN_FACE) -> list[Face]:
        """Faces found in RGB uint8 `image`, most probable first (empty: none)."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"mtcnn: expected an RGB uint8 image, got {image.dtype} {image.shape}")
        x = (torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1)[None].float() - 127.5) * 0.0078125
        boxes = self._proposals(x, min_face)
        boxes = self._refine(x, boxes)
        return self._output(x, boxes)

    def _proposals(self, x: torch.Tensor, min_face: int) -> np.ndarray:
        height, width = x.shape[2:]
        scale, found = 12.0 / min_face, []
        while min(height, width) * scale >= 12:
            resized = F.interpolate(x, size=(int(height * scale + 1), int(width * scale + 1)), mode="area")
            reg, prob = self._p(resized)
            ys, xs = np.nonzero(prob[0, 1].numpy() >= THRESHOLDS[0])
            if len(ys):
                score, offsets = prob[0, 1].numpy()[ys, xs], reg[0].numpy()[:, ys, xs].T
                corner = np.stack([xs, ys], axis=1).astype(np.float64)
                q1, q2 = np.floor((2 * corner + 1) / scale), np.floor((2 * corner + 12) / scale)
                boxes = np.hstack([q1, q2, score[:, None], offsets])
                found.append(boxes[nms(boxes[:, :5], 0.5)])
            scale *= FACTOR
        if not found:
            return np.zeros((0, 5))
        boxes = np.vstack(found)
        boxes = boxes[nms(boxes[:, :5], 0.7)]
        size = np.stack([boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]] * 2, axis=1)
        return square(np.hstack([boxes[:, :4] + boxes[:, 5:9] * size, boxes[:, 4:5]]))

    def _refine(self, x: torch.Tensor, boxes: np.ndarray) -> np.ndarray:
        if not len(boxes):
            return boxes
        reg, prob = self._r(crops(x, boxes, 24))
        keep = prob[:, 1].numpy() > THRESHOLDS[1]
        boxes = np.hstack([boxes[keep, :4], prob[keep, 1].numpy()[:, None]])
        picked = nms(boxes, 0.7)
        return square(regress(boxes[picked], reg.numpy()[keep][picked]))

    def _output(self, x: torch.Tensor, boxes: np.ndarray) -> list[Face]:
        if not len(boxes):
            return []
        reg, marks, prob = self._o(crops(x, boxes, 48))
        keep = prob[:, 1].numpy() > THRESHOLDS[2]
        boxes, reg_k, marks_k = (
            np.hstack([boxes[keep, :4], prob[keep, 1].numpy()[:, None]]),
            reg.numpy()[keep],
            marks.numpy()[keep],
        )
        w, h = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
        points = np.stack(
            [w[:, None] * marks_k[:, :5] + boxes[:, :1] - 1, h[:, None] * marks_k[:, 5:] + boxes[:, 1:2] - 1], axis=2
        )
        boxes = regress(boxes, reg_k)
        picked = nms(boxes, 0.7, by_min=True)
        return [Face(tuple(float(v) for v in boxes[i, :4]), float(boxes[i, 4]), points[i]) for i in picked]  # type: ignore[arg-type]


@dataclass(frozen=True)
class Face:
    box: tuple[float, float, float, float]  # x0, y0, x1, y1
    probability: float
    points: np.ndarray  # (5, 2): eyes (the subject's right first), nose tip, mouth corners; pixel indices


def nms(boxes: np.ndarray, threshold: float, *, by_min: bool = False) -> list[int]:
    """Indices of `boxes` (x0, y0, x1, y1, score) kept by greedy non-maximum suppression: overlap
    over the union (or over the smaller box, `by_min`) above `threshold` suppresses the weaker."""
    area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    order, kept = list(np.argsort(-boxes[:, 4], kind="stable")), []
    while order:
        best, rest = order[0], np.array(order[1:], dtype=int)
        kept.append(int(best))
        if not len(rest):
            break
        w = np.maximum(0.0, np.minimum(boxes[best, 2], boxes[rest, 2]) - np.maximum(boxes[best, 0], boxes[rest, 0]) + 1)
        h = np.maximum(0.0, np.minimum(boxes[best, 3], boxes[rest, 3]) - np.maximum(boxes[best, 1], boxes[rest, 1]) + 1)
        overlap = w * h / (np.minimum(area[best], area[rest]) if by_min else area[best] + area[rest] - w * h)
        order = [int(i) for i in rest[overlap <= threshold]]
    return kept


def square(boxes: np.ndarray) -> np.ndarray:
    """Each box grown to a square on its centre (the cascade's next crop)."""
    out = boxes.copy()
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    side = np.maximum(w, h)
    out[:, 0], out[:, 1] = boxes[:, 0] + w * 0.5 - side * 0.5, boxes[:, 1] + h * 0.5 - side * 0.5
    out[:, 2], out[:, 3] = out[:, 0] + side, out[:, 1] + side
    return out


def regress(boxes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Boxes moved by a stage's regression (shares of their width and height)."""
    out = boxes.copy()
    size = np.stack([boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1] * 2, axis=1)
    out[:, :4] = boxes[:, :4] + offsets * size
    return out


def crops(x: torch.Tensor, boxes: np.ndarray, size: int) -> torch.Tensor:
    """Each box of the normalized image `x` (zero outside the picture), resized to size×size."""
    height, width = x.shape[2:]
    out = []
    for x0, y0, x1, y1 in np.fix(boxes[:, :4]).astype(int):
        piece = torch.zeros(1, 3, max(y1 - y0 + 1, 1), max(x1 - x0 + 1, 1))
        top, left, bottom, right = max(y0, 0), max(x0, 0), min(y1 + 1, height), min(x1 + 1, width)
        if bottom > top and right > left:
            piece[:, :, top - y0 : bottom - y0, left - x0 : right - x0] = x[:, :, top:bottom, left:right]
        out.append(F.interpolate(piece, size=(size, size), mode="area"))
    return torch.cat(out)


class MtcnnLandmarks:
    """ArcFace's five landmarks from MTCNN, for the face in a control sample's box (`locate`)."""

    def __init__(self, weights_dir: str | Path | None = None, pad: float = 0.6, min_overlap: float = 0.3):
        self.mtcnn, self.pad, self.min_overlap = Mtcnn(weights_dir), pad, min_overlap

    def locate(self, image: np.ndarray, box) -> tuple[np.ndarray, np.ndarray] | None:
        """(the crop around `box` grown by `pad`, the five points in it) of the detected face that
        overlaps the box most (at least `min_overlap`); None when no face is found there."""
        from drape.gates.recognizers import box_region
        from drape.gates.recognizers.dlib_face import _overlap

        x0, y0, x1, y1 = box_region(box, image.shape, self.pad)
        crop = np.ascontiguousarray(image[y0:y1, x0:x1])
        expected = [float(box[0]) - x0, float(box[1]) - y0, float(box[2]) - x0, float(box[3]) - y0]
        scored = [(_overlap(face.box, expected), face) for face in self.mtcnn.detect(crop)]
        scored = [(overlap, face) for overlap, face in scored if overlap >= self.min_overlap]
        if not scored:
            return None
        return crop, max(scored, key=lambda item: item[0])[1].points

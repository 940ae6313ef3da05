"""Validation gates: the three checks a reviewer makes, on the fixed control set.

- identity: cosine similarity of face embeddings, source person vs raw model output, face box.
  The embedder is pluggable: `PixelFaceEmbedder` (the synthetic demo's: no weights, no detection)
  and `OnnxFaceEmbedder` (an ONNX model on the fixed face box), or a real face recognizer with
  detection and alignment (`drape.gates.recognizers`: dlib, ArcFace ONNX), which reports a face
  it cannot find as its own outcome.
- texture: normalised cross-correlation of the logo region, output vs target, as codecs keep
  colour, maximised over shifts of up to `max_shift_pixels` (the logo moves with the cloth),
  less a penalty when the mark reads the wrong way round and scaled down when the mark lost
  its sharpness: a melted, blurred, mirrored or swapped logo scores low.
- coherence: the garment region's structure (edge maps and pooled layout, and the worst local
  block) vs the reference output of the last validated checkpoint, same inputs and seed (first
  run: the ground truth).

Each check is computed per control sample; `drape.gate_report` aggregates the values and applies
the thresholds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional as F

from drape.config import GatesConfig
from drape.gates.recognizers import RecognizerCheck, build_recognizer


class FaceEmbedder(Protocol):
    name: str

    def embed(self, crops: list[np.ndarray]) -> np.ndarray:
        """(N, D) embeddings of RGB uint8 face crops."""


_YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])  # RGB → YCbCr (JPEG)


def _resize(crop: np.ndarray, size: int) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)[None].float()
    return F.interpolate(tensor, size=(size, size), mode="bilinear", align_corners=False)[0]


class PixelFaceEmbedder:
    """Weight-free embedding: half face structure, half skin tone, each unit length.

    Structure is the mean-centred luminance of the crop at 16×16 (geometry of eyes, nose, hair
    line): codecs keep luminance at full resolution and halve chroma, so structure read from colour
    channels moves with JPEG as much as with another face (figures in benchmarks/README.md). Skin tone is
    the mean colour of the crop's central half, encoded by Gaussian bumps on a 5×5×5 colour grid so
    that the cosine of two tones falls with their distance. Cosine similarity of two embeddings is
    then the average of the two similarities.
    """

    name = "pixel"
    _grid = torch.stack(torch.meshgrid(*[torch.linspace(0, 1, 5)] * 3, indexing="ij"), dim=-1).reshape(-1, 3)
    _luma = torch.tensor(_YCC[0], dtype=torch.float32)[:, None, None]

    def embed(self, crops: list[np.ndarray]) -> np.ndarray:
        rows = []
        for crop in crops:
            image = _resize(crop, 16) / 255.0
            luma = (image * self._luma).sum(dim=0)
            structure = (luma - luma.mean()).flatten()
            tone = image[:, 4:12, 4:12].mean(dim=(1, 2))
            bumps = torch.exp(-((self._grid - tone) ** 2).sum(dim=1) / (2 * 0.1**2))
            parts = [part / part.norm().clamp_min(1e-8) for part in (structure, bumps)]
            rows.append((torch.cat(parts) / np.sqrt(2)).numpy())
        return np.stack(rows)


class OnnxFaceEmbedder:
    """An ArcFace-style ONNX model: input (N, 3, H, W) in [-1, 1], output (N, D)."""

    name = "onnx"

    def __init__(self, model_path: str | Path):
        import onnxruntime

        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"gates.identity.onnx_model_path: {path} does not exist")
        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        model_input = self.session.get_inputs()[0]
        self.input_name, self.size = model_input.name, int(model_input.shape[-1])

    def embed(self, crops: list[np.ndarray]) -> np.ndarray:
        batch = torch.stack([_resize(crop, self.size) for crop in crops]).numpy() / 127.5 - 1
        output = self.session.run(None, {self.input_name: batch.astype(np.float32)})[0]
        return output / np.linalg.norm(output, axis=1, keepdims=True).clip(1e-8)


def build_embedder(config: GatesConfig) -> FaceEmbedder | RecognizerCheck:
    """The configured identity embedder, or a recognizer (`drape.gates.recognizers`) for dlib and arcface."""
    identity = config.identity
    if identity.embedder in ("dlib", "arcface"):
        return build_recognizer(
            identity.embedder,
            model_path=identity.onnx_model_path,
            model_dir=identity.model_dir,
            same_person=identity.same_person,
            detector=identity.detector,
            max_drift=identity.max_drift,
            max_warp=identity.max_warp,
        )
    if config.identity.embedder == "onnx":
        return OnnxFaceEmbedder(config.identity.onnx_model_path or "")  # the config requires a path for 'onnx'
    return PixelFaceEmbedder()


def _crop(image: np.ndarray, box) -> np.ndarray:
    height, width = image.shape[:2]
    x0, y0 = max(int(np.floor(box[0])), 0), max(int(np.floor(box[1])), 0)
    x1, y1 = min(int(np.ceil(box[2])), width), min(int(np.ceil(box[3])), height)
    return image[y0:y1, x0:x1]


def identity_scores(outputs: np.ndarray, sources: np.ndarray, face_boxes: list, embedder: FaceEmbedder) -> np.ndarray:
    """Per-sample cosine similarity of face embeddings, source vs output."""
    source = embedder.embed([_crop(img, box) for img, box in zip(sources, face_boxes)])
    output = embedder.embed([_crop(img, box) for img, box in zip(outputs, face_boxes)])
    return np.sum(source * output, axis=1)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two same-shaped arrays; 0 when either is flat."""
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    x, y = x - x.mean(), y - y.mean()
    scale = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / scale) if scale > 0 else 0.0


def patch_fidelity(output: np.ndarray, target: np.ndarray) -> float:
    """Normalised cross-correlation of two multi-channel patches, all channels at once, in [-1, 1].

    Each channel is centred on its own mean, then the three are correlated together, so a channel
    weighs by its contrast: the mark's structure counts, flat channels and codec noise in them do
    not. Invariant to brightness and contrast: a blurred, melted, mirrored or different mark
    scores low, a faithful one near 1.
    """
    x = output.astype(np.float64) - output.reshape(-1, output.shape[-1]).mean(axis=0)
    y = target.astype(np.float64) - target.reshape(-1, target.shape[-1]).mean(axis=0)
    scale = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / scale) if scale > 0 else 0.0


def shifted_fidelities(region: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """`patch_fidelity` of every window of `reference`'s size in `region` against `reference`, at
    once: (rows, columns) of shifts, [i, j] the window at row i, column j of `region`. The search
    `texture_scores` makes over shifts, as three correlations (float64) instead of a Python call per
    window (a 17×17 search on each of 6 marks was 1,734 calls a gate)."""
    height, width, channels = reference.shape
    centred = reference.astype(np.float64) - reference.reshape(-1, channels).mean(axis=0)
    image = torch.from_numpy(np.ascontiguousarray(region, dtype=np.float64)).permute(2, 0, 1)[None]
    kernel = torch.from_numpy(np.ascontiguousarray(centred)).permute(2, 0, 1)[None]
    ones = torch.ones((channels, 1, height, width), dtype=torch.float64)
    # the window's centring drops out of the product: the centred reference sums to 0 per channel
    product = F.conv2d(image, kernel)[0, 0].numpy()
    sums = F.conv2d(image, ones, groups=channels)[0].numpy()  # (c, rows, cols)
    squares = F.conv2d(image * image, ones, groups=channels)[0].numpy().sum(axis=0)
    energy = squares - (sums * sums).sum(axis=0) / (height * width)
    energy[energy <= 1e-12 * squares] = 0.0  # a flat window: its own energy is rounding, as patch_fidelity's 0
    scale = np.sqrt(energy * float((centred * centred).sum()))
    return np.divide(product, scale, out=np.zeros_like(product), where=scale > 0)


def _window(region: np.ndarray, values: np.ndarray, flat: int, reference: np.ndarray) -> np.ndarray:
    """The window of `region` whose fidelity is `values.flat[flat]` (`shifted_fidelities`)."""
    row, column = divmod(flat, values.shape[1])
    return region[row : row + reference.shape[0], column : column + reference.shape[1]]


def codec_view(image: np.ndarray) -> np.ndarray:
    """The image as codecs keep it: YCbCr with chroma box-smoothed 2×2 (JPEG and video keep chroma
    at half resolution, so chroma detail finer than that says nothing about the model)."""
    ycc = image.astype(np.float64) @ _YCC.T
    chroma = torch.from_numpy(ycc[..., 1:]).permute(2, 0, 1)[None]
    chroma = F.avg_pool2d(F.pad(chroma, (0, 1, 0, 1), mode="replicate"), 2, stride=1)
    ycc[..., 1:] = chroma[0].permute(1, 2, 0).numpy()
    return ycc


def _gradient_energy(patch: np.ndarray) -> float:
    return float((np.diff(patch, axis=0) ** 2).sum() + (np.diff(patch, axis=1) ** 2).sum())


def handedness(window: np.ndarray, mark: np.ndarray, mirrored: np.ndarray) -> float:
    """Which way round the mark in `window` reads: about 1 as drawn, about -1 mirrored, near 0 neither
    (blurred away, or another mark).

    The projection of the window onto what tells the mark from its mirror image (the mark less its
    mirror, both mean-centred), over the mark's own projection. It ignores all the window shares
    with both (the plate, the background, whatever of the mark is symmetric), which dominates a
    plain correlation when the mark is a few pixels. 1.0 for a mark that looks the same mirrored:
    nothing to tell.
    """

    def centred(patch: np.ndarray) -> np.ndarray:
        return patch - patch.reshape(-1, patch.shape[-1]).mean(axis=0)

    mark = centred(mark)
    difference = mark - centred(mirrored)
    own = float((mark * difference).sum())
    if own <= 1e-3 * float((mark * mark).sum()):  # symmetric: the mirror changes nothing
        return 1.0
    return float((centred(window) * difference).sum()) / own


def texture_scores(
    outputs: np.ndarray,
    targets: np.ndarray,
    logo_boxes: list,
    max_shift: int,
    *,
    mirror_penalty: float = 2.0,
    sharpness_floor: float = 0.2,
) -> np.ndarray:
    """Per-sample logo fidelity in [-1, 1]: 1 is the mark as drawn.

    fidelity: `patch_fidelity` of the logo window (in `codec_view`) against the target's, the best
    over shifts of up to `max_shift` pixels (the logo moves with the cloth), then
    - mirrored: `handedness` of the window that best matches the mark or its mirror image; when it
      reads the wrong way round (below 0), `mirror_penalty` times that is taken off.
    - melted: the window's gradient energy over the mark's; below `sharpness_floor` the score is
      scaled down in proportion.
    Where faithful, mirrored, blurred and JPEG'd marks fall on both terms: benchmarks/README.md.
    """
    scores = []
    for output, target, box in zip(outputs, targets, logo_boxes):
        height, width = target.shape[:2]
        x0, y0 = max(int(round(box[0])), 0), max(int(round(box[1])), 0)
        x1, y1 = min(int(round(box[2])), width), min(int(round(box[3])), height)
        seen, reference = codec_view(output), codec_view(target)[y0:y1, x0:x1]
        # the mark mirrored in pixels, then seen as codecs see it (mirroring the codec view instead would
        # move its half-resolution chroma by a pixel, and a mirrored output would not match it); only
        # when the mirror term is on
        mirrored = (
            codec_view(np.ascontiguousarray(target[:, ::-1]))[y0:y1, width - x1 : width - x0] if mirror_penalty > 0 else None
        )
        # the shifts that keep the window inside the image, in rows and columns of `seen`
        top, left = max(y0 - max_shift, 0), max(x0 - max_shift, 0)
        bottom, right = min(y1 + max_shift, height), min(x1 + max_shift, width)
        if reference.size == 0 or bottom - top < y1 - y0 or right - left < x1 - x0:
            scores.append(0.0)
            continue
        region = seen[top:bottom, left:right]
        values = shifted_fidelities(region, reference)

        first = int(np.argmax(values))  # the first best in row order, as a search by rows would keep
        best = float(values.flat[first])
        if best <= -1.0:  # nothing above -1: no window
            scores.append(0.0)
            continue
        window, aligned = _window(region, values, first, reference), None
        if mirrored is not None:
            either = np.maximum(values, shifted_fidelities(region, mirrored))
            chosen = int(np.argmax(either))
            aligned = _window(region, values, chosen, reference) if either.flat[chosen] > -1.0 else None
        score = best
        if mirrored is not None and aligned is not None:  # aligned: no window matched the mark or its mirror above -1
            score -= mirror_penalty * max(0.0, -handedness(aligned, reference, mirrored))
        mark_energy = _gradient_energy(reference)
        if sharpness_floor > 0 and mark_energy > 0:
            score *= min(1.0, _gradient_energy(window) / mark_energy / sharpness_floor)
        scores.append(float(np.clip(score, -1.0, 1.0)))
    return np.array(scores)


def edge_map(image: np.ndarray) -> np.ndarray:
    """Sobel gradient magnitude of the luminance, blurred 3×3 so 1 px shifts do not count."""
    gray = torch.from_numpy(image.astype(np.float32) / 255).permute(2, 0, 1).mean(dim=0)[None, None]
    sobel = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])[None, None]
    gray = F.pad(gray, (1, 1, 1, 1), mode="replicate")  # no fake edges at the image border
    gx, gy = F.conv2d(gray, sobel), F.conv2d(gray, sobel.transpose(2, 3))
    magnitude = F.pad((gx**2 + gy**2).sqrt(), (1, 1, 1, 1), mode="replicate")
    return F.avg_pool2d(magnitude, 3, stride=1)[0, 0].numpy()


def _pool(array: np.ndarray, factor: int) -> np.ndarray:
    tensor = torch.from_numpy(array.astype(np.float32))
    tensor = tensor.permute(2, 0, 1)[None] if tensor.ndim == 3 else tensor[None, None]
    return F.avg_pool2d(tensor, factor)[0].numpy()


def coherence_scores(outputs: np.ndarray, references: np.ndarray, masks: np.ndarray, layout_factor: int = 4) -> np.ndarray:
    """Per-sample structure agreement in the garment region, in [0, 1].

    Globally: half edge structure (correlation of edge maps inside the region), half layout
    (correlation of the region's colours pooled over `layout_factor` blocks). Locally: one minus
    the largest colour distance between the two images' blocks on a 16×16 grid over the region
    (RGB distance as a share of the largest possible), so a defect confined to one place (a sleeve
    missing) counts in full instead of being averaged away. The score is the lower of the two.
    Raw pixels are never compared: two diffusion trajectories can differ pixel by pixel and still
    hold the same garment.
    """
    scores = []
    for output, reference, mask in zip(outputs, references, masks):
        region = mask > 127
        edges = correlation(edge_map(output)[region], edge_map(reference)[region])
        pooled_region = _pool(region.astype(np.float32), layout_factor)[0] > 0.5
        pooled_out, pooled_ref = _pool(output, layout_factor), _pool(reference, layout_factor)
        layout = float(np.mean([correlation(pooled_out[c][pooled_region], pooled_ref[c][pooled_region]) for c in range(3)]))
        structure = 0.5 * max(edges, 0.0) + 0.5 * max(layout, 0.0)
        block = max(output.shape[1] // 16, 1)
        blocks = _pool(region.astype(np.float32), block)[0] > 0.5
        if blocks.any():
            distance = np.sqrt(((_pool(output, block) - _pool(reference, block)) ** 2).sum(axis=0)) / (255 * np.sqrt(3))
            structure = min(structure, 1.0 - float(distance[blocks].max()))
        scores.append(max(structure, 0.0))
    return np.array(scores)


def lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (0-255, (..., 3)) → CIE L*a*b* (D65)."""
    c = np.clip(rgb / 255.0, 0, 1)
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = linear @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]).T
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)

"""The feature networks the field's metrics stand on, loaded from local files only.

- FID and KID: the TorchScript Inception-v3 of StyleGAN2-ADA and clean-fid
  (``inception-2015-12-05.pt``) → (N, 2048) pool features of images in [0, 255], reached in one of
  two ways (`eval.fid_resize`):

  - ``clean`` (default; clean-fid's default, which the field's evaluation scripts use): each
    image is resized to 299×299 first, as clean-fid's ``make_resizer("PIL", False, "bicubic",
    (299, 299))`` does it (each channel as a float32 PIL image, bicubic, clipped to [0, 255],
    not re-quantised), then goes through the network's ``layers`` on ``(x - 128) / 128``, as
    clean-fid's ``InceptionV3W`` calls it. A module without ``layers`` gets the 299×299 images
    through ``net(images, return_features=True)``.
  - ``legacy``: ``net(images, return_features=True)`` at the dataset resolution; the network
    resizes to 299×299 inside (bilinear), as StyleGAN2-ADA and clean-fid's legacy mode do.

  The two differ on the same images (`benchmarks/fid_resize.py` prints by how much); published
  numbers compare only under the same one. A test builds a small TorchScript module with the
  real one's structure (``layers``, the same call) and passes it by path, as a real one is passed.
- LPIPS: AlexNet's convolutional features (torchvision's ``alexnet-owt-7be5be79.pth``, keys
  ``features.<i>.*``) under LPIPS's linear heads, which torchmetrics ships in its wheel
  (``lpips_models/alex.pth``); the LPIPS arithmetic is torchmetrics' (scaling layer, unit-normalised
  features, squared difference, linear heads, spatial mean).

A missing file is `MissingWeights`, naming the config field, the path and where to get it.
Nothing is downloaded here (torchvision, whose AlexNet torchmetrics' LPIPS would fetch, is not
needed).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torchmetrics.functional.image import lpips as tm_lpips

from drape.config.eval import INCEPTION_SOURCE, LPIPS_BACKBONE_SOURCE, EvalConfig
from drape.torchfile import load_state_dict

INCEPTION_SIZE = 299  # Inception-v3's input side
FID_RESIZES = ("clean", "legacy")
# how each resize is written beside the numbers
RESIZE_DESCRIPTIONS = {
    "clean": "clean resize (PIL bicubic to 299×299 before Inception, as clean-fid)",
    "legacy": "legacy resize (Inception's own bilinear to 299×299 inside)",
}
LPIPS_CHANNELS = (64, 192, 384, 256, 256)  # AlexNet's relu1..relu5
LPIPS_SLICES = ((0, 2), (2, 5), (5, 8), (8, 10), (10, 12))  # features[a:b] up to each relu, as LPIPS cuts them


class MissingWeights(FileNotFoundError):
    """A feature network's weight file that is not there; names the field, the path and its source."""


def _weights_file(path: str | None, field: str, source: str) -> Path:
    if not path:
        raise MissingWeights(f"eval.{field} is not set: download the file once from {source} and give its local path")
    if not Path(path).is_file():
        raise MissingWeights(f"eval.{field} {path}: no such file; download it once from {source} (nothing downloads at run time)")
    return Path(path)


def clean_resize(image: np.ndarray, size: int = INCEPTION_SIZE) -> np.ndarray:
    """clean-fid's resize of one (H, W, 3) uint8 image → (size, size, 3) float32 in [0, 255]: each
    channel as a float32 PIL image, bicubic, clipped, not re-quantised (its `make_resizer("PIL",
    False, "bicubic", (299, 299))`)."""
    channels = [
        np.asarray(Image.fromarray(image[:, :, c].astype(np.float32)).resize((size, size), Image.Resampling.BICUBIC))
        for c in range(image.shape[2])
    ]
    return np.stack(channels, axis=2).clip(0, 255).astype(np.float32)


def clean_resize_batch(images: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) uint8 → (N, 3, 299, 299) float32 by `clean_resize`, on the images' device."""
    hwc = images.permute(0, 2, 3, 1).cpu().numpy()
    resized = np.stack([clean_resize(image) for image in hwc])
    return torch.from_numpy(resized).to(torch.float32).permute(0, 3, 1, 2).contiguous().to(images.device)


class InceptionFeatures(nn.Module):
    """(N, 3, H, W) uint8 images → (N, D) float features of a TorchScript Inception (or any module
    with its call), evaluated without gradients; `resize`: `clean` or `legacy` (module docstring)."""

    def __init__(self, net: nn.Module, resize: str = "clean"):
        super().__init__()
        if resize not in FID_RESIZES:
            raise ValueError(f"eval.fid_resize {resize!r}: expected one of {FID_RESIZES}")
        self.net, self.resize = net.eval(), resize
        with torch.no_grad():
            self.num_features = int(self(torch.zeros(1, 3, 64, 64, dtype=torch.uint8)).shape[-1])

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.resize == "legacy":
            return self.net(images.to(torch.float32), return_features=True).float()
        resized = clean_resize_batch(images)
        layers = getattr(self.net, "layers", None)
        if layers is None:
            return self.net(resized, return_features=True).float()
        # clean-fid's InceptionV3W: the network's own normalisation, then its layers (its resampling,
        # an identity at 299×299 up to rounding, is skipped)
        return layers((resized - 128) / 128).reshape(len(images), -1).float()


def load_inception(path: str | None, resize: str = "clean") -> InceptionFeatures:
    """The FID/KID feature network at `path` (`eval.inception_path`), fed by `resize`
    (`eval.fid_resize`: clean, the default, or legacy)."""
    weights = _weights_file(path, "inception_path", INCEPTION_SOURCE)
    try:
        net = torch.jit.load(str(weights), map_location="cpu")
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"eval.inception_path {weights}: not a TorchScript module ({error})") from None
    return InceptionFeatures(net, resize)


def alexnet_features() -> nn.Sequential:
    """AlexNet's `features` stack, laid out as torchvision lays it out (so its weights load by key)."""
    return nn.Sequential(
        nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(64, 192, kernel_size=5, padding=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(192, 384, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, kernel_size=3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(kernel_size=3, stride=2),
    )


class LPIPS(nn.Module):
    """LPIPS (AlexNet variant) of two batches in [-1, 1] → (N,) distances; 0 for identical images."""

    def __init__(self, features: nn.Sequential):
        super().__init__()
        self.scaling = tm_lpips.ScalingLayer()
        self.slices = nn.ModuleList(nn.Sequential(*list(features)[a:b]) for a, b in LPIPS_SLICES)
        self.lins = nn.ModuleList(tm_lpips.NetLinLayer(channels, use_dropout=True) for channels in LPIPS_CHANNELS)
        heads = Path(inspect.getfile(tm_lpips)).parent / "lpips_models" / "alex.pth"
        state = load_state_dict(heads, f"torchmetrics' LPIPS heads {heads}")
        for index, lin in enumerate(self.lins):
            lin.load_state_dict(
                {key.removeprefix(f"lin{index}."): value for key, value in state.items() if key.startswith(f"lin{index}.")}
            )
        self.eval().requires_grad_(False)

    def _activations(self, images: torch.Tensor) -> list[torch.Tensor]:
        outputs, x = [], self.scaling(images)
        for block in self.slices:
            x = block(x)
            outputs.append(x)
        return outputs

    @torch.no_grad()
    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(first.shape[0], device=first.device)
        for lin, a, b in zip(self.lins, self._activations(first), self._activations(second)):
            difference = (tm_lpips._normalize_tensor(a) - tm_lpips._normalize_tensor(b)) ** 2
            total = total + tm_lpips._spatial_average(lin(difference), keep_dim=True).flatten()
        return total


def load_lpips(path: str | None) -> LPIPS:
    """LPIPS with the AlexNet weights at `path` (`eval.lpips_backbone_path`)."""
    weights = _weights_file(path, "lpips_backbone_path", LPIPS_BACKBONE_SOURCE)
    state = load_state_dict(weights, f"eval.lpips_backbone_path {weights}")
    features = alexnet_features()
    wanted = {key.removeprefix("features."): value for key, value in state.items() if key.startswith("features.")}
    try:
        features.load_state_dict(wanted)
    except RuntimeError as error:
        raise ValueError(f"eval.lpips_backbone_path {weights}: not AlexNet weights with features.* keys ({error})") from None
    return LPIPS(features)


@dataclass
class FeatureNetworks:
    """What `drape eval` measures with: Inception for FID/KID; LPIPS for paired runs only."""

    inception: InceptionFeatures
    lpips: LPIPS | None = None

    def to(self, device: torch.device) -> FeatureNetworks:
        self.inception.to(device)
        if self.lpips is not None:
            self.lpips.to(device)
        return self


def load_feature_networks(config: EvalConfig, *, paired: bool) -> FeatureNetworks:
    """The networks `config` names (LPIPS only when `paired`); `MissingWeights` for a missing file."""
    inception = load_inception(config.inception_path, config.fid_resize)
    return FeatureNetworks(inception, load_lpips(config.lpips_backbone_path) if paired else None)

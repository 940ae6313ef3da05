"""The feature networks the field's metrics stand on, loaded from local files only.

- FID and KID: the TorchScript Inception-v3 of StyleGAN2-ADA and clean-fid
  (``inception-2015-12-05.pt``), called as ``net(images, return_features=True)`` on images in
  [0, 255] of any size (it resizes to 299×299 inside) → (N, 2048) pool features. Any TorchScript
  module with that call works the same way: a test builds a small one and passes it by path, as
  a real one is passed.
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

import torch
from torch import nn
from torchmetrics.functional.image import lpips as tm_lpips

from drape.config.eval import INCEPTION_SOURCE, LPIPS_BACKBONE_SOURCE, EvalConfig

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


class InceptionFeatures(nn.Module):
    """(N, 3, H, W) uint8 images → (N, D) float features of a TorchScript Inception (or any module
    with its call), evaluated without gradients."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net.eval()
        with torch.no_grad():
            self.num_features = int(self(torch.zeros(1, 3, 64, 64, dtype=torch.uint8)).shape[-1])

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images.to(torch.float32), return_features=True).float()


def load_inception(path: str | None) -> InceptionFeatures:
    """The FID/KID feature network at `path` (`eval.inception_path`)."""
    weights = _weights_file(path, "inception_path", INCEPTION_SOURCE)
    try:
        net = torch.jit.load(str(weights), map_location="cpu")
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"eval.inception_path {weights}: not a TorchScript module ({error})") from None
    return InceptionFeatures(net)


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
        state = torch.load(heads, map_location="cpu", weights_only=True)
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
    state = torch.load(weights, map_location="cpu", weights_only=True)
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
    return FeatureNetworks(load_inception(config.inception_path), load_lpips(config.lpips_backbone_path) if paired else None)

"""The field's metrics through torchmetrics: per batch what can be kept per sample, at the end
the set statistics.

A batch of generated images and their references gives per-sample records (SSIM, LPIPS: paired
only) and both sides' Inception features; those records are what a resumable run persists.
`summarize` then hands the features to torchmetrics' FrechetInceptionDistance and
KernelInceptionDistance through a pass-through feature module (the features are already the
network's), so FID and KID are torchmetrics' own arithmetic on the whole set.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn
from torchmetrics.image import StructuralSimilarityIndexMeasure
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance

from drape.eval.features import FeatureNetworks

PAIRED_METRICS = ("ssim", "lpips", "fid", "kid", "kid_std")
UNPAIRED_METRICS = ("fid", "kid", "kid_std")


class PassThrough(nn.Module):
    """A 'feature network' whose input is already the features: torchmetrics computes the statistics."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


def nchw(images: np.ndarray, device: torch.device) -> torch.Tensor:
    """(N, H, W, 3) uint8 → (N, 3, H, W) uint8 tensor on `device`."""
    return torch.as_tensor(np.ascontiguousarray(images)).permute(0, 3, 1, 2).to(device)


@torch.no_grad()
def batch_records(networks: FeatureNetworks, generated: np.ndarray, reference: np.ndarray, *, paired: bool) -> dict:
    """Per-sample records of one batch: Inception features of both sides, and SSIM and LPIPS of each
    generated image against its reference when `paired`."""
    device = next(networks.inception.parameters(), torch.zeros(0)).device
    fake, real = nchw(generated, device), nchw(reference, device)
    records = {
        "fake_features": networks.inception(fake).double().cpu().numpy(),
        "real_features": networks.inception(real).double().cpu().numpy(),
    }
    if paired:
        if networks.lpips is None:
            raise ValueError("a paired evaluation needs the LPIPS network (eval.lpips_backbone_path)")
        ssim = StructuralSimilarityIndexMeasure(data_range=1.0, reduction="none").to(device)
        records["ssim"] = ssim(fake.float() / 255, real.float() / 255).double().cpu().numpy().reshape(-1)
        records["lpips"] = networks.lpips(fake.float() / 127.5 - 1, real.float() / 127.5 - 1).double().cpu().numpy()
    return records


def fid_of(real: np.ndarray, fake: np.ndarray, device: torch.device | None = None) -> float:
    """torchmetrics' FID of two feature sets (at least 2 samples each), computed on `device` (CPU)."""
    device = device or torch.device("cpu")
    metric = FrechetInceptionDistance(feature=PassThrough(real.shape[1])).to(device)
    metric.update(torch.as_tensor(real, dtype=torch.float64, device=device), real=True)
    metric.update(torch.as_tensor(fake, dtype=torch.float64, device=device), real=False)
    return float(metric.compute())


def kid_of(
    real: np.ndarray, fake: np.ndarray, *, subset_size: int, subsets: int, seed: int = 0, device: torch.device | None = None
) -> tuple[float, float]:
    """torchmetrics' KID (mean, std over `subsets` random subsets of min(`subset_size`, n) samples),
    with the subsets drawn from a fixed seed (on the CPU's generator: the same on any `device`)."""
    size, device = min(subset_size, len(real), len(fake)), device or torch.device("cpu")
    with warnings.catch_warnings():  # "saves all features in a buffer": these are already in memory
        warnings.simplefilter("ignore", UserWarning)
        metric = KernelInceptionDistance(feature=PassThrough(real.shape[1]), subset_size=size, subsets=subsets).to(device)
    metric.update(torch.as_tensor(real, dtype=torch.float64, device=device), real=True)
    metric.update(torch.as_tensor(fake, dtype=torch.float64, device=device), real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return float(mean), float(std)


def summarize(records: dict, *, paired: bool, kid_subset_size: int, kid_subsets: int) -> dict[str, float]:
    """The metrics of the whole set from its concatenated per-sample records."""
    real, fake = records["real_features"], records["fake_features"]
    if len(real) < 2:
        raise ValueError(f"FID and KID need at least 2 samples, got {len(real)}")
    kid, kid_std = kid_of(real, fake, subset_size=kid_subset_size, subsets=kid_subsets)
    result = {"fid": fid_of(real, fake), "kid": kid, "kid_std": kid_std}
    if paired:
        result = {"ssim": float(np.mean(records["ssim"])), "lpips": float(np.mean(records["lpips"])), **result}
    return result

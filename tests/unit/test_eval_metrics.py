"""drape.eval's metric plumbing against torchmetrics called directly on the same inputs, with
feature networks the test builds and passes by path, the way real weights are passed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchmetrics.functional.image.lpips as tm_lpips_functional
import torchmetrics.image.lpip as tm_lpip
from torch import nn
from torch.nn import functional as F
from torchmetrics.functional.image import structural_similarity_index_measure
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance

from drape.eval.features import FeatureNetworks, MissingWeights, alexnet_features, load_inception, load_lpips
from drape.eval.metrics import batch_records, kid_of, nchw, summarize


class TinyInception(nn.Module):
    """A stand-in for the TorchScript Inception with its structure and call: `forward(images in
    [0, 255], return_features)` resamples to 299×299 as the real one's code does (an affine grid,
    bilinear, border), normalises to (x - 128) / 128 and runs `layers`, which clean-fid calls
    directly on images it resized itself."""

    def __init__(self, num_features: int = 16) -> None:
        super().__init__()
        self.layers = nn.Sequential(  # rectified local filters, pooled: sees texture and blur, as Inception does
            nn.Conv2d(3, 12, 5, stride=2),
            nn.ReLU(),
            nn.Conv2d(12, 24, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(384, num_features),
        )

    def forward(self, img: torch.Tensor, return_features: bool = False) -> torch.Tensor:
        batch, channels, height, width = img.shape
        theta = torch.eye(2, 3, device=img.device)
        theta[0, 2] += theta[0, 0] / width - theta[0, 0] / 299
        theta[1, 2] += theta[1, 1] / height - theta[1, 1] / 299
        grid = F.affine_grid(theta.unsqueeze(0).repeat(batch, 1, 1), [batch, channels, 299, 299], align_corners=False)
        x = F.grid_sample(img.to(torch.float32), grid, mode="bilinear", padding_mode="border", align_corners=False)
        return self.layers((x - 128) / 128)


def write_tiny_inception(path: Path, num_features: int = 16) -> Path:
    torch.manual_seed(0)
    torch.jit.script(TinyInception(num_features)).save(str(path))
    return path


def write_alexnet_weights(path: Path) -> Path:
    """Random AlexNet features saved under torchvision's keys (features.<i>.weight/bias)."""
    torch.manual_seed(1)
    torch.save({f"features.{key}": value for key, value in alexnet_features().state_dict().items()}, path)
    return path


@pytest.fixture(scope="module")
def networks(tmp_path_factory) -> FeatureNetworks:
    root = tmp_path_factory.mktemp("weights")
    return FeatureNetworks(
        load_inception(str(write_tiny_inception(root / "inception.pt"))),
        load_lpips(str(write_alexnet_weights(root / "alexnet.pth"))),
    )


def _images(count: int, seed: int, size: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size, size, 3), dtype=np.uint8)


def test_identical_images_score_perfectly(networks):
    images = _images(6, 0)
    records = batch_records(networks, images, images.copy(), paired=True)
    metrics = summarize(records, paired=True, kid_subset_size=4, kid_subsets=10)
    assert metrics["ssim"] == pytest.approx(1.0, abs=1e-6) and metrics["lpips"] == pytest.approx(0.0, abs=1e-7)
    assert abs(metrics["fid"]) < 1e-6
    assert abs(metrics["kid"]) < 1e-4  # unbiased: the subsets of either side are drawn apart, so ~0, either sign


def test_ssim_and_lpips_match_torchmetrics(networks, monkeypatch):
    generated, reference = _images(4, 1), _images(4, 2)
    records = batch_records(networks, generated, reference, paired=True)
    fake, real = nchw(generated, torch.device("cpu")).float() / 255, nchw(reference, torch.device("cpu")).float() / 255
    expected_ssim = structural_similarity_index_measure(fake, real, data_range=1.0, reduction="none")
    assert records["ssim"] == pytest.approx(expected_ssim.double().numpy(), abs=1e-6)
    # torchmetrics' own LPIPS with the same backbone (it would fetch torchvision's; here it gets ours)
    features = nn.Sequential(*[module for block in networks.lpips.slices for module in block], nn.MaxPool2d(3, 2))
    monkeypatch.setattr(tm_lpip, "_TORCHVISION_AVAILABLE", True)
    monkeypatch.setattr(tm_lpips_functional, "_get_tv_model_features", lambda net, pretrained=False: features)
    reference_metric = tm_lpip.LearnedPerceptualImagePatchSimilarity(net_type="alex", reduction="none")
    expected = reference_metric(fake * 2 - 1, real * 2 - 1)
    assert records["lpips"] == pytest.approx(expected.double().numpy(), rel=1e-5)
    assert (records["lpips"] > 0).all()


def test_fid_and_kid_match_torchmetrics_on_the_images(networks):
    generated, reference = _images(12, 3) // 3, _images(12, 4)  # darker: another distribution
    records = batch_records(networks, generated, reference, paired=False)
    assert set(records) == {"fake_features", "real_features"}  # unpaired: no per-pair metric
    fid = FrechetInceptionDistance(feature=networks.inception)
    kid = KernelInceptionDistance(feature=networks.inception, subset_size=6, subsets=20)
    for metric in (fid, kid):
        metric.update(nchw(reference, torch.device("cpu")), real=True)
        metric.update(nchw(generated, torch.device("cpu")), real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        kid_mean, _ = kid.compute()
    ours = summarize(records, paired=False, kid_subset_size=6, kid_subsets=20)
    assert ours["fid"] == pytest.approx(float(fid.compute()), rel=1e-4) and ours["fid"] > 0
    assert ours["kid"] == pytest.approx(float(kid_mean), rel=1e-3) and ours["kid"] > 1e-3


def test_kid_subsets_are_capped_at_the_sample_count():
    rng = np.random.default_rng(0)
    real, fake = rng.normal(size=(5, 8)), rng.normal(1.0, 1.0, size=(5, 8))
    mean, std = kid_of(real, fake, subset_size=1000, subsets=10)
    assert mean > 0 and std >= 0


def test_missing_or_wrong_weights_are_named(tmp_path):
    with pytest.raises(MissingWeights, match=r"eval.inception_path .*nope.pt: no such file; download it once from https://"):
        load_inception(str(tmp_path / "nope.pt"))
    with pytest.raises(MissingWeights, match=r"eval.lpips_backbone_path is not set: .*alexnet-owt-7be5be79.pth"):
        load_lpips(None)
    torch.save({"classifier.1.weight": torch.zeros(2)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"other.pth: not AlexNet weights"):
        load_lpips(str(tmp_path / "other.pth"))
    (tmp_path / "junk.pt").write_bytes(b"not torchscript")
    with pytest.raises(ValueError, match=r"junk.pt: not a TorchScript module"):
        load_inception(str(tmp_path / "junk.pt"))

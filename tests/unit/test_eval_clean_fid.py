"""`eval.fid_resize` against clean-fid called directly, in two links that together make the chain:

1. features: the same images through clean-fid's own resizer (`make_resizer("PIL", False,
   "bicubic", (299, 299))`) and its Inception wrapper (`InceptionV3W`, clean and legacy modes)
   and through drape, with the same network file (a small TorchScript module with the real one's
   structure and its 2,048 features, which InceptionV3W assumes, saved under the real one's name
   so clean-fid finds it without downloading anything);
2. statistics: clean-fid's `frechet_distance` and `kernel_distance` against drape's FID and KID
   (torchmetrics) on the same features, of a 16-feature network of the same structure (at 2,048
   features a few dozen images would give singular covariances).

clean-fid is installed with --no-deps (Makefile): its `cleanfid.fid` imports torchvision for its
other networks and folder datasets, which drape does not install; `cleanfid_fid` loads it with a
stand-in torchvision module holding only the names its imports touch, and unloads it afterwards.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from cleanfid.inception_torchscript import InceptionV3W
from cleanfid.resize import build_resizer, make_resizer
from torch import nn

from drape.eval.features import FeatureNetworks, clean_resize, load_inception
from drape.eval.metrics import batch_records, nchw, summarize
from tests.unit.test_eval_metrics import write_tiny_inception


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("inception")
    write_tiny_inception(folder / "inception-2015-12-05.pt", num_features=2048)  # the name InceptionV3W loads
    return folder


@pytest.fixture
def cleanfid_fid(monkeypatch):
    """clean-fid's `fid` module, imported with a stand-in torchvision; unloaded afterwards."""
    inception = types.SimpleNamespace(InceptionA=nn.Module, InceptionC=nn.Module, InceptionE=nn.Module)
    stand_in = types.ModuleType("torchvision")
    stand_in.models = types.SimpleNamespace(inception=inception)  # type: ignore[attr-defined]
    before = set(sys.modules)
    monkeypatch.setitem(sys.modules, "torchvision", stand_in)
    import cleanfid.fid

    yield cleanfid.fid
    for name in set(sys.modules) - before:
        if name.startswith("cleanfid"):
            del sys.modules[name]


def _images(count: int, seed: int, height: int = 64, width: int = 48) -> np.ndarray:
    """Smooth images with edges (gradients and a block), where resampling filters differ."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    images = []
    for _ in range(count):
        a, b, c = rng.uniform(-3, 3, 3)
        base = 127 + 100 * np.sin(a * ys / height + b * xs / width + c)
        image = np.stack([base, base[::-1], 255 - base], axis=2) + rng.normal(0, 12, (height, width, 3))
        y, x = rng.integers(0, height // 2), rng.integers(0, width // 2)
        image[y : y + height // 3, x : x + width // 3] = rng.integers(0, 256, 3)
        images.append(image.clip(0, 255).astype(np.uint8))
    return np.stack(images)


@pytest.mark.parametrize("size", [(64, 48), (37, 53), (600, 450)])
def test_clean_resize_is_clean_fids_resizer(size):
    image = _images(1, 0, *size)[0]
    theirs = make_resizer("PIL", False, "bicubic", (299, 299))(image)
    assert build_resizer("clean")(image).tobytes() == theirs.tobytes()  # clean-fid's "clean" mode is that resizer
    ours = clean_resize(image)
    assert ours.shape == (299, 299, 3) and ours.dtype == np.float32
    assert ours.tobytes() == theirs.tobytes()
    assert not np.array_equal(ours, ours.round())  # float32, not re-quantised: the quantize_after=False path


def _clean_fid_features(weights_dir: Path, images: np.ndarray, mode: str) -> np.ndarray:
    """Features as clean-fid computes them: its resizer for the mode, then InceptionV3W."""
    network = InceptionV3W(str(weights_dir), download=False, resize_inside=mode == "legacy_tensorflow")
    resized = np.stack([build_resizer(mode)(image) for image in images]).astype(np.float32)
    with torch.no_grad():
        return network(torch.from_numpy(resized).permute(0, 3, 1, 2)).double().numpy()


@pytest.mark.parametrize("resize, mode", [("clean", "clean"), ("legacy", "legacy_tensorflow")])
def test_features_are_clean_fids_for_each_resize(weights_dir, resize, mode):
    images = _images(6, 1)
    ours = load_inception(str(weights_dir / "inception-2015-12-05.pt"), resize)(nchw(images, torch.device("cpu")))
    theirs = _clean_fid_features(weights_dir, images, mode)
    assert ours.shape == (6, 2048)
    np.testing.assert_allclose(ours.double().numpy(), theirs, rtol=1e-5, atol=1e-6)


def test_clean_and_legacy_features_differ(weights_dir):
    images = nchw(_images(6, 2), torch.device("cpu"))
    path = str(weights_dir / "inception-2015-12-05.pt")
    clean, legacy = (load_inception(path, resize)(images) for resize in ("clean", "legacy"))
    assert (clean - legacy).abs().max() > 1e-3


def test_fid_and_kid_are_clean_fids_on_the_same_features(tmp_path, cleanfid_fid):
    reference, generated = _images(20, 3), (_images(20, 4).astype(np.int32) * 3 // 4).astype(np.uint8)
    network = load_inception(str(write_tiny_inception(tmp_path / "inception.pt")))  # clean resize, 16 features
    records = batch_records(FeatureNetworks(network), generated, reference, paired=False)
    ours = summarize(records, paired=False, kid_subset_size=20, kid_subsets=3)
    real, fake = records["real_features"], records["fake_features"]
    fid = cleanfid_fid.frechet_distance(real.mean(0), np.cov(real, rowvar=False), fake.mean(0), np.cov(fake, rowvar=False))
    # KID on subsets of the whole set: every subset is the set itself, so clean-fid's random draws do not matter
    kid = cleanfid_fid.kernel_distance(real, fake, num_subsets=3, max_subset_size=20)
    assert ours["fid"] == pytest.approx(fid, rel=1e-4) and ours["fid"] > 1e-3
    assert ours["kid"] == pytest.approx(kid, rel=1e-4, abs=1e-7) and ours["kid"] > 1e-4

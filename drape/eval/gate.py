"""The gates' optional FID/KID check: is the candidate's image distribution worse than the baseline's?

On the control set, the candidate's outputs and the baseline's outputs are each compared with
the targets (FID, KID: `drape.eval.metrics`, torchmetrics' arithmetic). One control set is a
noisy sample of the distribution, so the decision is on a bootstrap bound: the control set is
resampled with replacement (the same rows for both models), the rise `candidate − baseline` is
computed on each resample, and the check fails only when the lower `quantile` of those rises is
above the configured margin: a regression the control set shows with confidence, not one noise
could make. Its result reads like the other checks': value, baseline, bound, threshold, verdict,
and a failure line naming all of them.

Cost: each resample computes two FIDs (eigenvalues of a features × features matrix) and two
KIDs. At Inception's 2,048 features and 512 control samples one FID takes 5.8 s and ten KID
subsets 1.0 s on one CPU thread, so 50 resamples are about 11 minutes there: the statistics run
on the GPU when there is one; `eval.fid_gate.resamples` trades the bound's precision for time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from drape.config.eval import EvalConfig
from drape.eval.features import InceptionFeatures, load_inception
from drape.eval.metrics import fid_of, kid_of, nchw


@dataclass(frozen=True)
class DistributionCheck:
    """One of fid/kid: candidate and baseline values on the control set and the bound of the rise."""

    name: str
    candidate: float
    baseline: float
    rise_bound: float  # the `quantile` of the bootstrap rise (candidate − baseline)
    max_rise: float
    quantile: float
    resamples: int
    samples: int

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.rise_bound)) and self.rise_bound <= self.max_rise

    def failures(self) -> list[str]:
        if self.passed:
            return []
        return [
            f"{self.name}: {self.candidate:.4f} vs the baseline's {self.baseline:.4f} on {self.samples} control samples; "
            f"the {self.quantile:.0%} bootstrap bound of the rise, {self.rise_bound:.4f} ({self.resamples} resamples), "
            f"is above the allowed {self.max_rise:.4f} (eval.fid_gate)"
        ]

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "failures": self.failures()}


def _features(network: InceptionFeatures, images: np.ndarray, batch_size: int = 32) -> np.ndarray:
    device = next(network.parameters(), torch.zeros(0)).device
    chunks = [network(nchw(images[i : i + batch_size], device)).double().cpu().numpy() for i in range(0, len(images), batch_size)]
    return np.concatenate(chunks)


def _metrics(real: np.ndarray, fake: np.ndarray, settings: EvalConfig, device: torch.device) -> dict[str, float]:
    kid, _ = kid_of(real, fake, subset_size=settings.kid_subset_size, subsets=min(settings.kid_subsets, 10), device=device)
    return {"fid": fid_of(real, fake, device), "kid": kid}


def distribution_checks(
    settings: EvalConfig,
    targets: np.ndarray,
    candidate: np.ndarray,
    baseline: np.ndarray,
    *,
    network: InceptionFeatures | None = None,
    seed: int = 0,
    device: torch.device | None = None,
) -> list[DistributionCheck]:
    """FID and KID of `candidate` and `baseline` outputs (uint8 (N, H, W, 3), same rows) against
    `targets`, each with its bootstrap bound; `network`: default `settings.inception_path`;
    `device`: where features and statistics are computed (default: the GPU when there is one)."""
    gate = settings.fid_gate
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    network = (network or load_inception(settings.inception_path, settings.fid_resize)).to(device)
    real, ours, theirs = (_features(network, images) for images in (targets, candidate, baseline))
    point = {"candidate": _metrics(real, ours, settings, device), "baseline": _metrics(real, theirs, settings, device)}
    rng = np.random.default_rng(seed)
    rises: dict[str, list[float]] = {"fid": [], "kid": []}
    for _ in range(gate.resamples):
        rows = rng.integers(0, len(real), len(real))
        mine, base = _metrics(real[rows], ours[rows], settings, device), _metrics(real[rows], theirs[rows], settings, device)
        for name in rises:
            rises[name].append(mine[name] - base[name])
    limits = {"fid": gate.max_fid_increase, "kid": gate.max_kid_increase}
    return [
        DistributionCheck(
            name,
            point["candidate"][name],
            point["baseline"][name],
            float(np.quantile(rises[name], gate.quantile)),
            limits[name],
            gate.quantile,
            gate.resamples,
            len(real),
        )
        for name in ("fid", "kid")
    ]

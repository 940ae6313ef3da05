"""The gates' bootstrap bound (drape/gates/verdict/report.py) is the one-sided percentile bootstrap of the
mean that `scipy.stats.bootstrap` computes: drape keeps its four vectorized lines (a fixed seed per
report, NaN for a no-face sample left out, and the exact statistic every calibrated threshold was
measured with: scipy's default BCa interval would move them), checked against scipy here."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from drape.gates.verdict.report import bootstrap_lower_bound


@pytest.mark.parametrize(("size", "quantile"), [(12, 0.05), (64, 0.05), (400, 0.05), (64, 0.2)])
def test_the_bound_is_scipys_percentile_bootstrap_of_the_mean(size, quantile):
    values = np.random.default_rng(size).beta(8, 2, size=size)
    ours = bootstrap_lower_bound(values, quantile=quantile, resamples=4000)
    theirs = stats.bootstrap(
        (values,),
        np.mean,
        n_resamples=20000,
        method="percentile",
        confidence_level=1 - quantile,
        alternative="greater",
        random_state=np.random.default_rng(1),
        vectorized=True,
    ).confidence_interval.low
    standard_error = values.std(ddof=1) / np.sqrt(size)
    assert abs(ours - theirs) < 0.15 * standard_error  # Monte Carlo error of the two draws, not a different statistic
    assert ours < values.mean()


def test_no_face_samples_are_left_out_and_the_seed_makes_it_reproducible():
    values = np.array([0.9, 0.8, np.nan, 0.85, 0.95, np.nan, 0.7])
    assert bootstrap_lower_bound(values) == bootstrap_lower_bound(values[np.isfinite(values)])
    assert bootstrap_lower_bound(values, seed=3) == bootstrap_lower_bound(values, seed=3)
    assert np.isnan(bootstrap_lower_bound([np.nan, np.nan]))

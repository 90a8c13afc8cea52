"""The correction distribution of the Barker test: built by NNLS, accurate, sampled exactly."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import kstest

from pymc_subsample.kernels import build_correction, correction_distribution, sample_correction


def test_sup_cdf_error_at_sigma_one():
    # Target 1e-5 (the paper's ridge recipe reaches about 1e-3); measured 7e-8.
    correction = correction_distribution(1.0)
    assert correction.sup_cdf_error < 1e-5
    assert np.all(correction.masses >= 0) and correction.masses.sum() == pytest.approx(1.0)
    # X_norm + X_corr is logistic: the correction has mean 0 and variance pi^2/3 - 1.
    assert correction.masses @ correction.support == pytest.approx(0.0, abs=1e-6)
    assert correction.masses @ correction.support**2 == pytest.approx(np.pi**2 / 3 - 1, abs=1e-4)


@pytest.mark.parametrize(("sigma", "bound"), [(0.5, 1e-6), (1.2, 1e-4)])
def test_other_sigmas(sigma, bound):
    assert build_correction(sigma).sup_cdf_error < bound


def test_cached_per_sigma():
    assert correction_distribution(1.0) is correction_distribution(1.0)


def test_samples_plus_gaussian_are_logistic():
    # KS test of 40,000 draws of N(0, 1) + X_corr against the logistic CDF at level 1e-3
    # (false-failure rate 0.1%); it detects a sup-CDF error of about 0.01, so it checks the
    # inverse-CDF sampler (an off-by-one in the search shifts the CDF by a grid step of 0.1,
    # a sup error near 0.025).
    correction = correction_distribution(1.0)
    rng = np.random.default_rng(5)
    draws = np.array([sample_correction(rng, correction) for _ in range(40_000)])
    draws += rng.standard_normal(draws.size)
    assert kstest(draws, expit).pvalue > 1e-3


@pytest.mark.parametrize("sigma", [0.0, -1.0, 2.0])
def test_bad_sigma(sigma):
    with pytest.raises(ValueError, match="sigma must be in"):
        build_correction(sigma)

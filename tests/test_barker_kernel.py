"""The minibatch Barker kernel: acceptance probability, exactness limits, uniformity, mutants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conjugate import GaussianMean, run_chains
from scipy.special import expit, ndtr, ndtri
from scipy.stats import kstest

from pymc_subsample.kernels import RowSampler, correction_distribution
from pymc_subsample.kernels.barker import (
    clt_error_bound,
    delta_variance,
    estimate_noise_shortfall,
    minibatch_barker_test,
)

LEVEL = 1e-3


def _model(temperature: float) -> GaussianMean:
    x = np.random.default_rng(0).normal(1.0, 1.0, size=10_000)
    return GaussianMean(x, temperature=temperature)


def barker(batch_size, temperature, error_bound=None, log_ratio_factor=1.0, sigma=1.0):
    correction = correction_distribution(sigma)

    def decide(rng, rows, sampler, prior_ratio):
        def scaled(idx):
            return log_ratio_factor * rows(idx)

        return minibatch_barker_test(
            rng, scaled, sampler, prior_ratio, batch_size, temperature, error_bound, correction
        )

    return decide


def test_delta_variance_and_clt_bound_by_hand():
    assert float(delta_variance(0.002, 1000, 4.0)) == pytest.approx(0.25)
    values = np.array([0.0, 0.0, 0.0, 4.0])  # deviations -1, -1, -1, 3; sd sqrt(3)
    z = np.array([1, 1, 1, 3]) / np.sqrt(3)
    expected = (6.4 * np.mean(z**3) + 2 * np.mean(z)) / 2
    assert clt_error_bound(values) == pytest.approx(expected)
    assert clt_error_bound(np.ones(5)) == 0.0


def _acceptance(model, theta, proposal, decide, n_tests, seed):
    rng = np.random.default_rng(seed)
    sampler = RowSampler(model.n_rows)
    rows = model.log_ratio_rows(proposal, theta)
    prior = model.log_prior_ratio(proposal, theta)
    decisions = [decide(rng, rows, sampler, prior) for _ in range(n_tests)]
    delta = rows(np.arange(model.n_rows)).sum() / model.temperature + prior
    return decisions, expit(delta)


@pytest.mark.parametrize("offset_in_sds", [-1.0, 0.5, 2.0])
def test_acceptance_frequency_is_the_barker_function(offset_in_sds):
    # At T = 1000 and batches of 100 rows, s^2 < 1 on the first batch. Over 20,000 tests the
    # acceptance frequency has standard error <= 0.0036; we allow 4.5 standard errors (false
    # failure 7e-6) plus 0.01 for the test's own error (estimated s^2 and the CLT).
    model = _model(temperature=1000.0)
    theta = model.post_mean
    proposal = theta + offset_in_sds * model.post_sd
    decisions, barker_probability = _acceptance(
        model, theta, proposal, barker(100, 1000.0), 20_000, seed=1
    )
    frequency = np.mean([d.accepted for d in decisions])
    assert all(d.variance < 1 and not d.full_data for d in decisions)
    assert np.mean([d.n_data for d in decisions]) < 300
    tolerance = 4.5 * math.sqrt(barker_probability * (1 - barker_probability) / 20_000) + 0.01
    assert abs(frequency - barker_probability) < tolerance


@pytest.mark.parametrize(("start_in_sds", "offset_in_sds"), [(0.25, 1.5), (-1.0, 3.0)])
def test_a_wider_correction_keeps_the_barker_function(start_in_sds, offset_in_sds):
    # correction_sd = 1.2: batches pass while s^2 < 1.44, X_nc ~ N(0, 1.44 - s^2) and X_corr is
    # the table for 1.2. Both moves have Barker probability about 0.18 (where the noise's scale
    # matters); s^2 spans 0.1 to 0.35 in the first and 0.5 to 1.4 in the second, so a fifth of
    # its batches pass above 1. 50,000 tests: 4.5 standard errors (0.0078, false failure 7e-6)
    # plus 0.003 for the CLT error of Gaussian rows. With X_nc's variance taken as 1 - s^2, or
    # the table for sigma = 1 under the limit 1.44, both cases are 0.019 to 0.023 off (checked).
    model = _model(temperature=1000.0)
    theta = model.post_mean + start_in_sds * model.post_sd
    proposal = theta + offset_in_sds * model.post_sd
    decisions, barker_probability = _acceptance(
        model, theta, proposal, barker(100, 1000.0, sigma=1.2), 50_000, seed=2
    )
    assert all(d.variance < 1.44 and not d.full_data for d in decisions)
    frequency = np.mean([d.accepted for d in decisions])
    tolerance = 4.5 * math.sqrt(barker_probability * (1 - barker_probability) / 50_000) + 0.003
    assert abs(frequency - barker_probability) < tolerance


def test_full_data_fallback_is_the_exact_barker_test():
    # With a batch of all N rows (T = 1) the decision uses logistic noise and is exact, so only
    # the binomial error remains (4.5 standard errors). (With smaller batches the finite-
    # population correction makes s^2 = N s_l^2 (N - b) / b fall below 1 just before N.)
    model = _model(temperature=1.0)
    theta, proposal = model.post_mean, model.post_mean + 0.7 * model.post_sd
    decisions, barker_probability = _acceptance(
        model, theta, proposal, barker(model.n_rows, 1.0), 4000, seed=2
    )
    assert all(d.full_data and d.variance == 0 and d.n_data == model.n_rows for d in decisions)
    frequency = np.mean([d.accepted for d in decisions])
    assert abs(frequency - barker_probability) < 4.5 * math.sqrt(0.25 / 4000)


def test_error_bound_grows_the_batch_until_the_clt_bound_holds():
    model = _model(temperature=1000.0)
    theta, proposal = model.post_mean, model.post_mean + model.post_sd
    with_bound, _ = _acceptance(model, theta, proposal, barker(100, 1000.0, 0.25), 50, seed=3)
    without, _ = _acceptance(model, theta, proposal, barker(100, 1000.0), 50, seed=3)
    assert all(d.clt_error <= 0.25 and d.variance < 1 for d in with_bound)
    assert all(math.isnan(d.clt_error) for d in without)
    assert np.mean([d.n_data for d in with_bound]) > 5 * np.mean([d.n_data for d in without])


@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_nonfinite_rejects(bad):
    decision = minibatch_barker_test(
        np.random.default_rng(0),
        lambda idx: np.where(idx == idx[0], bad, 0.0),
        RowSampler(1000),
        0.0,
        100,
        1.0,
        None,
        correction_distribution(1.0),
    )
    assert not decision.accepted and decision.nonfinite_proposal


def _pit_pvalue(model, ends):
    return float(kstest(ndtr((ends - model.post_mean) / model.post_sd), "uniform").pvalue)


# Exact-start uniformity (see test_austerity_kernel_statistics.py): 2000 chains, KS at level 1e-3
# (false failure 0.1%), detects an end-state variance off by about 40%.


@pytest.mark.parametrize(
    ("batch_size", "label"), [(100, "small batches, s^2 < 1"), (10_000, "full batch")]
)
def test_exact_start_uniformity(batch_size, label):
    model = _model(temperature=1000.0)
    ends, rows = run_chains(
        model, barker(batch_size, 1000.0), n_chains=2000, n_steps=30, seed=4, scale_in_sds=1.5
    )
    assert _pit_pvalue(model, ends) > LEVEL, label
    if batch_size == 100:
        assert rows < 1000


def test_halved_delta_mutant_fails_uniformity():
    model = _model(temperature=1000.0)
    ends, _ = run_chains(
        model,
        barker(100, 1000.0, log_ratio_factor=0.5),
        n_chains=2000,
        n_steps=30,
        seed=4,
        scale_in_sds=1.5,
    )
    assert _pit_pvalue(model, ends) < LEVEL


@pytest.mark.parametrize("target", [0.65, 0.8, 0.9])
@pytest.mark.parametrize("variance", [0.0, 0.3, 1.0])
def test_noise_shortfall_restores_the_target_acceptance_mean(target, variance):
    # Energy error Delta ~ N(-s0^2 / 2, s0^2) at the s0 where the exact test accepts with mean
    # `target`, estimated with N(0, variance) noise: min(1, e^Delta*) plus the shortfall
    # averages `target`. 400,000 draws of a [0, 1] statistic: standard error <= 0.0008, the
    # tolerance 0.004 is 5 of them (false failure below 1e-6 per case). Without the shortfall
    # the mean at variance 1 is 0.087 (target 0.8) below: it fails.
    rng = np.random.default_rng(11)
    s0 = -2.0 * float(ndtri(target / 2.0))
    assert 2.0 * ndtr(-s0 / 2.0) == pytest.approx(target)
    delta = rng.normal(-0.5 * s0**2, s0, 400_000) + rng.normal(0.0, math.sqrt(variance), 400_000)
    statistic = np.minimum(1.0, np.exp(np.minimum(delta, 0.0)))
    shortfall = estimate_noise_shortfall(variance, target)
    assert abs(statistic.mean() + shortfall - target) < 0.004
    assert (shortfall == 0.0) == (variance == 0.0)


def test_noise_shortfall_of_a_nonfinite_variance_is_zero():
    assert estimate_noise_shortfall(math.nan, 0.8) == 0.0
    assert estimate_noise_shortfall(math.inf, 0.8) == 0.0

"""The stochastic-gradient Langevin proposal (Korattikara et al. 2016, eq. 21-22).

Kernel checks are deterministic or have stated error rates; the exact-start test follows
``test_austerity_kernel_statistics`` (KS at level 1e-3 on 2000 chains: false failure 0.1%).
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data, linear_regression_model, linear_regression_posterior
from conjugate import (
    austerity,
    langevin,
    pit_pvalue,
    run_chains,
    standard_gaussian_mean,
    tempered_gaussian_mean_data,
)
from scipy.stats import multivariate_normal

import pymc_subsample as pms
from pymc_subsample.kernels import LangevinProposal

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}
LEVEL = 1e-3


def _gradient(q: np.ndarray) -> np.ndarray:
    # A nonlinear stand-in for a minibatch gradient: the ratio must use it at q and at q'.
    return -q + np.sin(3 * q) + np.array([0.5, -1.0, 2.0])


@pytest.mark.parametrize(
    "cov",
    [
        None,
        np.array([0.5, 2.0, 1.5]),
        np.array([[1.0, 0.3, 0.1], [0.3, 2.0, -0.4], [0.1, -0.4, 0.7]]),
    ],
    ids=["identity", "diagonal", "dense"],
)
def test_log_ratio_equals_difference_of_gaussian_log_densities(cov):
    proposal = LangevinProposal(3, cov)
    metric = np.eye(3) if cov is None else (np.diag(cov) if cov.ndim == 1 else cov)
    rng = np.random.default_rng(0)
    q = np.array([0.3, -0.2, 1.0])
    scaling = 0.7
    alpha = scaling**2
    for _ in range(5):
        q_new, log_ratio = proposal(rng, q, scaling, _gradient)
        forward = multivariate_normal(q + 0.5 * alpha * metric @ _gradient(q), alpha * metric)
        backward = multivariate_normal(
            q_new + 0.5 * alpha * metric @ _gradient(q_new), alpha * metric
        )
        assert log_ratio == pytest.approx(backward.logpdf(q) - forward.logpdf(q_new), abs=1e-10)


def test_proposal_has_the_langevin_mean_and_covariance():
    # 40,000 draws: the mean's standard error is 0.005 per coordinate of variance alpha M = 1;
    # 6 SE bounds give a false-failure rate below 1e-8; a drift missing the 1/2 would be off by
    # 0.25 (50 SE).
    cov = np.array([[1.0, 0.3, 0.1], [0.3, 2.0, -0.4], [0.1, -0.4, 0.7]])
    proposal = LangevinProposal(3, cov)
    rng = np.random.default_rng(1)
    q = np.array([0.3, -0.2, 1.0])
    draws = np.array([proposal(rng, q, 1.0, _gradient)[0] for _ in range(40_000)])
    expected_mean = q + 0.5 * cov @ _gradient(q)
    standard_error = np.sqrt(np.diag(cov) / len(draws))
    np.testing.assert_array_less(np.abs(draws.mean(0) - expected_mean), 6 * standard_error)
    np.testing.assert_allclose(np.cov(draws.T), cov, atol=0.05)


def test_nonfinite_gradient_gives_certain_rejection():
    proposal = LangevinProposal(2)
    rng = np.random.default_rng(2)

    def gradient(q):
        return np.full(2, np.nan) if q[0] > 0 else np.array([100.0, 0.0])

    _, log_ratio = proposal(rng, np.array([5.0, 0.0]), 0.5, gradient)  # NaN at q
    assert log_ratio == -np.inf
    # From q = -1 the drift of 12.5 lands near 11.5, where the gradient is NaN.
    q_new, log_ratio = proposal(rng, np.array([-1.0, 0.0]), 0.5, gradient)
    assert q_new[0] > 0
    assert log_ratio == -np.inf


@pytest.mark.parametrize(
    ("with_ratio", "invariant"),
    [
        pytest.param(True, True, id="eq22"),
        # The mutant treats the proposal as symmetric, which contracts the chain: measured
        # end-state variance 0.68 of the posterior's, KS p-value 4e-6.
        pytest.param(False, False, id="ratio-dropped-mutant"),
    ],
)
def test_exact_start_uniformity_of_austerity_langevin_at_zero_tolerance(with_ratio, invariant):
    # Minibatch gradients of 100 rows, steps of 0.5 posterior sd, exact MH test on the
    # proposal ratio of eq. 22: the posterior must stay invariant.
    model = standard_gaussian_mean()
    ends, _ = run_chains(
        model,
        austerity(0.0, 100),
        n_chains=2000,
        n_steps=60,
        seed=1,
        propose=langevin(model, 0.5, 100, with_ratio=with_ratio),
    )
    assert (pit_pvalue(model, ends) > LEVEL) == invariant


def test_austerity_langevin_matches_exact_posterior_through_pm_sample():
    # Means within 0.15 sd (>= 4.5 Monte Carlo SE at ESS > 900) and sds within 12%. At
    # temperature 1 the minibatch gradient's noise, about N / sqrt(n) per coordinate, dominates
    # the drift unless n is a sizeable share of N: with 300 of 3000 rows ESS was 170-250 per
    # 15,000 draws; with 1000 rows and a posterior-scale metric it is about 1100.
    X, y = linear_regression_data(3000, seed=8)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        step = pms.AusterityMH(
            proposal="langevin", error_tolerance=0.001, batch_size=1000, proposal_cov=sd**2
        )
        idata = pm.sample(
            draws=5000, tune=1000, chains=3, cores=1, step=step, random_seed=6, **SAMPLE
        )
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    assert np.asarray(az.ess(idata, var_names=["beta"])["beta"]).min() > 900
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.15)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.12)
    stats = idata.sample_stats
    assert np.all(stats["n_grad_rows"].values == 2000)


def test_barker_langevin_matches_tempered_posterior_through_pm_sample():
    # T = 100 as in test_barker_sampling; the Langevin drift uses the tempered gradient.
    n_rows, temperature = 20_000, 100.0
    x, mean, sd = tempered_gaussian_mean_data(n_rows, temperature, seed=3)
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("x", mu, 1.0, observed=x)
        step = pms.MinibatchBarkerMH(proposal="langevin", temperature=temperature, batch_size=100)
        idata = pm.sample(
            draws=4000, tune=1000, chains=3, cores=1, step=step, random_seed=2, **SAMPLE
        )
    draws = idata.posterior["mu"].values.ravel()
    assert np.asarray(az.ess(idata, var_names=["mu"])["mu"]).min() > 900
    assert abs(draws.mean() - mean) / sd < 0.15
    assert abs(draws.std() / sd - 1) < 0.1
    assert idata.sample_stats["n_data"].values.mean() < n_rows / 2


def test_unknown_proposal_is_refused(small_regression):
    with small_regression[0], pytest.raises(ValueError, match="proposal must be one of"):
        pms.AusterityMH(proposal="hamiltonian")

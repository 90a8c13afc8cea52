"""The independent (Laplace) proposal: its ratio, the default that picks it, and exactness.

The exactness tests compare with the exact posterior of a conjugate linear regression. An
independence sampler whose proposal is close to the posterior makes nearly independent draws,
so 4,000 draws estimate a mean to about 0.02 sd and an sd to about 1.6% (one standard error):
the tolerances below (0.1 sd, 6%) are 4-5 standard errors (false-failure rate below 1e-3 per
assertion). Dropping the proposal ratio samples the posterior times the proposal, about the
square of the posterior: sds 0.71 of the exact ones, which the sd tolerance catches.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data, linear_regression_model, linear_regression_posterior
from scipy.stats import multivariate_normal

import pymc_subsample as pms
from pymc_subsample.kernels import IndependentProposal

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def test_log_ratio_is_the_difference_of_the_gaussian_log_densities():
    rng = np.random.default_rng(0)
    mean = np.array([0.5, -1.0, 2.0])
    A = rng.normal(size=(3, 3))
    cov = A @ A.T + np.eye(3)
    proposal = IndependentProposal(mean, cov)
    density = multivariate_normal(mean, cov)
    for _ in range(5):
        q = rng.normal(size=3)
        q_new, log_ratio = proposal(rng, q, 123.0)  # scaling is ignored
        np.testing.assert_allclose(log_ratio, density.logpdf(q) - density.logpdf(q_new))
    diagonal = IndependentProposal(mean, np.array([1.0, 4.0, 9.0]))
    q_new, log_ratio = diagonal(rng, np.zeros(3), 1.0)
    density = multivariate_normal(mean, np.diag([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(log_ratio, density.logpdf(np.zeros(3)) - density.logpdf(q_new))


@pytest.fixture(scope="module")
def regression():
    X, y = linear_regression_data(20_000, seed=41)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    return X, y, mean, sd


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH])
def test_default_proposal_is_independent_and_samples_the_exact_posterior(regression, step_class):
    X, y, mean, sd = regression
    with linear_regression_model(X, y):
        step = step_class()
        idata = pm.sample(tune=500, draws=4000, chains=1, step=step, random_seed=7, **SAMPLE)
    assert step.proposal_kind == "independent" and step.laplace_spread <= 0.5
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    # Barker accepts about half of the draws (its acceptance 1 / (1 + e^-Delta) is 1/2 at
    # equal weights): its ESS is about a third of the draws, its tolerances the same.
    minimum_ess = 2500 if step_class is pms.AusterityMH else 1000
    assert float(az.ess(idata)["beta"].min()) > minimum_ess
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.1)
    np.testing.assert_array_less(
        np.abs(draws.std(0) / sd - 1), 0.06 if minimum_ess > 2000 else 0.09
    )
    assert np.all(idata.sample_stats["scaling"].values == step._initial_scaling)  # not tuned


def test_auto_is_not_independent_without_an_automatic_reference(regression):
    X, y, mean, _ = regression
    with linear_regression_model(X, y):
        given = pms.AusterityMH(reference_point={"beta": mean})  # no Laplace check was run
        covariance = pms.AusterityMH(proposal_cov=np.ones(3) * 1e-4)
        plain = pms.AusterityMH(control_variate=None)
        explicit = pms.AusterityMH(reference_point={"beta": mean}, proposal="independent")
        with pytest.raises(
            ValueError,
            match="proposal='independent' cannot be used here: it draws from the Laplace",
        ):
            pms.AusterityMH(control_variate=None, proposal="independent")
    # A compound step's case is in test_hmc_proposal.py::test_auto_picks_the_proposal.
    assert given.proposal_kind == "hmc"
    assert covariance.proposal_kind == "hmc"
    assert plain.proposal_kind == "hmc"
    assert explicit.proposal_kind == "independent"
    assert isinstance(explicit.proposal, IndependentProposal)

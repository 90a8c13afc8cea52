"""The prior ratio of the main Metropolis-Hastings step: exact value, and its weight in the target.

Until now only a hierarchical test (a hyperparameter step, whose target is all prior) saw a step
that dropped or mis-signed ``log rho(q') - log rho(q)``. Here the step samples a parameter of
the likelihood with a prior twice as informative as the 50 rows, so that without its prior the
target moves by 24 posterior sds.

Mutants checked by hand (in a copy of the package): in ``SubsampleMH.astep`` the
prior ratio dropped, negated or halved, and in ``build_oracles`` the ratio compiled as
``prior(q_old) - prior(q)``: each fails both tests.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conjugate import GaussianMean, assert_stays_at_posterior, step_end_states
from scipy.stats import halfnorm, norm

import pymc_subsample as pms


def test_prior_ratio_reaches_the_test_exactly():
    # Exact: for random-walk proposals (symmetric, log proposal ratio 0) on (mu, log sigma), the
    # ratio handed to the test kernel is log rho(q') - log rho(q) in closed form, sigma's
    # log-Jacobian included: log N(mu; 1, 0.1^2) + log HalfNormal(e^s; 2) + s. 30 proposals.
    y = np.random.default_rng(50).normal(1.0, 0.5, size=50)
    with pm.Model():
        mu = pm.Normal("mu", 1.0, 0.1)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", mu, sigma, observed=y)
        step = pms.MinibatchBarkerMH(
            batch_size=10,
            scaling=0.5,
            rng=51,
            control_variate=None,
            proposal="random_walk",
            fused=False,  # the Python path's parts are recorded below; the fused one is next
        )
    assert [var.name for var in step.vars] == ["mu", "sigma_log__"]
    proposals, ratios = [], []
    propose, decide = step.proposal_part.propose, step.test.decide

    def record_proposal(step, q_old):
        q_new, log_proposal_ratio = propose(step, q_old)
        proposals.append((q_old.copy(), q_new.copy(), log_proposal_ratio))
        return q_new, log_proposal_ratio

    def record_ratio(step, log_ratio_rows, log_prior_proposal_ratio):
        ratios.append(log_prior_proposal_ratio)
        return decide(step, log_ratio_rows, log_prior_proposal_ratio)

    step.proposal_part.propose, step.test.decide = record_proposal, record_ratio

    def log_prior(q):
        mu_value, log_sigma = q
        return (
            norm.logpdf(mu_value, 1.0, 0.1)
            + halfnorm.logpdf(np.exp(log_sigma), scale=2.0)
            + log_sigma
        )

    q = np.array([1.0, np.log(0.5)])
    for _ in range(30):
        q = step_end_states(step, q[None], 1)[0]
    expected = [log_prior(new) - log_prior(old) + ratio for old, new, ratio in proposals]
    assert all(ratio == 0.0 for _, _, ratio in proposals)
    assert np.ptp(expected) > 10  # proposals of 0.5 unconstrained units: large prior ratios
    np.testing.assert_allclose(ratios, expected, rtol=1e-9, atol=1e-9)


def test_fused_draw_reads_the_exact_log_posterior_ratio():
    # The fused draw computes the prior ratio and the rows' terms in one compiled call. With a
    # first batch of all N rows its Barker test decides on them (full_data), and its
    # delta_star is then exactly log p(q' | x) - log p(q | x), sigma's log-Jacobian included:
    # checked against the closed form at every accepted move of 60 draws.
    y = np.random.default_rng(50).normal(1.0, 0.5, size=50)
    with pm.Model():
        mu = pm.Normal("mu", 1.0, 0.1)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", mu, sigma, observed=y)
        with pytest.warns(pms.SubsampleWarning, match="every test uses all rows"):
            step = pms.MinibatchBarkerMH(
                batch_size=50, scaling=0.08, rng=51, control_variate=None, proposal="random_walk"
            )
    assert step.draw_path == "fused"

    def log_posterior(q):
        mu_value, log_sigma = q
        return (
            norm.logpdf(mu_value, 1.0, 0.1)
            + halfnorm.logpdf(np.exp(log_sigma), scale=2.0)
            + log_sigma
            + norm.logpdf(y, mu_value, np.exp(log_sigma)).sum()
        )

    from pymc.blocking import DictToArrayBijection, RaveledVars

    info = DictToArrayBijection.map(step._initial_point).point_map_info
    step.tune = False
    q = np.array([1.0, np.log(0.5)])
    moves, stars = [], []
    for _ in range(60):
        new, stats = step.astep(RaveledVars(q.copy(), info))
        assert stats[0]["full_data"]
        if stats[0]["accepted"]:
            moves.append(log_posterior(new.data) - log_posterior(q))
            stars.append(stats[0]["delta_star"])
        q = new.data
    assert len(moves) >= 5
    np.testing.assert_allclose(stars, moves, rtol=1e-9, atol=1e-9)


@pytest.fixture(scope="module")
def strong_prior() -> GaussianMean:
    # x_i ~ N(3, 1), N = 50, prior N(0, 0.1^2): posterior precision 50 + 100, mean 0.99, sd
    # 0.082; the likelihood alone is centred at 2.96 (24 posterior sds away).
    return GaussianMean(np.random.default_rng(52).normal(3.0, 1.0, size=50), prior_sd=0.1)


def test_strong_prior_exact_start_is_stationary(strong_prior):
    # 300 chains start at exact posterior draws and take 5 exact MH steps (error_tolerance=0)
    # of 1.5 posterior sds: the end states are independent exact draws (Gandy and Scott 2020).
    # Three exact tests at level 1e-5 each (false-failure rate below 3e-5): KS of their CDF
    # values, chi-square(300) of their squared z-scores (end states whose sd is off by 20% fail
    # with probability about 1/2) and their mean z-score (likewise a mean off by 0.25 sd).
    # Without the prior ratio the chains drift towards 2.96, with it halved towards 1.48, with
    # it negated away from the data (the target is improper).
    model = strong_prior
    with pm.Model():
        mu = pm.Normal("mu", 0.0, model.prior_sd)
        pm.Normal("x", mu, 1.0, observed=model.x)
        step = pms.AusterityMH(
            error_tolerance=0,
            batch_size=10,
            proposal_cov=np.array([[model.post_sd**2]]),
            scaling=1.5,
            rng=53,
        )
    assert_stays_at_posterior(step, model.post_mean, model.post_sd, seed=54)

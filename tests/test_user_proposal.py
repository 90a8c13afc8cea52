"""A proposal function of the user's (``proposal=callable``): exactness, checks, the chain's state.

The exactness test runs an asymmetric proposal (a random walk with a drift of one posterior sd
per draw) on a normal mean with known variance, whose posterior is exact and Gaussian. Its log
proposal ratio is what keeps the chain on the posterior: dropping it (checked, and asserted
below) moves the posterior mean by 1.3-1.7 sd. With 2 x 6,000 draws the drifting chain has an
ESS of about 450-550 (at least 300 asserted), so a mean is estimated to 0.06 sd and an sd to
about 4% (one standard error): the tolerances (0.3 sd, 20%) are at least 5 standard errors
(false-failure rate below 1e-5 per assertion).
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
from pymc_subsample.kernels import UserProposal

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}
N_ROWS = 5_000


def normal_mean_model():
    y = np.random.default_rng(1).normal(1.0, 2.0, size=N_ROWS)
    variance = 1.0 / (1.0 / 100.0 + N_ROWS / 4.0)  # prior N(0, 10^2), likelihood sd 2
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 2.0, observed=y)
    return model, variance * y.sum() / 4.0, np.sqrt(variance)


def drifting_walk(posterior_sd: float, with_ratio: bool = True):
    """``q' ~ N(q + sd, (scaling sd)^2)``: not symmetric, so its ratio matters."""

    def proposal(rng, q, scaling):
        spread = scaling * posterior_sd
        q_new = q + posterior_sd + spread * rng.standard_normal(q.size)
        forward = q_new - q - posterior_sd  # log N(q_new | q + sd) up to a constant
        backward = q - q_new - posterior_sd  # log N(q | q_new + sd)
        log_ratio = 0.5 * float(forward @ forward - backward @ backward) / spread**2
        return q_new, log_ratio if with_ratio else 0.0

    return proposal


def drifting_posterior(step_class, with_ratio: bool):
    model, mean, sd = normal_mean_model()
    with model:
        step = step_class(proposal=drifting_walk(sd, with_ratio))
        idata = pm.sample(step=step, tune=1_000, draws=6_000, chains=2, random_seed=5, **SAMPLE)
    draws = idata.posterior["mu"].values.ravel()
    ess = float(az.ess(idata)["mu"])
    return (draws.mean() - mean) / sd, draws.std() / sd, ess, step


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH])
def test_an_asymmetric_proposal_with_its_ratio_samples_the_posterior(step_class):
    error, sd_ratio, ess, step = drifting_posterior(step_class, with_ratio=True)
    assert step.proposal_kind == "user"
    assert ess > 300
    assert abs(error) < 0.3
    assert abs(sd_ratio - 1.0) < 0.2


def test_the_same_proposal_without_its_ratio_fails_the_check_above():
    # The power of the test above: the ratio is what it measures.
    error, _, _, _ = drifting_posterior(pms.AusterityMH, with_ratio=False)
    assert abs(error) > 0.6


def test_scaling_starts_at_one_and_is_tuned():
    model, _, sd = normal_mean_model()

    def timid_walk(rng, q, scaling):  # steps of 0.01 sd at scaling 1: nearly all accepted
        return q + 0.01 * scaling * sd * rng.standard_normal(q.size), 0.0

    with model:
        step = pms.AusterityMH(proposal=timid_walk)
        assert step.scaling == 1.0
        idata = pm.sample(step=step, tune=500, draws=10, chains=1, random_seed=2, **SAMPLE)
    assert idata.sample_stats["scaling"].values[0, 0] > 2.0  # PyMC's rule: x1.1 to x10 per interval


def test_the_chain_starts_where_pm_sample_starts_it():
    # Not at a Laplace draw near the reference point: a user's proposal may keep the chain on
    # a set (a manifold) that such a draw leaves.
    model, mean, sd = normal_mean_model()
    seen = []

    def stay(rng, q, scaling):
        seen.append(q.copy())
        return q, 0.0

    start = mean + 50.0 * sd
    with model:
        step = pms.AusterityMH(proposal=stay)
        pm.sample(step=step, tune=0, draws=3, chains=1, initvals={"mu": start}, **SAMPLE)
    assert seen[1][0] == pytest.approx(start)  # seen[0]: the check when the step was built


def test_a_nan_ratio_is_a_rejection():
    model, _, _ = normal_mean_model()
    calls = []

    def nan_after_check(rng, q, scaling):
        calls.append(1)
        return q + 0.01, 0.0 if len(calls) == 1 else float("nan")

    with model:
        step = pms.AusterityMH(proposal=nan_after_check)
        idata = pm.sample(step=step, tune=0, draws=20, chains=1, random_seed=1, **SAMPLE)
    stats = idata.sample_stats
    assert stats["nonfinite_proposal"].values.all()
    assert not stats["accepted"].values.any()
    assert np.unique(idata.posterior["mu"].values).size == 1


def test_the_proposal_cannot_change_the_chains_state():
    buffer = np.zeros(2)

    def careless(rng, q, scaling):
        buffer[:] = q + 1.0
        q[:] = np.nan  # writes into its argument
        return buffer, 0.0  # and returns a buffer it will overwrite

    proposal = UserProposal(careless, 2)
    q = np.array([1.0, 2.0])
    q_new, _ = proposal(np.random.default_rng(0), q, 1.0)
    np.testing.assert_array_equal(q, [1.0, 2.0])
    buffer[:] = -1.0
    np.testing.assert_array_equal(q_new, [2.0, 3.0])


@pytest.mark.parametrize(
    ("proposal", "error", "match"),
    [
        (lambda rng, q, s: q, TypeError, "must return a pair"),
        (lambda rng, q, s: (np.zeros(3), 0.0), ValueError, r"shape \(3,\).*shape \(1,\)"),
        (lambda rng, q, s: (q, "zero"), TypeError, "not a number"),
        (lambda rng, q, s: (q, float("nan")), ValueError, "NaN log proposal ratio"),
        (42, TypeError, "or a function"),
    ],
)
def test_a_proposal_that_returns_the_wrong_thing_is_refused_when_the_step_is_built(
    proposal, error, match
):
    model, _, _ = normal_mean_model()
    with model, pytest.raises(error, match=match):
        pms.AusterityMH(proposal=proposal)


def test_proposal_cov_with_a_proposal_function_is_refused():
    model, _, _ = normal_mean_model()
    with model, pytest.raises(ValueError, match="proposal_cov"):
        pms.MinibatchBarkerMH(proposal=lambda rng, q, s: (q, 0.0), proposal_cov=[1.0])

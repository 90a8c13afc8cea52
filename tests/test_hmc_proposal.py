"""Hamiltonian trajectories as the MH steps' proposal: the integrator, exactness, the defaults.

The exactness tests compare with the exact posterior of a conjugate linear regression with
correlated columns. Draws of a well-tuned trajectory are nearly independent, so 3,000 draws
estimate a mean to about 0.02 sd and an sd to about 1.3% (one standard error, ESS >= 1,500
asserted): the tolerances (0.12 sd, 7%) are at least 5 standard errors (false-failure rate
below 1e-4 per assertion). The first test runs a deliberately coarse leapfrog (step 1.4 on the
whitened posterior, where the energy error is large): the kinetic-energy ratio is what keeps it
exact. Checked by dropping the ratio in ``HamiltonianProposal.__call__``: the sds come out
0.79-0.82 of the exact ones and the sd tolerance fails the test.
"""

from __future__ import annotations

import math
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy.special import ndtri

import pymc_subsample as pms
from pymc_subsample.kernels import HamiltonianProposal, leapfrog
from pymc_subsample.kernels.barker import BarkerDecision
from pymc_subsample.step_methods import proposal_choice
from pymc_subsample.step_methods.acceptance_tests.barker import BarkerTest
from pymc_subsample.step_methods.proposal_parts import hamiltonian

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def correlated_regression(n_rows: int, seed: int):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n_rows, 3))
    X = np.column_stack([z[:, 0], 0.9 * z[:, 0] + 0.44 * z[:, 1], z[:, 2] * 3.0])
    y = X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=n_rows)
    precision = X.T @ X + np.eye(3) / 100.0
    cov = np.linalg.inv(precision)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y)
    return model, cov @ X.T @ y, cov


def assert_exact(idata, mean, cov, min_ess=1500):
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    sd = np.sqrt(np.diag(cov))
    assert float(az.ess(idata)["beta"].min()) > min_ess
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.12)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.07)


def test_leapfrog_is_reversible_and_conserves_energy_on_a_gaussian():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(3, 3))
    cov = A @ A.T + np.eye(3)
    precision = np.linalg.inv(cov)

    def gradient(q):
        return -precision @ q

    factor = np.linalg.cholesky(cov)
    q0, p0 = rng.normal(size=3), rng.normal(size=3)
    q1, p1, diverged = leapfrog(q0, p0, 0.1, 25, gradient, factor)
    back, p_back, _ = leapfrog(q1, -p1, 0.1, 25, gradient, factor)
    assert diverged == 0
    np.testing.assert_allclose(back, q0, atol=1e-10)
    np.testing.assert_allclose(-p_back, p0, atol=1e-10)

    def energy(q, p):
        return 0.5 * q @ precision @ q + 0.5 * p @ p

    # Whitened, the target is N(0, I) and a step of 0.1 keeps the energy to O(0.1^2).
    assert abs(energy(q1, p1) - energy(q0, p0)) < 0.01 * energy(q0, p0)


def test_a_diverging_trajectory_is_a_certain_rejection():
    proposal = HamiltonianProposal(2)
    _, log_ratio, info = proposal(
        np.random.default_rng(1), np.zeros(2), 0.5, 10, lambda q: np.exp(np.abs(q) * 50.0)
    )
    assert log_ratio == -np.inf and info.diverging and info.n_steps <= 10


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH])
def test_a_coarse_trajectory_is_corrected_to_the_exact_posterior(step_class):
    model, mean, cov = correlated_regression(1000, seed=5)
    with model:
        step = step_class(
            proposal="hmc", control_variate=None, proposal_cov=cov, scaling=1.4, batch_size=1000
        )
        idata = pm.sample(tune=0, draws=3000, chains=1, step=step, random_seed=3, **SAMPLE)
    stats = idata.sample_stats
    assert step.proposal_kind == "hmc"
    # Barker accepts at most half as often: its chain has the lower ESS.
    assert_exact(idata, mean, cov, min_ess=1500 if step_class is pms.AusterityMH else 600)
    assert np.all(stats["scaling"].values == 1.4)
    assert stats["n_steps"].values.min() >= 1 and not stats["diverging"].values.any()
    # The whole data set's gradient at each of n_steps + 1 points.
    np.testing.assert_array_equal(stats["n_grad_rows"].values, 1000 * (stats["n_steps"] + 1))
    # energy_error is H(q', p') - H(q, p): each exact test accepts with probability
    # min(1, exp(-energy_error)) (Metropolis) or 1 / (1 + exp(energy_error)) (Barker), so the
    # acceptance rate matches its mean to within 4 standard errors (about 0.035 here; the
    # wrong sign moved it by 0.11 for Barker and broke the all-accepted check for Austerity).
    energy_error = stats["energy_error"].values.ravel()
    assert np.all(np.isfinite(energy_error)) and energy_error.std() > 0.1
    if step_class is pms.AusterityMH:
        probability = np.exp(np.minimum(0.0, -energy_error))
        assert stats["accepted"].values.ravel()[energy_error <= 0].all()
    else:
        probability = 1.0 / (1.0 + np.exp(energy_error))
    assert abs(stats["accepted"].values.mean() - probability.mean()) < 0.035


def test_tuning_adapts_the_step_size_and_a_diagonal_mass():
    model, mean, cov = correlated_regression(1000, seed=6)
    with model:
        step = pms.AusterityMH(control_variate=None)  # auto: no Laplace approximation here
        idata = pm.sample(tune=1000, draws=3000, chains=1, step=step, random_seed=4, **SAMPLE)
    assert step.proposal_kind == "hmc" and step._adapt_mass
    assert_exact(idata, mean, cov)
    # The mass's variances match the posterior's to within the 25-draw-window noise (and the
    # identity it starts from is off by 1e2 to 1e4).
    variances = step.proposal.chol_factor**2
    np.testing.assert_array_less(np.abs(np.log(variances / np.diag(cov))), np.log(2.0))
    accepted = idata.sample_stats["accepted"].values.mean()
    assert 0.6 < accepted < 0.97  # dual averaging aims at 0.8


@pytest.mark.parametrize("control_variate", ["taylor1", "taylor2"])
def test_minibatch_gradient_with_a_control_variate_stays_exact(monkeypatch, control_variate):
    # 50 rows per trajectory's gradient (of 3,000), not resized during tuning: a noisy
    # gradient with taylor1, still a valid proposal; with taylor2 (exact here, below) the same
    # run checks the bookkeeping.
    monkeypatch.setattr(proposal_choice, "TRAJECTORY_GRADIENT_ROWS", 50)
    monkeypatch.setattr(hamiltonian, "TRAJECTORY_GRADIENT_ROWS", 50)
    monkeypatch.setattr(hamiltonian, "GRADIENT_CHECKPOINTS", ())
    model, mean, cov = correlated_regression(3000, seed=7)
    with model:
        step = pms.AusterityMH(proposal="hmc", control_variate=control_variate)
        idata = pm.sample(tune=500, draws=3000, chains=1, step=step, random_seed=5, **SAMPLE)
    assert step.control is not None
    assert_exact(idata, mean, cov, min_ess=1000)
    stats = idata.sample_stats
    if control_variate == "taylor1":
        # 50 rows at n_steps + 1 points and once at the reference point.
        expected = 50 * (stats["n_steps"] + 2)
    else:
        # 50 rows at each point and, for the Hessian-vector product, at the reference point.
        expected = 50 * 2 * (stats["n_steps"] + 1)
    np.testing.assert_array_equal(stats["n_grad_rows"].values, expected)


def test_second_order_gradient_estimate_is_exact_on_a_gaussian_likelihood(monkeypatch):
    # A Gaussian likelihood is quadratic in the coefficients: every row's score equals its
    # first-order expansion at the reference, so the taylor2 estimate from 50 of 3,000 rows is
    # the exact gradient at any point (to rounding), and the taylor1 one is not (the check
    # that the comparison can fail). Dropping the Hessian-vector product term breaks it.
    monkeypatch.setattr(proposal_choice, "TRAJECTORY_GRADIENT_ROWS", 50)
    monkeypatch.setattr(hamiltonian, "TRAJECTORY_GRADIENT_ROWS", 50)
    model, _, cov = correlated_regression(3000, seed=8)
    rng = np.random.default_rng(0)
    errors = {}
    for control_variate in ("taylor1", "taylor2"):
        with model:
            step = pms.AusterityMH(proposal="hmc", control_variate=control_variate)
        exact = step.oracles.gradient_on_rows(None)
        reference = step.control.proxy.reference
        points = reference + rng.multivariate_normal(np.zeros(3), 4.0 * cov, size=5)
        scale = np.linalg.norm(exact(points[0] + 10.0))  # a gradient far out, for units
        errors[control_variate] = max(
            np.linalg.norm(step.proposal_part.trajectory_gradient(step)(q) - exact(q)) / scale
            for q in points
        )
    assert errors["taylor2"] < 1e-9
    assert errors["taylor1"] > 1e-4


def test_auto_picks_the_proposal():
    rng = np.random.default_rng(3)
    group = rng.integers(0, 5, size=2000)
    y = rng.normal(rng.normal(size=5)[group], 1.0)
    with pm.Model():
        mu = pm.Normal("mu", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        effects = pm.Normal("effects", mu, sigma, shape=5)
        pm.Normal("y", effects[group], 1.0, observed=y)
        # The one-block step (given a hierarchy's effects, vars takes the group route).
        in_compound = pms.AusterityMH([effects], group_effects=False)
        hyperparameters = pms.AusterityMH([mu, sigma])
        explicit = pms.AusterityMH([effects], proposal="random_walk")
    # A compound step's conditional posterior moves: trajectories, not a fixed Laplace draw.
    assert in_compound.proposal_kind == "hmc"
    # No row reads the hyperparameters: no per-row gradients, and their target is cheap.
    assert hyperparameters.proposal_kind == "random_walk"
    assert explicit.proposal_kind == "random_walk"


def test_without_a_control_variate_the_gradient_reads_every_row():
    # At temperature 1 a minibatch gradient without a control variate is mostly noise (about
    # sqrt(N / n) times the posterior's gradient): the trajectory reads all N rows in place.
    # A tempered posterior without one keeps the random walk by default.
    model, _, _ = correlated_regression(3000, seed=8)
    with model:
        step = pms.AusterityMH(control_variate=None)
        tempered = pms.AusterityMH(temperature=10.0)
        idata = pm.sample(tune=300, draws=300, chains=1, step=step, random_seed=6, **SAMPLE)
    assert step.proposal_kind == "hmc" and tempered.proposal_kind == "random_walk"
    stats = idata.sample_stats
    np.testing.assert_array_equal(stats["n_grad_rows"].values, 3000 * (stats["n_steps"] + 1))
    assert stats["accepted"].values.mean() > 0.5


def test_small_data_cost_warning_says_subsampling_cannot_help():
    # N = 150 rows and a default batch of 100: no test reads less than two thirds of the data,
    # and the cost warning says so instead of blaming the reference point.
    model, _, _ = correlated_regression(150, seed=9)
    with model:
        step = pms.AusterityMH()
        with pytest.warns(pms.SubsampleWarning, match="cannot save much on data this small"):
            pm.sample(tune=200, draws=1000, chains=1, step=step, random_seed=7, **SAMPLE)


def test_far_warning_is_silent_where_the_search_found_the_posterior_skewed():
    # Six rows and a half-Cauchy scale: the automatic search measures the posterior far from
    # its Laplace approximation (spread > 0.5), the chain rightly goes far beyond the Gaussian
    # chi-square limit, and no warning blames the reference point for it.
    y = np.random.default_rng(1).normal(0, 1, size=6)
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        scale = pm.HalfCauchy("scale", 5)
        pm.Normal("y", mu=mu, sigma=scale, observed=y)
        step = pms.AusterityMH()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "The chain reached", pms.SubsampleWarning)
            idata = pm.sample(tune=500, draws=2000, chains=1, step=step, random_seed=1, **SAMPLE)
    assert step.laplace_spread > 0.5 and step.proposal_kind == "hmc"
    assert idata.sample_stats["reference_distance"].values.max() ** 2 > step.control.limit


def test_a_failed_search_after_set_data_falls_back_to_trajectories_with_an_adapted_mass():
    # The default independent proposal needs the Laplace approximation; if the search on new
    # data fails (simulated here), the step moves to HMC and adapts a diagonal mass itself.
    model, mean, cov = correlated_regression(1000, seed=10)
    with model:
        step = pms.AusterityMH()
        assert step.proposal_kind == "independent"
        step._make_control_variate = lambda reference_point: None  # the search "failed"
        step._rebuild_for_data()
        # A diagonal mass on these correlated coefficients mixes at about 0.4 effective draws
        # per draw: 5,000 draws keep the ESS above the 1,500 the tolerances assume.
        idata = pm.sample(tune=1000, draws=5000, chains=1, step=step, random_seed=8, **SAMPLE)
    assert step.proposal_kind == "hmc" and step._adapt_mass and step.control is None
    assert isinstance(step.proposal, HamiltonianProposal)
    assert_exact(idata, mean, cov)


def test_the_gradient_minibatch_is_sized_by_its_measured_noise():
    # 20,000 rows, 2,000 per trajectory's gradient until tuning measures its noise. With
    # taylor2 a Gaussian likelihood's remainders are zero: the smallest minibatch (100) is
    # enough. A logistic likelihood's are not: with taylor1 (first-order remainders) the
    # noise asks for more rows than with taylor2. (Sizes are deterministic given the seeds.)
    sizes = {}
    model, _, _ = correlated_regression(20_000, seed=9)
    with model:
        step = pms.AusterityMH(proposal="hmc")
        pm.sample(tune=300, draws=10, chains=1, step=step, random_seed=1, **SAMPLE)
    sizes["gaussian"] = step.proposal_part.trajectory_gradient_rows(step)
    rng = np.random.default_rng(10)
    X = rng.normal(size=(20_000, 3))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.array([0.5, -1.0, 0.3]))))
    for control_variate in ("taylor1", "taylor2"):
        with pm.Model():
            beta = pm.Normal("beta", 0.0, 1.0, shape=3)
            pm.Bernoulli("y", logit_p=X @ beta, observed=y)
            step = pms.AusterityMH(proposal="hmc", control_variate=control_variate)
            pm.sample(tune=300, draws=10, chains=1, step=step, random_seed=1, **SAMPLE)
        sizes[control_variate] = step.proposal_part.trajectory_gradient_rows(step)
    assert sizes["gaussian"] == hamiltonian.TRAJECTORY_MIN_GRADIENT_ROWS, sizes
    assert sizes["taylor1"] > sizes["taylor2"], sizes
    assert sizes["taylor1"] > hamiltonian.TRAJECTORY_MIN_GRADIENT_ROWS, sizes


def test_a_resized_minibatch_restarts_the_step_size_adaptation():
    # The step size the first 2,000-row gradients forced is no guide once the minibatch is
    # resized (tuning draws 150 and 250): dual averaging starts again there, as at a new
    # mass in Stan's windows. Without the restart its average kept every tuning draw and a
    # centred 100-group Poisson model ended tuning at step 0.009 (100 leapfrog steps) where
    # the resized minibatch alone tunes to 0.27.
    rng = np.random.default_rng(10)
    X = rng.normal(size=(20_000, 3))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.array([0.5, -1.0, 0.3]))))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
        step = pms.AusterityMH(proposal="hmc", control_variate="taylor1")
        pm.sample(tune=300, draws=10, chains=1, step=step, random_seed=1, **SAMPLE)
    part = step.proposal_part
    assert part.trajectory_gradient_rows(step) != hamiltonian.TRAJECTORY_GRADIENT_ROWS
    # Restarted at draw 150, or at 250 if the size changed again there (not at 300).
    assert part._step_size.iteration in (50, 150), part._step_size.iteration


def test_barker_tunes_the_step_size_on_its_estimates_noise_free_mean():
    # Barker's estimate stops with a variance up to the correction's sigma^2 = 1, whose noise
    # alone held min(1, exp(Delta*)) near 0.76 on average, below the 0.8 dual averaging aims
    # at: the step size fell without end (0.01 and 100 leapfrog steps on a centred 100-group
    # Poisson model, where nutpie's is 0.41). The statistic the step size is tuned on must
    # average 0.8 where the exact test's does: energy errors N(-s0^2 / 2, s0^2) with
    # 2 Phi(-s0 / 2) = 0.8, estimated with variance-1 noise. 200,000 decisions: standard
    # error below 0.0011, tolerance 0.006 (5.4 of them); uncorrected the mean is 0.713.
    rng = np.random.default_rng(2)
    s0 = -2.0 * float(ndtri(0.4))
    delta = rng.normal(-0.5 * s0**2, s0, 200_000) + rng.normal(0.0, 1.0, 200_000)
    test = BarkerTest()
    statistic = [
        test.acceptance_statistic(
            BarkerDecision(True, 100, 1, False, 1.0, math.nan, False, float(value))
        )
        for value in delta
    ]
    assert abs(np.mean(statistic) - 0.8) < 0.006

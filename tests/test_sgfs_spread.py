"""SGFS's defaults and its spread diagnostics (issue: zero configuration).

The stationary covariance predicted by :func:`stationary_covariance` is checked against a
simulated SGFS chain; the defaults against the exact posterior of a conjugate linear regression
(N = 1e5, d = 5); the two end-of-tuning warnings on the runs that need them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from scipy.stats import chi2

import pymc_subsample as pms
from pymc_subsample.kernels.sgfs import (
    sgfs_factors,
    sgfs_step,
    stationary_covariance,
    stationary_sd_ratios,
)
from pymc_subsample.step_methods.sgfs import REFERENCE_STEP_SIZE
from pymc_subsample.step_methods.sgfs_checks import ChainESS
from pymc_subsample.warnings import SubsampleWarning

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def correlated_regression(n_rows: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, d)) @ np.linalg.cholesky(0.5 * np.eye(d) + 0.5).T
    return X, X @ rng.normal(size=d) + rng.normal(size=n_rows)


def regression_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=X.shape[1])
        pm.Normal("y", X @ beta, 1.0, observed=y)
    return model


def sgfs_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, SubsampleWarning)]


def test_predicted_stationary_covariance_matches_a_simulated_chain():
    # SGFS on x_i ~ N(theta, C) (scores C^-1 (x_i - theta)) with a Fisher average a third of
    # the scores' covariance: predicted sds 1.7-1.8x the Bernstein-von Mises ones. 40,000 steps
    # at contraction a = 0.087 (about 1,800 effective draws) estimate each sd ratio to about 2%
    # (sd): 8% is 4 standard errors. Dropping the minibatch noise N^2 J / n from the
    # prediction, or gamma from M, moves the prediction by more than 30%.
    rng = np.random.default_rng(0)
    n_rows, batch, step_size = 2000, 100, 40.0
    C = np.array([[1.0, 0.6], [0.6, 2.0]])
    C_inv = np.linalg.inv(C)
    x = rng.multivariate_normal([0.5, -1.0], C, size=n_rows)
    mode = x.mean(axis=0)
    J = np.cov((x - mode) @ C_inv, rowvar=False, ddof=0)
    precision = n_rows * J
    fisher = J / 3
    predicted = stationary_covariance(fisher, J, n_rows, batch, step_size)
    factors = sgfs_factors(fisher, n_rows, batch, step_size, None)
    q, draws = mode.copy(), np.empty((40_000, 2))
    for t in range(draws.shape[0]):
        scores = (x[rng.integers(0, n_rows, size=batch)] - q) @ C_inv
        q = sgfs_step(rng, q, np.zeros(2), scores, n_rows, factors)
        draws[t] = q
    simulated = np.cov(draws[1000:], rowvar=False)
    np.testing.assert_allclose(np.sqrt(np.diag(simulated) / np.diag(predicted)), 1.0, atol=0.08)
    low, high = stationary_sd_ratios(predicted, precision)
    assert 1.6 < low < high < 1.9
    # With the Fisher average equal to the scores' covariance it is exact, at any step size.
    for eps in (1e-3, 1.0, 1e3):
        exact = stationary_covariance(J, J, n_rows, batch, eps)
        np.testing.assert_allclose(stationary_sd_ratios(exact, precision), 1.0, atol=1e-8)


def test_defaults_sample_the_exact_posterior_of_a_linear_regression_and_mix():
    # Issue 37, item 3: SGFS() with no arguments on a conjugate linear regression (N = 1e5,
    # d = 5, columns of correlation 0.5), against its exact posterior N(m, L L^T), from one
    # chain of 2,000 draws. The draws are whitened, w = L^-1 (q - m): N(0, I) for an exact
    # sampler. Near a Gaussian mode SGFS is a VAR(1) (kernels.sgfs.stationary_covariance);
    # with the defaults (the control variate, step size 2) its transition is about I / 3,
    # so w's integrated autocorrelation time is (1 + r) / (1 - r) = 2 for the means and
    # (1 + r^2) / (1 - r^2) = 1.25 for the covariance; the test allows r up to 0.43 (2.5 and
    # 1.5). Under that null:
    # - means: K |w_bar|^2 / 2.5 is at most chi-square(5), tested at its 1 - 1e-4 quantile
    #   (25.7): it detects a mean error of about 0.25 posterior sd in one direction;
    # - covariance: each of the 15 entries of w's covariance within 4.5 standard errors
    #   (sqrt(2 * 1.5 / K) on the diagonal, sqrt(1.5 / K) off it): false failure below
    #   15 * 6.8e-6 = 1e-4 (union bound); it detects an sd off by about 9% or a correlation
    #   off by 0.12.
    # False failure in all: below 2e-4. SGFS's former defaults (no control variate, step size
    # 40: about N / n = 200 steps per effective draw, r = 0.991) fail it: their 2,000 draws
    # hold about 10 effective ones (checked with the change reverted, data seeds 1 and 2:
    # K |w_bar|^2 / 2.5 = 412 and 486 against 25.7; covariance entries 13.9 and 12.5 se off).
    X, y = correlated_regression(100_000, 5, seed=1)
    precision = X.T @ X + np.eye(5) / 100.0
    exact = np.linalg.inv(precision)
    mean = exact @ X.T @ y
    with regression_model(X, y), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pms.SGFS()
        idata = pm.sample(
            tune=500, draws=2000, chains=1, cores=1, step=step, random_seed=3, **SAMPLE
        )
    assert sgfs_warnings(caught) == []
    draws = idata.posterior["beta"].values.reshape(-1, 5)
    whitened = np.linalg.solve(np.linalg.cholesky(exact), (draws - mean).T).T
    K = whitened.shape[0]
    assert K * np.sum(whitened.mean(axis=0) ** 2) / 2.5 < chi2.isf(1e-4, 5)
    se = np.sqrt(1.5 / K) * np.where(np.eye(5) == 1, np.sqrt(2.0), 1.0)
    z = (np.cov(whitened, rowvar=False) - np.eye(5)) / se
    assert np.abs(z[np.triu_indices(5)]).max() < 4.5, z
    low, high = step.predicted_sd_ratios
    assert 0.95 < low <= high < 1.05


def test_low_ess_warning_fires_on_a_slow_run_and_not_on_a_good_one(small_correlated):
    # 1,000 draws (PyMC 5 checks every 1,000 draws; PyMC 6 at the last) on N = 20,000 rows.
    # Without the control variate at batch 100 SGFS needs about N / n = 200 steps per
    # effective draw: about 5 in the run, far below the warning's 100. With the defaults
    # (control variate, about one per two steps) about 500: silent.
    X, y = small_correlated
    runs = {}
    for name, kwargs in {"slow": {"control_variate": None}, "good": {}}.items():
        with regression_model(X, y), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step = pms.SGFS(batch_size=100, **kwargs)
            pm.sample(tune=300, draws=1000, chains=1, step=step, random_seed=1, **SAMPLE)
        runs[name] = (sgfs_warnings(caught), step._ess.ess(), caught)
    slow, slow_ess, caught = runs["slow"]
    assert slow_ess < 50
    assert len(slow) == 1 and "effective sample size of only" in slow[0]
    assert "control_variate='taylor1'" in slow[0] and "draws" in slow[0]
    assert [w.filename for w in caught if issubclass(w.category, SubsampleWarning)] == [__file__]
    good, good_ess, _ = runs["good"]
    assert good == [] and good_ess > 200


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_low_ess_warning_reaches_the_user_from_worker_processes(small_correlated):
    # Two chains in two worker processes, each too slow: one warning, relayed in the draws'
    # 'warning' stat (warning_relay), once per run.
    X, y = small_correlated
    with regression_model(X, y), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pms.SGFS(batch_size=100, control_variate=None)
        pm.sample(tune=100, draws=1000, chains=2, cores=2, step=step, random_seed=2, **SAMPLE)
    messages = [m for m in sgfs_warnings(caught) if "effective sample size" in m]
    assert len(messages) == 1


def test_chain_ess_estimates_an_autoregression():
    # AR(1) with r = 0.9 in one coordinate, white noise in the other: ESS n (1 - r) / (1 + r)
    # = 1,053 of 20,000 (the estimate's relative sd is about 3% here), the smaller of the two.
    rng = np.random.default_rng(0)
    monitor = ChainESS()
    monitor.reset(None)
    x = 100.0
    for _ in range(20_000):
        x = 100.0 + 0.9 * (x - 100.0) + rng.normal()
        monitor.record(np.array([x, rng.normal()]))
    assert monitor.ess() == pytest.approx(20_000 * 0.1 / 1.9, rel=0.15)


@pytest.fixture(scope="module")
def small_correlated():
    return correlated_regression(20_000, 4, seed=2)


def test_far_start_says_tuning_ended_far_from_the_mode(small_correlated):
    # start="initial" at the model's initial point (beta = 0, hundreds of posterior sds away)
    # with step size 1: after 300 tuning steps the chain is still approaching the mode.
    X, y = small_correlated
    with regression_model(X, y), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.sample(
            tune=300,
            draws=10,
            chains=1,
            step=pms.SGFS(start="initial", batch_size=200),
            random_seed=1,
            **SAMPLE,
        )
    # The 10 draws also give the low-ESS warning (PyMC 6); the tuning check gives one.
    messages = [m for m in sgfs_warnings(caught) if "effective sample size" not in m]
    assert len(messages) == 1
    assert "had not reached its stationary distribution" in messages[0]
    assert "start='reference'" in messages[0]
    assert caught[0].filename == __file__


def test_diagonal_fisher_on_correlated_scores_warns_with_the_step_size_that_fixes_it(
    small_correlated,
):
    # SGFS-d's diagonal Fisher average misses the columns' correlation 0.5: predicted sds off
    # by more than 10%, and the warning names the step size that brings them within 10%.
    X, y = small_correlated
    with regression_model(X, y), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pms.SGFS(fisher="diagonal", batch_size=200)
        pm.sample(tune=300, draws=10, chains=1, step=step, random_seed=1, **SAMPLE)
    assert not step.control  # SGFS-d keeps the paper's plain gradient
    messages = [m for m in sgfs_warnings(caught) if "effective sample size" not in m]
    assert len(messages) == 1 and "fisher='full'" in messages[0]
    low, high = step.predicted_sd_ratios
    assert high > 1.1 or low < 1 / 1.1
    suggested = float(messages[0].split("step_size=")[1].split(" ")[0])
    assert 0 < suggested < REFERENCE_STEP_SIZE
    step.step_size = suggested
    scores = X.T @ X / X.shape[0]  # unit noise: the scores' covariance is about X^T X / N
    predicted = stationary_covariance(
        step.fisher,
        scores,
        step.n_rows,
        step.batch_size,
        suggested,
        step.preconditioner,
        step._posterior_precision(scores),
    )
    fixed = stationary_sd_ratios(predicted, 20_000 * scores)
    assert 1 / 1.1 - 1e-3 <= fixed[0] and fixed[1] <= 1.1 + 1e-3

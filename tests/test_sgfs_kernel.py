"""SGFS kernel: the update against hand-computed numbers, and its stationary covariance."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_subsample.kernels import sgfs
from pymc_subsample.kernels.sgfs import (
    empirical_fisher,
    sgfs_factors,
    sgfs_gamma,
    sgfs_precision,
    sgfs_step,
    sgfs_update,
    update_fisher_average,
)


def test_update_by_hand_one_dimension():
    # N = 10, n = 2: gamma = 6; I_hat = 2, B = gamma N I_hat = 120, eps = 1:
    # M = 6 * 10 * 2 + 4 * 120 / 1 = 600; theta' = 1 + 2 (-1 + 10 * 2 + 0.3) / 600.
    assert sgfs_gamma(10, 2) == 6.0
    precision = sgfs_precision(np.array([[2.0]]), 6.0, 10, 1.0, np.array([[120.0]]))
    assert precision[0, 0] == 600.0
    q = sgfs_update(np.array([1.0]), np.array([-1.0]), np.array([20.0]), precision, np.array([0.3]))
    assert q[0] == pytest.approx(1 + 2 * 19.3 / 600)


def test_update_by_hand_two_dimensions():
    fisher = np.array([[2.0, 0.5], [0.5, 1.0]])
    preconditioner = np.eye(2)
    precision = sgfs_precision(fisher, 3.0, 100, 0.5, preconditioner)
    np.testing.assert_allclose(precision, 300 * fisher + 8 * np.eye(2))
    force = np.array([-1.0, 2.0]) + np.array([4.0, -3.0]) + np.array([0.1, 0.2])
    expected = np.array([1.0, -1.0]) + 2 * np.linalg.solve(precision, force)
    got = sgfs_update(
        np.array([1.0, -1.0]),
        np.array([-1.0, 2.0]),
        np.array([4.0, -3.0]),
        precision,
        np.array([0.1, 0.2]),
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    diagonal = sgfs_update(
        np.zeros(2), np.zeros(2), np.array([4.0, -3.0]), np.diag(precision), np.zeros(2)
    )
    np.testing.assert_allclose(diagonal, 2 * np.array([4.0, -3.0]) / np.diag(precision))


def test_empirical_fisher_and_online_average():
    scores = np.array([[1.0, 2.0], [3.0, 0.0], [2.0, 1.0]])
    np.testing.assert_allclose(empirical_fisher(scores, diagonal=False), np.cov(scores.T))
    np.testing.assert_allclose(empirical_fisher(scores, diagonal=True), scores.var(0, ddof=1))
    first = update_fisher_average(None, np.array([4.0]), 1)
    assert update_fisher_average(first, np.array([1.0]), 2)[0] == 2.5  # kappa = 1/2
    assert update_fisher_average(np.array([2.5]), np.array([1.0]), 3)[0] == pytest.approx(2.0)


def _gaussian_chain(n_steps, seed, diagonal=False, step_size=100.0):
    """SGFS on x_i ~ N(theta, S) in 2-D with prior N(0, 100 I); returns draws and the posterior."""
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, 0.6], [0.6, 2.0]])
    precision_x = np.linalg.inv(cov)
    x = rng.multivariate_normal([1.0, -1.0], cov, size=2000)
    post_cov = np.linalg.inv(2000 * precision_x + np.eye(2) / 100)
    post_mean = post_cov @ (precision_x @ x.sum(0))
    theta, fisher = post_mean.copy(), None
    draws = np.empty((n_steps, 2))
    for t in range(1, n_steps + 1):
        batch = x[rng.integers(0, 2000, size=200)]  # i.i.d. minibatch, as gamma assumes
        scores = (batch - theta) @ precision_x  # g_i = S^-1 (x_i - theta)
        fisher = update_fisher_average(fisher, empirical_fisher(scores, diagonal), t)
        factors = sgfs_factors(fisher, 2000, batch.shape[0], step_size, None)
        theta = sgfs_step(rng, theta, -theta / 100, scores, 2000, factors)
        draws[t - 1] = theta
    return draws[n_steps // 5 :], post_mean, post_cov


def test_large_step_samples_the_gaussian_posterior():
    # Bernstein-von Mises regime: with gamma = (N + n) / n the stationary covariance equals the
    # posterior's (N = 2000, n = 200, eps = 100, the exact Fisher estimated online). Over 4000
    # retained draws with autocorrelation time ~3 the variances carry ~4% Monte Carlo error:
    # 15% is about 3.5 standard errors.
    draws, post_mean, post_cov = _gaussian_chain(5000, seed=1)
    sample_cov = np.cov(draws.T)
    np.testing.assert_allclose(np.diag(sample_cov) / np.diag(post_cov), 1.0, atol=0.15)
    correlation = sample_cov[0, 1] / np.sqrt(sample_cov[0, 0] * sample_cov[1, 1])
    exact_correlation = post_cov[0, 1] / np.sqrt(post_cov[0, 0] * post_cov[1, 1])
    assert abs(correlation - exact_correlation) < 0.1
    assert np.all(np.abs(draws.mean(0) - post_mean) < 0.2 * np.sqrt(np.diag(post_cov)))


def test_without_gamma_the_covariance_is_wrong(monkeypatch):
    # The mutant of PyMC3's removed SGFS family: gamma = 1 ignores the minibatch noise.
    monkeypatch.setattr(sgfs, "sgfs_gamma", lambda n_rows, batch_size: 1.0)
    draws, _, post_cov = _gaussian_chain(2000, seed=1)
    ratio = np.diag(np.cov(draws.T)) / np.diag(post_cov)
    assert not np.all(np.abs(ratio - 1.0) < 0.15)

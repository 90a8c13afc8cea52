"""SGFS injected noise eta ~ N(0, 4 B / eps) (Ahn et al. 2012, eq. 11), diagonal and full.

The factor that ``sgfs_factors`` returns is checked against the closed form, and the updates
``sgfs_step`` draws from one state are checked against their exact Gaussian law
``N(q + 2 M^-1 (grad log prior + N g_bar), 4 M^-1 (4 B / eps) M^-1)``.

Mutants checked by hand (in a copy of the package): a diagonal noise factor
``sqrt(B / eps)`` or ``4 B / eps`` for ``sqrt(4 B / eps)``, and a diagonal noise that reuses
one standard normal for every coordinate (``noise_factor * z[0]``), each fail here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.stats import chi2, norm

from pymc_subsample.kernels.sgfs import sgfs_factors, sgfs_gamma, sgfs_step

N_ROWS, BATCH = 1000, 100
FISHER = np.array([[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]])


def _preconditioner(kind: str, diagonal: bool) -> np.ndarray | None:
    if kind == "default":
        return None
    full = np.array([[3.0, 1.0, 0.5], [1.0, 2.0, 0.0], [0.5, 0.0, 4.0]])
    return np.diag(full).copy() if diagonal else full


def _case(diagonal: bool, kind: str, step_size: float) -> tuple[np.ndarray, Any, np.ndarray]:
    """One case's Fisher information, its SGFS factors, and the preconditioner B they use."""
    fisher = np.diag(FISHER).copy() if diagonal else FISHER
    given = _preconditioner(kind, diagonal)
    factors = sgfs_factors(fisher, N_ROWS, BATCH, step_size, given)
    preconditioner = sgfs_gamma(N_ROWS, BATCH) * N_ROWS * fisher if given is None else given
    return fisher, factors, preconditioner


@pytest.mark.parametrize("diagonal", [True, False])
@pytest.mark.parametrize("kind", ["default", "given"])
def test_factors_match_closed_form(diagonal, kind):
    # Exact: F F^T = 4 B / eps with B = gamma N I_hat by default (gamma = (N + n) / n = 11),
    # and M = gamma N I_hat + 4 B / eps; diagonal SGFS keeps the diagonals of both.
    step_size = 0.5
    fisher, factors, preconditioner = _case(diagonal, kind, step_size)
    gamma = sgfs_gamma(N_ROWS, BATCH)
    assert gamma == 11.0
    noise_cov = 4.0 * preconditioner / step_size
    precision = gamma * N_ROWS * fisher + noise_cov
    if diagonal:
        assert factors.noise_factor.shape == (3,)
        np.testing.assert_allclose(factors.noise_factor**2, noise_cov, rtol=1e-12)
        np.testing.assert_allclose(factors.precision_factor, precision, rtol=1e-12)
        assert factors.condition_number == pytest.approx(precision.max() / precision.min())
    else:
        noise = factors.noise_factor
        np.testing.assert_allclose(noise @ noise.T, noise_cov, rtol=1e-12, atol=1e-12)
        chol, lower = factors.precision_factor
        chol = np.tril(chol) if lower else np.triu(chol).T
        np.testing.assert_allclose(chol @ chol.T, precision, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize(
    ("diagonal", "kind"), [(True, "default"), (True, "given"), (False, "given")]
)
def test_one_update_has_the_exact_gaussian_law(diagonal, kind):
    # 10,000 updates from one state (same scores, new noise each time), whitened with the exact
    # mean and covariance of the update, must be i.i.d. N(0, I_3). Statistics, each exact or
    # nearly so: for each coordinate the sum of squares ~ chi-square(10,000) (two-sided) and the
    # sum ~ N(0, 10,000); for each pair the mean product ~ N(0, 1 / 10,000). Each of the 9 is
    # tested at level 1e-7 (two-sided, 5.3 standard errors): false failure below 1e-6. A
    # whitened variance has a standard error of 1.4%, so a noise sd off by 3.8% fails with
    # probability 1/2 and one off by 6% almost surely; likewise a correlation of 0.053 between
    # whitened coordinates, or a mean off by 0.053 noise sds.
    step_size = 0.5
    fisher, factors, preconditioner = _case(diagonal, kind, step_size)
    gamma = sgfs_gamma(N_ROWS, BATCH)
    if diagonal:
        preconditioner, fisher = np.diag(preconditioner), np.diag(fisher)
    precision = gamma * N_ROWS * fisher + 4.0 * preconditioner / step_size
    inverse = np.linalg.inv(precision)
    q = np.array([0.3, -1.0, 2.0])
    prior_grad = np.array([-0.1, 0.2, 0.05])
    scores = np.random.default_rng(30).normal(size=(BATCH, 3))
    mean = q + 2 * inverse @ (prior_grad + N_ROWS * scores.mean(axis=0))
    covariance = 4 * inverse @ (4.0 * preconditioner / step_size) @ inverse
    rng = np.random.default_rng(31)
    n_draws = 10_000
    draws = np.array(
        [sgfs_step(rng, q, prior_grad, scores, N_ROWS, factors) for _ in range(n_draws)]
    )
    white = np.linalg.solve(np.linalg.cholesky(covariance), (draws - mean).T).T
    level = 1e-7
    squares = np.sum(white**2, axis=0)
    low, high = chi2.ppf(level / 2, n_draws), chi2.isf(level / 2, n_draws)
    assert np.all((low < squares) & (squares < high)), (
        f"whitened variances {squares / n_draws}, allowed ({low / n_draws:.4f}, "
        f"{high / n_draws:.4f})"
    )
    limit = norm.isf(level / 2)
    mean_z = white.sum(axis=0) / np.sqrt(n_draws)
    assert np.all(np.abs(mean_z) < limit), f"whitened mean z = {mean_z}"
    pairs = [(0, 1), (0, 2), (1, 2)]
    pair_z = np.array([white[:, i] @ white[:, j] / np.sqrt(n_draws) for i, j in pairs])
    assert np.all(np.abs(pair_z) < limit), f"whitened correlations z = {pair_z} for {pairs}"

"""Stochastic Gradient Fisher Scoring (Ahn, Korattikara and Welling 2012, Algorithm 1).

One step, with n rows drawn without replacement, scores ``g_i = d log p(x_i | theta) / d theta``
and their batch mean ``g_bar``:

    gamma   = (N + n) / n                                         (eq. 8)
    V       = empirical covariance of the n scores                (section 2)
    I_hat_t = (1 - kappa_t) I_hat_{t-1} + kappa_t V,  kappa_t = 1/t   (eq. 12)
    M       = gamma N I_hat_t + 4 B / eps
    theta'  = theta + 2 M^{-1} (grad log prior + N g_bar + eta),  eta ~ N(0, 4 B / eps)   (eq. 11)

``B`` is the preconditioner; by default ``gamma N I_hat_t`` (the paper recommends B
proportional to I_N). ``fisher="diagonal"`` (SGFS-d) keeps only the diagonal of ``I_hat`` (and
of B). M is factorised by Cholesky; no inverse is formed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.linalg import cho_factor, cho_solve

__all__ = [
    "SGFSStep",
    "empirical_fisher",
    "sgfs_gamma",
    "sgfs_precision",
    "sgfs_step",
    "sgfs_update",
    "update_fisher_average",
]


class SGFSStep(NamedTuple):
    """The new point and the condition number of M."""

    q: np.ndarray
    condition_number: float


def sgfs_gamma(n_rows: int, batch_size: int) -> float:
    """``gamma = (N + n) / n`` (Ahn et al., eq. 8; PyMC3's removed SGFS used (n + N) / N)."""
    return (n_rows + batch_size) / batch_size


def empirical_fisher(scores: np.ndarray, diagonal: bool) -> np.ndarray:
    """Empirical covariance of the scores (divisor n - 1): a (d, d) matrix, or its diagonal."""
    if diagonal:
        return scores.var(axis=0, ddof=1)
    return np.atleast_2d(np.cov(scores, rowvar=False, ddof=1))


def update_fisher_average(average: np.ndarray | None, fisher: np.ndarray, count: int) -> np.ndarray:
    """Online average with ``kappa_t = 1 / t`` (eq. 12); ``count`` is t, starting at 1."""
    if average is None or count == 1:
        return fisher
    kappa = 1.0 / count
    return (1.0 - kappa) * average + kappa * fisher


def sgfs_precision(
    fisher: np.ndarray, gamma: float, n_rows: int, step_size: float, preconditioner: np.ndarray
) -> np.ndarray:
    """``M = gamma N I_hat + 4 B / eps`` (Algorithm 1, line 9), full or diagonal like ``fisher``."""
    return gamma * n_rows * fisher + 4.0 * preconditioner / step_size


def sgfs_update(
    q: np.ndarray,
    prior_grad: np.ndarray,
    score_sum: np.ndarray,
    precision: np.ndarray,
    noise: np.ndarray,
) -> np.ndarray:
    """``q + 2 M^{-1} (grad log prior + N g_bar + eta)`` for a given noise ``eta``.

    ``score_sum`` is ``N g_bar``. Solved by Cholesky for a full M, elementwise for a diagonal.

    Examples
    --------
    >>> float(sgfs_update(np.array([1.0]), np.array([-1.0]), np.array([3.0]), np.array([4.0]),
    ...                   np.array([0.5]))[0])  # 1 + 2 * (-1 + 3 + 0.5) / 4
    2.25
    """
    force = prior_grad + score_sum + noise
    if precision.ndim == 1:
        return q + 2.0 * force / precision
    return q + 2.0 * cho_solve(cho_factor(precision, lower=True), force)


def _preconditioner_noise(
    rng: np.random.Generator, preconditioner: np.ndarray, step_size: float
) -> np.ndarray:
    """Draw ``eta ~ N(0, 4 B / eps)``."""
    z = rng.standard_normal(preconditioner.shape[0])
    if preconditioner.ndim == 1:
        return np.sqrt(4.0 * preconditioner / step_size) * z
    return np.sqrt(4.0 / step_size) * (np.linalg.cholesky(preconditioner) @ z)


def sgfs_step(
    rng: np.random.Generator,
    q: np.ndarray,
    prior_grad: np.ndarray,
    scores: np.ndarray,
    n_rows: int,
    fisher: np.ndarray,
    step_size: float,
    preconditioner: np.ndarray | None,
) -> SGFSStep:
    """One SGFS update from the batch's scores, with the given Fisher average.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the injected noise ``eta``.
    q, prior_grad : ndarray
        Current point and the gradient of the log prior there.
    scores : ndarray
        (n, d) per-row gradients on the batch.
    n_rows : int
        N.
    fisher : ndarray
        Current ``I_hat`` (d, d), or its diagonal (d,) for SGFS-d.
    step_size : float
        The paper's epsilon.
    preconditioner : ndarray or None
        B, of the same shape as ``fisher``; None for the default ``gamma N I_hat``.

    Returns
    -------
    SGFSStep
    """
    gamma = sgfs_gamma(n_rows, scores.shape[0])
    if preconditioner is None:
        preconditioner = gamma * n_rows * fisher
    precision = sgfs_precision(fisher, gamma, n_rows, step_size, preconditioner)
    noise = _preconditioner_noise(rng, preconditioner, step_size)
    score_sum = n_rows * scores.mean(axis=0)
    q_new = sgfs_update(q, prior_grad, score_sum, precision, noise)
    return SGFSStep(q_new, _condition_number(precision))


def _condition_number(precision: np.ndarray) -> float:
    eigenvalues = precision if precision.ndim == 1 else np.linalg.eigvalsh(precision)
    return float(eigenvalues.max() / eigenvalues.min())

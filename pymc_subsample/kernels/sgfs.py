"""Stochastic Gradient Fisher Scoring (Ahn, Korattikara and Welling 2012, Algorithm 1).

One step, with n rows drawn uniformly with replacement, scores
``g_i = d log p(x_i | theta) / d theta`` and their batch mean ``g_bar``:

    gamma   = (N + n) / n                                         (eq. 8)
    V       = empirical covariance of the n scores                (section 2)
    I_hat_t = (1 - kappa_t) I_hat_{t-1} + kappa_t V,  kappa_t = 1/t   (eq. 12)
    M       = gamma N I_hat_t + 4 B / eps
    theta'  = theta + 2 M^{-1} (grad log prior + N g_bar + eta),  eta ~ N(0, 4 B / eps)   (eq. 11)

``B`` is the preconditioner; by default ``gamma N I_hat_t`` (the paper recommends B
proportional to I_N). ``fisher="diagonal"`` (SGFS-d) keeps only the diagonal of ``I_hat`` (and
of B). M is factorised by Cholesky, once per Fisher average and step size
(``sgfs_factors``); no inverse is formed.

**With a control variate.** ``gamma N I_hat = N I_hat + (N^2 / n) I_hat`` is the posterior
precision plus the covariance of the minibatch gradient's noise (eqs. 5-8: the paper's
``Q = eps C - (eps^2 / 4) gamma C I_N C``). If the gradient is estimated with the first-order
control variate ``sum_i g_i(q*) + (N / n) sum_batch (g_i(q) - g_i(q*))`` instead, its noise is
``(N^2 / n) V`` with ``V`` the covariance of the differences, and eq. 8's derivation gives
``M = N I_hat + (N^2 / n) V_hat + 4 B / eps`` (``noise=V_hat`` below). Near the mode ``V`` is
of order ``d / N`` times ``I``, so the gain ``2 M^{-1}`` is no longer capped at ``2 / (gamma N
I_hat)``: without it the chain contracts by at most ``2 / gamma`` per step and makes at most
``n / N`` effective draws per step, whatever B and eps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_discrete_lyapunov

__all__ = [
    "PolynomialStepSize",
    "SGFSFactors",
    "curvature_and_noise",
    "empirical_fisher",
    "sgfs_gamma",
    "sgfs_factors",
    "sgfs_precision",
    "sgfs_step",
    "sgfs_update",
    "largest_step_size_within",
    "stationary_covariance",
    "stationary_sd_ratios",
    "update_fisher_average",
]


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
    factor = precision if precision.ndim == 1 else cho_factor(precision, lower=True)
    return _move(q, prior_grad + score_sum + noise, factor)


def _move(
    q: np.ndarray, force: np.ndarray, precision_factor: np.ndarray | tuple[np.ndarray, bool]
) -> np.ndarray:
    # q + 2 M^{-1} force, with M given by its diagonal or its Cholesky factor (cho_factor).
    if isinstance(precision_factor, np.ndarray):
        return q + 2.0 * force / precision_factor
    return q + 2.0 * cho_solve(precision_factor, force)


class SGFSFactors(NamedTuple):
    """What one Fisher average and step size fix for every step: factorisations and condition."""

    precision_factor: np.ndarray | tuple[np.ndarray, bool]
    noise_factor: np.ndarray
    condition_number: float


def curvature_and_noise(
    fisher: np.ndarray, n_rows: int, batch_size: int, noise: np.ndarray | None = None
) -> np.ndarray:
    """``N I_hat + (N^2 / n) V_hat``: M at ``eps -> oo``; ``gamma N I_hat`` when ``V_hat = I_hat``.

    ``noise`` is ``V_hat``, the covariance per row of what the minibatch averages (default
    ``I_hat``: the scores themselves, eq. 8); the control variate's differences otherwise.

    Examples
    --------
    >>> float(curvature_and_noise(np.array([2.0]), 10, 2)[0])  # gamma N I_hat = 6 * 10 * 2
    120.0
    """
    if noise is None:
        return sgfs_gamma(n_rows, batch_size) * n_rows * fisher
    return n_rows * fisher + (n_rows**2 / batch_size) * noise


def sgfs_factors(
    fisher: np.ndarray,
    n_rows: int,
    batch_size: int,
    step_size: float,
    preconditioner: np.ndarray | None,
    noise: np.ndarray | None = None,
) -> SGFSFactors:
    """Factorise ``M`` and ``B`` once for a given ``I_hat`` and step size.

    Parameters
    ----------
    fisher : ndarray
        Current ``I_hat`` (d, d), or its diagonal (d,) for SGFS-d.
    n_rows, batch_size : int
        N and n.
    step_size : float
        The paper's epsilon.
    preconditioner : ndarray or None
        B, of the same shape as ``fisher``; None for the default
        :func:`curvature_and_noise` (``gamma N I_hat`` without ``noise``).
    noise : ndarray, optional
        ``V_hat``, shaped like ``fisher``: the covariance per row of the control variate's
        differences. Default ``I_hat`` (no control variate: the paper's ``M``).

    Returns
    -------
    SGFSFactors
        The Cholesky factor of M (or M's diagonal), the factor ``F`` with
        ``F F^T = 4 B / eps`` (or its diagonal) and M's condition number.

    Raises
    ------
    numpy.linalg.LinAlgError
        If M or B is not positive definite.

    """
    limit = curvature_and_noise(fisher, n_rows, batch_size, noise)
    if preconditioner is None:
        preconditioner = limit
    precision: np.ndarray = limit + 4.0 * preconditioner / step_size  # Algorithm 1, line 9
    if precision.ndim == 1:
        if not np.all(precision > 0):
            raise np.linalg.LinAlgError("M has a non-positive diagonal entry.")
        return SGFSFactors(
            precision,
            np.sqrt(4.0 * preconditioner / step_size),
            float(precision.max() / precision.min()),
        )
    eigenvalues = np.linalg.eigvalsh(precision)
    return SGFSFactors(
        cho_factor(precision, lower=True),
        np.sqrt(4.0 / step_size) * np.linalg.cholesky(preconditioner),
        float(eigenvalues.max() / eigenvalues.min()),
    )


def sgfs_step(
    rng: np.random.Generator,
    q: np.ndarray,
    prior_grad: np.ndarray,
    scores: np.ndarray,
    n_rows: int,
    factors: SGFSFactors,
    offset: np.ndarray | None = None,
) -> np.ndarray:
    """One SGFS update (eq. 11) from the batch's scores, with noise ``eta ~ N(0, 4 B / eps)``.

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
    factors : SGFSFactors
        From :func:`sgfs_factors` for the current ``I_hat`` and step size.
    offset : ndarray, optional
        Added to ``N g_bar``: with the control variate, ``scores`` are the differences
        ``g_i(q) - g_i(q*)`` and ``offset`` is ``sum_i g_i(q*)`` over all N rows.

    Returns
    -------
    ndarray
        The new point; same as :func:`sgfs_update` with ``M`` and this noise.

    """
    z = rng.standard_normal(q.shape[0])
    noise_factor = factors.noise_factor
    noise = noise_factor * z if noise_factor.ndim == 1 else noise_factor @ z
    force = prior_grad + n_rows * scores.mean(axis=0) + noise
    if offset is not None:
        force = force + offset
    return _move(q, force, factors.precision_factor)


def stationary_covariance(
    fisher: np.ndarray,
    score_covariance: np.ndarray,
    n_rows: int,
    batch_size: int,
    step_size: float,
    preconditioner: np.ndarray | None = None,
    precision: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    noise_covariance: np.ndarray | None = None,
) -> np.ndarray:
    """Stationary covariance of SGFS near a Gaussian mode, for a given ``I_hat``.

    Near the mode the minibatch term is ``N g_bar ~ N(-P (q - q0), N^2 J / n)`` (eqs. 5-6, rows
    drawn with replacement), with ``J`` the covariance of one row's score and ``P`` the
    posterior precision (the negative Hessian of the log posterior; ``N J`` under
    Bernstein-von Mises, the default). The update (eq. 11) is then the linear recursion
    ``q' - q0 = (1 - A P)(q - q0) + A (phi + eta)`` with ``A = 2 M^{-1}`` and
    ``M = gamma N I_hat + 4 B / eps``, whose stationary covariance ``S`` solves the discrete
    Lyapunov equation ``S = T S T^T + A (N^2 J / n + 4 B / eps) A^T``, ``T = 1 - A P``. With
    ``I_hat = J`` and ``P = N J`` this is ``P^{-1}`` at every step size (the derivation of
    eq. 8); with another ``I_hat`` (averaged far from the mode, or SGFS-d's diagonal on
    correlated scores), or scores whose covariance is not proportional to the curvature (a
    misspecified likelihood: ``J`` and ``P / N`` differ, the paper's ``N Cov[g] = I_N`` fails),
    it is not, except as ``eps -> 0``.

    Parameters
    ----------
    fisher : ndarray
        The ``I_hat`` in ``M``: (d, d), or its diagonal (d,) for SGFS-d.
    score_covariance : ndarray
        ``J``, (d, d): the covariance of the scores near the mode.
    n_rows, batch_size : int
        N and n.
    step_size : float
        The paper's epsilon.
    preconditioner : ndarray, optional
        B, shaped like ``fisher``; default ``gamma N I_hat`` as in :func:`sgfs_factors`.
    precision : ndarray, optional
        ``P``, (d, d); default ``N J``.
    noise : ndarray, optional
        ``V_hat`` in ``M`` (:func:`sgfs_factors`), shaped like ``fisher``; default ``I_hat``.
    noise_covariance : ndarray, optional
        The covariance per row of what the minibatch averages, (d, d): with the control
        variate, of the differences ``g_i(q) - g_i(q*)``; default ``J``. The minibatch noise is
        then ``N^2 V / n`` in place of ``N^2 J / n``.

    Returns
    -------
    ndarray
        ``S``, (d, d).

    Examples
    --------
    With ``I_hat = J`` it is the Bernstein-von Mises covariance ``(N J)^-1``:

    >>> S = stationary_covariance(np.array([[2.0]]), np.array([[2.0]]), 1000, 10, 1.0)
    >>> round(float(S[0, 0]) * 1000 * 2.0, 10)
    1.0
    """
    limit = curvature_and_noise(fisher, n_rows, batch_size, noise)
    limit = np.diag(limit) if limit.ndim == 1 else limit
    if preconditioner is None:
        b = limit
    else:
        b = np.diag(preconditioner) if preconditioner.ndim == 1 else preconditioner
    if precision is None:
        precision = n_rows * score_covariance
    if noise_covariance is None:
        noise_covariance = score_covariance
    gain = 2.0 * np.linalg.inv(limit + 4.0 * b / step_size)
    transition = np.eye(limit.shape[0]) - gain @ precision
    total = n_rows**2 * noise_covariance / batch_size + 4.0 * b / step_size
    covariance = solve_discrete_lyapunov(transition, gain @ total @ gain.T)
    return 0.5 * (covariance + covariance.T)


def stationary_sd_ratios(covariance: np.ndarray, precision: np.ndarray) -> tuple[float, float]:
    """Smallest and largest sd of ``covariance`` over that of ``precision^-1``, over directions.

    The square roots of the extreme eigenvalues of ``L^T S L`` with ``P = L L^T``: 1 and 1 when
    ``S = P^{-1}``.

    Examples
    --------
    >>> stationary_sd_ratios(np.diag([4.0, 0.25]), np.eye(2))
    (0.5, 2.0)
    """
    factor = np.linalg.cholesky(precision)
    values = np.linalg.eigvalsh(factor.T @ covariance @ factor)
    return float(np.sqrt(max(values.min(), 0.0))), float(np.sqrt(values.max()))


def largest_step_size_within(
    tolerance: float,
    step_size: float,
    fisher: np.ndarray,
    score_covariance: np.ndarray,
    n_rows: int,
    batch_size: int,
    preconditioner: np.ndarray | None,
    precision: np.ndarray,
    noise: np.ndarray | None = None,
    noise_covariance: np.ndarray | None = None,
) -> float | None:
    """Largest step size up to ``step_size`` whose predicted sds are within ``tolerance``.

    Bisection in log step size (30 halvings) on :func:`stationary_covariance` against
    ``precision^-1``, between ``1e-6 step_size`` and ``step_size``; None if even the smallest
    is not within (the prediction tends to ``P^-1`` only as the step size goes to 0).
    ``noise`` and ``noise_covariance`` as for :func:`stationary_covariance`.
    """

    def within(eps: float) -> bool:
        covariance = stationary_covariance(
            fisher,
            score_covariance,
            n_rows,
            batch_size,
            eps,
            preconditioner,
            precision,
            noise,
            noise_covariance,
        )
        low, high = stationary_sd_ratios(covariance, precision)
        return 1.0 / tolerance <= low and high <= tolerance

    low, high = step_size * 1e-6, step_size
    if not within(low):
        return None
    for _ in range(30):
        middle = float(np.sqrt(low * high))
        low, high = (middle, high) if within(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class PolynomialStepSize:
    """Step-size schedule ``a (b + t)^(-c)`` for step t = 1, 2, ... (Welling and Teh 2011).

    Pass it as ``SGFS(step_size_schedule=PolynomialStepSize(a, b, c))``; nothing is annealed
    unless you ask for it.

    Examples
    --------
    >>> PolynomialStepSize(a=1.0, b=9.0, c=0.5)(1)
    0.31622776601683794
    """

    a: float
    b: float
    c: float

    def __call__(self, t: int) -> float:
        """Step size at step t."""
        return self.a * (self.b + t) ** (-self.c)

"""Taylor control variates for the subsampled log-likelihood ratio (pure NumPy).

Both MH tests estimate ``L = sum_i l_i`` with ``l_i = log p(x_i | q') - log p(x_i | q)`` from a
minibatch. The difference estimator of Bardenet, Doucet and Holmes (JMLR 2017, section 7.2)
and Quiroz, Kohn, Villani and Tran (JASA 2019, eq. 2.4) writes
``L = R + sum_i (l_i - r_i)``, where ``r_i`` is the difference between ``q'`` and ``q`` of a
Taylor expansion of row i's log-likelihood around a reference point ``q*``:

    first order:   r_i = g_i^T a
    second order:  r_i = g_i^T a + a^T H_i b / 2,      a = q' - q,  b = q' + q - 2 q*

with ``g_i``, ``H_i`` the gradient and Hessian of row i at ``q*``. Their sum ``R`` is exact from
``G = sum_i g_i`` and ``H = sum_i H_i``, computed once: O(d) or O(d^2) per step. The minibatch
then estimates only the residuals ``l_i - r_i``, whose spread is O(|q - q*| |a|) (first order)
or O(|q - q*|^2 |a|) (second order) instead of O(|a|): at temperature 1 with proposals on the
posterior scale this makes the rows a test needs O(1) instead of O(N). The tests run unchanged
on the residuals, with ``R / T`` added to their log prior-and-proposal ratio: the Austerity
threshold mu_0 (Korattikara et al. 2014, eq. 2) and the Barker Delta* (Seita et al., eq. 8) then
shift by exactly the proxy part, and with all N rows the decision is still the exact one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh
from scipy.stats import chi2

__all__ = [
    "TaylorProxy",
    "laplace_covariance",
    "mahalanobis_limit",
]


@dataclass(frozen=True)
class TaylorProxy:
    """Exact sums of the per-row Taylor proxies around ``reference``.

    Attributes
    ----------
    reference : ndarray
        The expansion point ``q*`` (unconstrained, raveled).
    gradient_sum : ndarray
        ``G = sum_i grad loglik_i(q*)``, shape (d,).
    hessian_sum : ndarray
        ``H = sum_i hess loglik_i(q*)``, shape (d, d).
    order : int
        1 (gradient only) or 2 (gradient and Hessian).

    Examples
    --------
    >>> proxy = TaylorProxy(np.zeros(1), np.array([2.0]), np.array([[-4.0]]), order=2)
    >>> float(proxy.difference(np.array([1.0]), np.array([0.0])))  # 2 * 1 - 4 * 1 / 2
    0.0
    """

    reference: np.ndarray
    gradient_sum: np.ndarray
    hessian_sum: np.ndarray
    order: int

    def difference(self, q_new: np.ndarray, q_old: np.ndarray) -> float:
        """``R = sum_i r_i``: the proxies' total difference between ``q_new`` and ``q_old``.

        Non-finite where a point is (a proposal whose parameters overflow): the step rejects it.
        """
        step = q_new - q_old
        with np.errstate(over="ignore", invalid="ignore"):
            total = float(self.gradient_sum @ step)
            if self.order == 2:
                centre = q_new + q_old - 2.0 * self.reference
                total += 0.5 * float(step @ self.hessian_sum @ centre)
        return total


def laplace_covariance(
    hessian_sum: np.ndarray, prior_hessian: np.ndarray, temperature: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """Covariance of the Laplace approximation at the reference point.

    The precision is ``P = -(H / T + H_prior)``, the negative Hessian of the (tempered) log
    posterior. At a mode it is positive definite, however ill-conditioned (a posterior with
    precision eigenvalues 4.9 and 6.7e6 is used as it is). Eigenvalues that are not positive
    beyond rounding (at most ``1e-12`` times the largest in absolute value, about
    ``1e4 d`` machine epsilons) show the point is not at a mode, or the posterior is flat in
    some direction; they are counted, and raised to ``max(|lambda|, 1e-6 max|lambda|)`` so
    that the covariance stays positive definite and bounded.

    Returns
    -------
    covariance : ndarray
        ``P^{-1}`` after the change, shape (d, d).
    precision : ndarray
        ``P`` after the change.
    n_clipped : int
        Number of eigenvalues that were not positive (0 at a mode).

    Examples
    --------
    >>> cov, prec, n = laplace_covariance(np.array([[-3.0]]), np.array([[-1.0]]), 1.0)
    >>> float(cov[0, 0]), n
    (0.25, 0)
    >>> _, prec, n = laplace_covariance(np.diag([-6.7e6, -4.9]), np.zeros((2, 2)), 1.0)
    >>> prec.diagonal().tolist(), n
    ([6700000.0, 4.9], 0)
    """
    precision = -(np.asarray(hessian_sum) / temperature + np.asarray(prior_hessian))
    values, vectors = eigh(0.5 * (precision + precision.T))
    largest = max(float(np.abs(values).max(initial=0.0)), 1e-300)
    not_positive = values <= 1e-12 * largest
    values = np.where(not_positive, np.maximum(np.abs(values), 1e-6 * largest), values)
    covariance = (vectors / values) @ vectors.T
    return covariance, (vectors * values) @ vectors.T, int(np.count_nonzero(not_positive))


def mahalanobis_limit(n_params: int, tail_probability: float = 1e-6) -> float:
    """Squared distance from the reference that a Gaussian posterior exceeds with this probability.

    Under the Laplace approximation ``(q - q*)^T P (q - q*)`` is chi-square with d degrees of
    freedom.

    Examples
    --------
    >>> round(mahalanobis_limit(1, 0.05), 3)
    3.841
    """
    return float(chi2.isf(tail_probability, n_params))

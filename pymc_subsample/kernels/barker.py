"""The minibatch Barker test of Seita, Pan, Chen and Canny (2017 preprint, UAI 2018), Algorithm 1.

Notation of the paper (tempered likelihood, temperature T):

    Lambda_i = (N / T) l_i,   l_i = log p(x_i | theta') - log p(x_i | theta)
    Delta*   = (N / (T b)) sum_{i in batch} l_i - psi(1, theta, theta')             (eq. 8)
    psi(1)   = log[rho(theta) q(theta'|theta) / (rho(theta') q(theta|theta'))]

The exact Barker test accepts iff ``Delta + X_log > 0`` with ``X_log`` standard logistic
(eq. 10). Its minibatch version estimates ``Delta`` by ``Delta*``, whose noise is about
``N(0, s^2)`` by the CLT; when ``s^2 < sigma^2`` it adds ``X_nc ~ N(0, sigma^2 - s^2)`` and the
correction ``X_corr`` for that sigma (:mod:`pymc_subsample.kernels.correction`, eq. 14), so that
the total noise is logistic: accept iff ``Delta* + X_nc + X_corr > 0`` (eq. 13). Algorithm 1
takes sigma = 1; the paper's appendix C.1 (Table 3) weighs sigma from 0.8 to 1.1: a larger sigma
lets smaller batches pass, at a correction whose fit is less exact. The batch grows by
``batch_size`` rows while ``s^2 >= sigma^2`` (or, with ``error_bound``, while the CLT bound of
Corollary 1 exceeds it). With all N rows it makes the exact Barker decision with logistic noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr, ndtri

from pymc_subsample.kernels.correction import CorrectionDistribution, sample_correction
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.kernels.stages import (
    LogRatioRows,
    StageStatistics,
    evaluated_prefix,
    run_stages,
)

__all__ = [
    "BarkerDecision",
    "clt_error_bound",
    "delta_variance",
    "estimate_noise_shortfall",
    "minibatch_barker_test",
]


class BarkerDecision(NamedTuple):
    """Outcome of one test; field names are the step method's stat names."""

    accepted: bool
    n_data: int
    n_batches: int
    full_data: bool
    variance: float
    clt_error: float
    nonfinite_proposal: bool
    delta_star: float
    #: Excess kurtosis of the first batch's ``l_i`` (with a control variate, its residuals).
    residual_kurtosis: float = math.nan


def delta_variance(std_error: np.ndarray | float, n_rows: int, temperature: float) -> np.ndarray:
    """Variance ``s^2`` of ``Delta*`` from the standard error of the mean ``l``-bar.

    ``Delta* = (N / T) l-bar + const``, so ``s^2 = (N / T)^2 se^2``, with ``se`` the standard
    error of eq. 4 of Korattikara et al. (finite-population correction for sampling without
    replacement; zero with all rows).

    Examples
    --------
    >>> float(delta_variance(0.001, 10_000, 10.0))
    1.0
    """
    return np.square(np.asarray(std_error) * (n_rows / temperature))


def estimate_noise_shortfall(variance: float, target: float) -> float:
    """How far the estimate's noise lowers the mean Metropolis probability ``min(1, e^Delta*)``.

    A step size tuned so that ``min(1, exp(Delta*))`` averages ``target`` reads the noise of
    ``Delta* = Delta + e``, ``e ~ N(0, s^2)`` (eq. 8's CLT, ``s^2`` the test's ``variance``) as
    energy error: with ``s^2`` near the correction's ``sigma^2 = 1`` even an exact trajectory
    averages about 0.76, below Stan's 0.8, and the step size shrinks without end. Under the
    usual model of a trajectory's energy error, Gaussian with ``E[e^Delta] = 1``, i.e.
    ``Delta ~ N(-sigma_0^2 / 2, sigma_0^2)`` (Neal 2011, section 5.4.4; Beskos et al. 2013),
    the exact test accepts with mean ``2 Phi(-sigma_0 / 2)``, which is ``target`` at one
    ``sigma_0``; there ``Delta*`` is ``N(m, w)`` with ``m = -sigma_0^2 / 2`` and
    ``w = sigma_0^2 + s^2``, and

        E[min(1, e^X)] = Phi(m / sqrt(w)) + exp(m + w / 2) Phi(-(m + w) / sqrt(w)).

    This returns ``target`` minus that mean: added to each draw's ``min(1, exp(Delta*))`` it
    makes the statistic average ``target`` at the step size where the exact test would.

    Parameters
    ----------
    variance : float
        ``s^2``, the estimate's variance (0 with all rows; a non-finite one counts as 0).
    target : float
        The acceptance rate the step size aims at, in (0, 1).

    Returns
    -------
    float
        The shortfall, >= 0; 0 when ``variance`` is 0.

    Examples
    --------
    >>> estimate_noise_shortfall(0.0, 0.8)
    0.0
    >>> round(estimate_noise_shortfall(1.0, 0.8), 3)
    0.087
    """
    if not (math.isfinite(variance) and variance > 0.0):
        return 0.0
    sigma_0 = -2.0 * float(ndtri(0.5 * target))  # 2 Phi(-sigma_0 / 2) = target
    mean, total = -0.5 * sigma_0**2, sigma_0**2 + variance
    root = math.sqrt(total)
    above = float(ndtr(mean / root))  # P(X > 0)
    below = math.exp(mean + 0.5 * total) * float(ndtr(-(mean + total) / root))  # E[e^X; X < 0]
    expected = above + below
    return max(target - expected, 0.0)


def clt_error_bound(values: np.ndarray) -> float:
    """Corollary 1 of Seita et al.: ``(6.4 E|X|^3 + 2 E|X|) / sqrt(b)`` for the batch's ``l_i``.

    The bound comes from Novak (2005) for variables of unit variance, so the moments are those
    of the standardised deviations ``X_i = (l_i - l-bar) / s_l``; this makes the bound free of
    the scale ``N / T``. It is loose: Gaussian data give about ``11.8 / sqrt(b)``.

    Examples
    --------
    >>> round(clt_error_bound(np.array([-1.0, 1.0, -1.0, 1.0])), 4)  # (6.4 + 2) / sqrt(4)
    4.2
    """
    deviations = values - values.mean()
    scale = float(np.sqrt(np.mean(deviations**2)))
    if scale == 0.0:
        return 0.0
    standardised = np.abs(deviations) / scale
    return float(
        (6.4 * np.mean(standardised**3) + 2.0 * np.mean(standardised)) / math.sqrt(values.size)
    )


def minibatch_barker_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    rows: RowSampler,
    log_prior_proposal_ratio: float,
    batch_size: int,
    temperature: float,
    error_bound: float | None,
    correction: CorrectionDistribution,
) -> BarkerDecision:
    """Run Algorithm 1 of Seita et al. for one proposal.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the rows, then ``X_nc`` and ``X_corr`` (or ``X_log`` with all rows).
    log_ratio_rows : callable
        ``log_ratio_rows(idx)`` returns ``l_i`` for the int64 rows ``idx`` (untempered).
    rows : RowSampler
        Row sampler over the N rows.
    log_prior_proposal_ratio : float
        ``-psi(1) = log rho(theta') - log rho(theta) + log q(theta|theta') - log q(theta'|theta)``.
    batch_size : int
        The paper's m: initial batch and increment.
    temperature : float
        T: the likelihood is raised to ``1 / T`` (the target changes with T).
    error_bound : float or None
        The paper's delta: also grow the batch while the Corollary 1 bound exceeds it.
    correction : CorrectionDistribution
        ``X_corr`` for its ``sigma``: batches pass once ``s^2 < sigma^2``.

    Returns
    -------
    BarkerDecision
        ``variance`` is the ``s^2`` used (0 with all rows), ``clt_error`` the Corollary 1 bound
        at the final batch (NaN unless ``error_bound`` is set), ``delta_star`` the estimate of
        the log acceptance ratio the decision was made on (eq. 8; -inf for a non-finite
        proposal).
    """
    if not np.isfinite(log_prior_proposal_ratio):
        return BarkerDecision(False, 0, 0, False, math.nan, math.nan, True, -math.inf)
    n_rows = rows.n_rows
    variance_limit = correction.sigma**2

    def small_variance(stats: StageStatistics, prefix: Callable[[int], np.ndarray]) -> np.ndarray:
        allowed = delta_variance(stats.std_error, n_rows, temperature) < variance_limit  # Alg. 1
        if error_bound is None or not allowed.any():
            return allowed
        for stage in allowed.nonzero()[0]:
            if clt_error_bound(prefix(int(stats.n_values[stage]))) <= error_bound:
                return np.arange(allowed.size) == stage
        return np.zeros_like(allowed)

    outcome = run_stages(rng, log_ratio_rows, rows, batch_size, 0.0, small_variance)
    if outcome.nonfinite:
        return BarkerDecision(
            False, outcome.n_data, outcome.n_batches, False, math.nan, math.nan, True, -math.inf
        )
    delta_star = outcome.mean * n_rows / temperature + log_prior_proposal_ratio  # eq. 8
    clt_error = math.nan
    if outcome.full_data:
        accepted = delta_star + rng.logistic() > 0.0  # exact Barker test, eq. 10
        variance = 0.0
    else:
        variance = float(delta_variance(outcome.std_error, n_rows, temperature))
        if error_bound is not None:
            clt_error = clt_error_bound(evaluated_prefix(outcome.chunks, outcome.n_used))
        noise = math.sqrt(variance_limit - variance) * rng.standard_normal() + sample_correction(
            rng, correction
        )
        accepted = delta_star + noise > 0.0  # eq. 13
    return BarkerDecision(
        bool(accepted),
        outcome.n_data,
        outcome.n_batches,
        outcome.full_data,
        variance,
        clt_error,
        False,
        delta_star,
        outcome.first_stage_kurtosis,
    )

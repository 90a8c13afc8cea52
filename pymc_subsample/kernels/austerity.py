"""The approximate Metropolis-Hastings test of Korattikara, Chen and Welling (2014), Algorithm 1.

Notation of the paper: ``l_i = log p(x_i | theta') - log p(x_i | theta)`` are the per-row
log-likelihood ratios, ``mu`` their mean over all N rows (eq. 3) and ``mu_0`` the threshold
(eq. 2) that folds in the uniform draw, the prior and the proposal:

    mu_0 = (1/N) log[u rho(theta) q(theta'|theta) / (rho(theta') q(theta|theta'))].

Exact MH accepts iff ``mu > mu_0``. The sequential test estimates ``mu`` from growing batches
drawn without replacement and stops as soon as a Student-t test on ``mu - mu_0`` is confident at
level ``error_tolerance`` (the paper's epsilon). With all N rows it makes the exact decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.special import stdtr

from pymc_subsample.kernels.moments import EMPTY, RunningMoments, add_batch
from pymc_subsample.kernels.row_sampler import RowSampler

__all__ = [
    "AusterityDecision",
    "exact_mh_test",
    "mean_standard_error",
    "sequential_mh_test",
    "t_test_error",
]

#: Rows per call when a full-data pass is made in chunks (bounds memory, not cost).
FULL_PASS_CHUNK = 65_536

LogRatioRows = Callable[[np.ndarray], np.ndarray]


class AusterityDecision(NamedTuple):
    """Outcome of one test; field names are the step method's stat names."""

    accepted: bool
    n_data: int
    n_batches: int
    full_data: bool
    nonfinite_proposal: bool


def mean_standard_error(moments: RunningMoments, n_rows: int) -> float:
    """Return the standard deviation of the batch mean, with finite-population correction (eq. 4).

    ``s = s_l / sqrt(n) * sqrt(1 - (n - 1) / (N - 1))`` with ``s_l`` the sample standard
    deviation (divisor n - 1) of the n values seen.

    Examples
    --------
    >>> round(mean_standard_error(RunningMoments(4, 2.5, 5.0), 10), 6)  # sqrt(5/3 / 4 * 6/9)
    0.527046

    """
    n = moments.n_values
    if n >= n_rows:
        return 0.0
    sample_var = moments.sum_sq_dev / (n - 1)
    finite_population = 1.0 - (n - 1) / (n_rows - 1)
    return float(np.sqrt(sample_var / n * finite_population))


def t_test_error(mean: float, threshold: float, std_error: float, count: int) -> float:
    """Probability ``delta = 1 - phi_{n-1}(|t|)`` of Algorithm 1, line 7, with t from eq. 5.

    A zero standard error decides at once (``delta = 0``) unless the mean equals the threshold.

    Examples
    --------
    >>> round(t_test_error(0.2, 0.0, 0.1, 500), 4)  # t = 2 with 499 degrees of freedom
    0.023

    """
    gap = mean - threshold
    if std_error == 0.0:
        return 1.0 if gap == 0.0 else 0.0
    return float(stdtr(count - 1, -abs(gap) / std_error))


def _threshold(log_u: float, log_prior_proposal_ratio: float, n_rows: int) -> float:
    # Korattikara 2014, eq. 2, with log_prior_proposal_ratio =
    # log rho(theta') + log q(theta|theta') - log rho(theta) - log q(theta'|theta).
    return (log_u - log_prior_proposal_ratio) / n_rows


def sequential_mh_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    rows: RowSampler,
    log_prior_proposal_ratio: float,
    error_tolerance: float,
    batch_size: int,
) -> AusterityDecision:
    """Run Algorithm 1 for one proposal.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws ``u`` first, then the rows.
    log_ratio_rows : callable
        ``log_ratio_rows(idx)`` returns ``l_i`` for the int64 rows ``idx``.
    rows : RowSampler
        Row sampler over the N rows; a new test is started here.
    log_prior_proposal_ratio : float
        ``log rho(theta') - log rho(theta) + log q(theta|theta') - log q(theta'|theta)``.
    error_tolerance : float
        The paper's epsilon: stop when ``delta < error_tolerance``.
    batch_size : int
        The paper's m: rows added per stage.

    Returns
    -------
    AusterityDecision

    """
    log_u = float(np.log(rng.uniform()))
    if not np.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True)
    n_rows = rows.n_rows
    threshold = _threshold(log_u, log_prior_proposal_ratio, n_rows)
    rows.start_test()
    moments, n_batches = EMPTY, 0
    while True:
        moments = add_batch(moments, log_ratio_rows(rows.draw(rng, batch_size)))
        n_batches += 1
        if not math.isfinite(moments.mean):  # a NaN or infinite l_i: reject
            return AusterityDecision(False, moments.n_values, n_batches, False, True)
        if moments.n_values == n_rows:
            total = moments.mean * n_rows
            accepted = _exact_decision(total, log_prior_proposal_ratio, log_u)
            return AusterityDecision(accepted, n_rows, n_batches, True, False)
        std_error = mean_standard_error(moments, n_rows)
        if t_test_error(moments.mean, threshold, std_error, moments.n_values) < error_tolerance:
            accepted = moments.mean > threshold
            return AusterityDecision(bool(accepted), moments.n_values, n_batches, False, False)


def exact_mh_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    n_rows: int,
    log_prior_proposal_ratio: float,
) -> AusterityDecision:
    """Exact Metropolis-Hastings on all rows, in row order, drawing only ``u`` from ``rng``.

    This is the ``error_tolerance = 0`` limit of the sequential test (which can then never stop
    early): the same decision, without drawing rows, so that the random stream is the one of
    plain MH.
    """
    log_u = float(np.log(rng.uniform()))
    if not np.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True)
    total = 0.0
    for start in range(0, n_rows, FULL_PASS_CHUNK):
        total += float(log_ratio_rows(np.arange(start, min(start + FULL_PASS_CHUNK, n_rows))).sum())
    if not math.isfinite(total):
        return AusterityDecision(False, n_rows, 1, True, True)
    accepted = _exact_decision(total, log_prior_proposal_ratio, log_u)
    return AusterityDecision(accepted, n_rows, 1, True, False)


def _exact_decision(total_log_ratio: float, log_prior_proposal_ratio: float, log_u: float) -> bool:
    # mu > mu_0 (eq. 2, 3) multiplied through by N.
    return bool(total_log_ratio + log_prior_proposal_ratio > log_u)

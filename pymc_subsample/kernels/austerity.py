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

from pymc_subsample.kernels.row_sampler import RowSampler

__all__ = [
    "AusterityDecision",
    "StageStatistics",
    "exact_mh_test",
    "sequential_mh_test",
    "stage_statistics",
]

#: Rows per call when a full-data pass is made in chunks (bounds memory, not cost).
FULL_PASS_CHUNK = 65_536
#: Each oracle call of a test evaluates this many times more stages than the previous one.
STAGE_GROWTH = 2

LogRatioRows = Callable[[np.ndarray], np.ndarray]


class AusterityDecision(NamedTuple):
    """Outcome of one test; field names are the step method's stat names."""

    accepted: bool
    n_data: int
    n_batches: int
    full_data: bool
    nonfinite_proposal: bool


class StageStatistics(NamedTuple):
    """Per-stage quantities of the sequential test, one entry per stage boundary."""

    n_values: np.ndarray
    mean: np.ndarray
    std_error: np.ndarray
    test_error: np.ndarray


class _Sums(NamedTuple):
    """Sums of ``l_i - shift`` and its square over the rows seen (shift avoids cancellation)."""

    n_values: int
    shift: float
    total: float
    total_sq: float


def stage_statistics(
    n_values: np.ndarray,
    shifted_sum: np.ndarray,
    shifted_sum_sq: np.ndarray,
    shift: float,
    n_rows: int,
    threshold: float,
) -> StageStatistics:
    """Sample mean, its standard error and the t-test error at each stage of Algorithm 1.

    Parameters
    ----------
    n_values : ndarray of int
        Rows seen at each stage, n.
    shifted_sum, shifted_sum_sq : ndarray
        Sums of ``l_i - shift`` and ``(l_i - shift)^2`` over those rows.
    shift : float
        Any constant near the mean (it only protects against cancellation).
    n_rows : int
        Population size N.
    threshold : float
        ``mu_0`` of eq. 2.

    Returns
    -------
    StageStatistics
        ``mean`` is l-bar; ``std_error`` is s of eq. 4 (sample sd with divisor n - 1, divided by
        sqrt(n), times the finite-population correction sqrt(1 - (n - 1)/(N - 1)));
        ``test_error`` is delta = 1 - phi_{n-1}(|t|) of Algorithm 1 (line 7) with t from eq. 5.
        A stage with zero standard error has delta = 0 unless its mean equals the threshold
        (then NaN: undecided).

    Examples
    --------
    Values 1, 2, 3, 4 of N = 10 rows: mean 2.5, s^2 = (5/3) / 4 * (1 - 3/9) = 5/18.

    >>> stats = stage_statistics(np.array([4]), np.array([10.0]), np.array([30.0]), 0.0, 10, 0.0)
    >>> float(stats.mean[0]), round(float(stats.std_error[0] ** 2), 6)
    (2.5, 0.277778)

    """
    n = n_values.astype(float)
    shifted_mean = shifted_sum / n
    mean = shift + shifted_mean
    with np.errstate(divide="ignore", invalid="ignore"):
        sample_var = np.maximum(shifted_sum_sq - shifted_sum * shifted_mean, 0.0) / (n - 1)
        finite_population = 1.0 - (n - 1) / (n_rows - 1)  # eq. 4
        std_error = np.sqrt(sample_var * finite_population / n)
        t_statistic = np.abs(mean - threshold) / std_error  # eq. 5
        test_error = stdtr(n - 1, -t_statistic)
    return StageStatistics(n_values, mean, std_error, test_error)


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

    The stages are those of the paper: after every ``batch_size`` rows (drawn without
    replacement) the t-test is applied, and the first stage with ``delta < error_tolerance``
    decides. To save calls, each oracle call evaluates ``STAGE_GROWTH`` times more stages than
    the previous one (1, 2, 4, ... stages) and the test runs over that call's stages in order:
    the decision and the stage at which it is made are those of Algorithm 1 on the same rows,
    while the rows evaluated (``n_data``) can exceed the rows the decision needed by at most
    the last call's look-ahead.

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
        ``n_batches`` is the stage at which the decision was made.

    """
    log_u = float(np.log(rng.uniform()))
    if not np.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True)
    n_rows = rows.n_rows
    threshold = _threshold(log_u, log_prior_proposal_ratio, n_rows)
    rows.start_test()
    sums: _Sums | None = None
    n_stages, stages_per_call = 0, 1
    while True:
        values = log_ratio_rows(rows.draw(rng, stages_per_call * batch_size))
        if not math.isfinite(float(values.sum())):  # a NaN or infinite l_i: reject
            return AusterityDecision(False, rows.n_taken, n_stages + 1, False, True)
        if sums is None:
            first_stage = values[:batch_size]
            sums = _Sums(0, float(first_stage.sum()) / first_stage.size, 0.0, 0.0)
        stats, sums = _chunk_stages(values, sums, batch_size, n_rows, threshold)
        decided = ((stats.test_error < error_tolerance) | (stats.n_values == n_rows)).nonzero()[0]
        if decided.size:
            stage = int(decided[0])
            n_used = int(stats.n_values[stage])
            if n_used == n_rows:
                total = float(stats.mean[stage]) * n_rows
                accepted = _exact_decision(total, log_prior_proposal_ratio, log_u)
            else:
                accepted = bool(stats.mean[stage] > threshold)
            full = n_used == n_rows
            return AusterityDecision(accepted, rows.n_taken, n_stages + stage + 1, full, False)
        n_stages += stats.n_values.size
        stages_per_call *= STAGE_GROWTH


def _chunk_stages(
    values: np.ndarray, sums: _Sums, batch_size: int, n_rows: int, threshold: float
) -> tuple[StageStatistics, _Sums]:
    starts = np.arange(0, values.size, batch_size)
    deviations = values - sums.shift
    cumulative = sums.total + np.add.reduceat(deviations, starts).cumsum()
    cumulative_sq = sums.total_sq + np.add.reduceat(deviations * deviations, starts).cumsum()
    n_values = sums.n_values + np.minimum(starts + batch_size, values.size)
    stats = stage_statistics(n_values, cumulative, cumulative_sq, sums.shift, n_rows, threshold)
    new_sums = _Sums(int(n_values[-1]), sums.shift, float(cumulative[-1]), float(cumulative_sq[-1]))
    return stats, new_sums


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

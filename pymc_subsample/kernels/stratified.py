"""The sequential test on rows stratified by group: each group is a population of its own.

In a hierarchy a row's log-likelihood reads its group's parameters, so the per-row values a
test estimates (the log-likelihood ratios, or with a control variate their Taylor residuals)
differ far more between groups than within one: a group with few rows moves by its prior's
scale, and its residuals are large; a group with many rows is pinned near its reference by its
own data, and its residuals are of order ``n_g^(-3/2)`` each. A uniform sample of rows mixes
the two, and the variance of ``N mean(l_i)`` is carried by the rare rows of small groups: on a
200-group logistic regression with 2e5 rows the standard error of a 100-row estimate was 7 to
35 nats, and the test read a third of the rows per draw (``docs/architecture.md``,
"Stratified tests").

Stratified sampling (Quiroz, Villani, Kohn, Tran and Dang 2018, "Subsampling MCMC: an
introduction for the survey statistician", section 3; Cochran 1977, ch. 5) estimates each
group's sum on its own rows. Groups of at most ``exact_size`` rows are read whole at every test
(their sum is exact); every other group ``g`` of ``n_g`` rows gets ``m`` rows drawn uniformly
with replacement, and

    total = sum over whole groups of sum_i l_i  +  sum over sampled groups of n_g mean_g(l),
    Var(total) = sum over sampled groups of n_g^2 s_g^2 / m,

with ``s_g^2`` the group's sample variance. On the model above, 765 rows gave a standard
error of 0.14 to 0.32 nats. The decision is Algorithm 1 of Korattikara, Chen and Welling
(2014) on this estimate: the t-statistic of eq. 5 with ``total`` in place of ``N l-bar`` and
its standard error from the strata, compared with Student's t whose degrees of freedom are
Welch-Satterthwaite's (Cochran 1977, eq. 5.32: each group's variance has ``m - 1``); while it
is not confident at level ``epsilon``, every sampled group's rows are doubled; once they
would pass half of those groups' rows, every row is read and the decision is exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy.special import stdtr

from pymc_subsample.kernels.austerity import FULL_PASS_CHUNK, AusterityDecision

__all__ = ["Strata", "build_strata", "stratified_mh_test"]

LogRatioRows = Callable[[np.ndarray], np.ndarray]


class Strata(NamedTuple):
    """Rows grouped into strata: those read whole, and those sampled within their stratum."""

    #: Rows of the strata read whole at every test (sorted, int64).
    whole_rows: np.ndarray
    #: Rows of the sampled strata, sorted by stratum (int64): stratum k holds
    #: ``sampled_rows[starts[k] : starts[k] + sizes[k]]``.
    sampled_rows: np.ndarray
    #: Where each sampled stratum starts in ``sampled_rows``.
    starts: np.ndarray
    #: Rows in each sampled stratum, ``n_g`` (float64, for the estimator's arithmetic).
    sizes: np.ndarray
    #: Rows in all, N.
    n_rows: int

    @property
    def n_sampled(self) -> int:
        """Number of sampled strata."""
        return int(self.sizes.size)


def build_strata(group: np.ndarray, exact_size: int) -> Strata:
    """Stratify the rows by their group's size, for :func:`stratified_mh_test`.

    Groups of at most ``exact_size`` rows are read whole. The other groups are pooled by size
    class, ``floor(log2(n_g))``: a stratum holds the rows of the groups of 33 to 64 rows, the
    next those of 65 to 128, and so on. Rows of groups of one size move alike (their values
    scale with ``n_g``, see the module's docstring), and a class has enough rows for its
    sample variance to be reliable, where a group's own two or three rows would not: with
    one stratum per group and two rows each, a stratum whose two values happened to agree
    hid its variance, and the test decided early and wrongly (an acceptance probability of
    0.17 where exact MH gives 0.14; ``tests/test_stratified.py``).

    Parameters
    ----------
    group : ndarray of int, shape (N,)
        Each row's group; non-negative.
    exact_size : int
        Groups of at most this many rows are read whole at every test.

    Returns
    -------
    Strata

    Examples
    --------
    >>> strata = build_strata(np.array([0, 1, 1, 0, 2, 1, 1, 3, 3, 3]), exact_size=2)
    >>> strata.whole_rows.tolist(), strata.sampled_rows.tolist(), strata.sizes.tolist()
    ([0, 3, 4], [7, 8, 9, 1, 2, 5, 6], [3.0, 4.0])

    """
    group = np.asarray(group)
    if group.ndim != 1 or group.size == 0:
        raise ValueError("group must be a non-empty one-dimensional array of row groups.")
    if group.min() < 0:
        raise ValueError("group must be non-negative.")
    counts = np.bincount(group)
    size_class = np.zeros(counts.size, dtype=np.int64)
    large = counts > exact_size
    size_class[large] = np.floor(np.log2(counts[large])).astype(np.int64) + 1
    row_class = size_class[group]
    whole_rows = np.flatnonzero(row_class == 0)
    sampled_rows = np.flatnonzero(row_class)
    sampled_rows = sampled_rows[np.argsort(row_class[sampled_rows], kind="stable")]
    class_sizes = np.bincount(row_class[sampled_rows])
    sizes = class_sizes[class_sizes > 0]
    starts = np.cumsum(sizes) - sizes
    return Strata(
        whole_rows.astype(np.int64),
        sampled_rows.astype(np.int64),
        starts.astype(np.int64),
        sizes.astype(np.float64),
        int(group.size),
    )


def stratified_mh_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    strata: Strata,
    log_prior_proposal_ratio: float,
    error_tolerance: float,
    rows_per_stratum: int,
    temperature: float = 1.0,
) -> AusterityDecision:
    """Decide one Metropolis-Hastings proposal by the stratified sequential test.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws ``u`` first (as :func:`~pymc_subsample.kernels.austerity.sequential_mh_test`
        does), then the rows.
    log_ratio_rows : callable
        ``log_ratio_rows(idx)`` returns ``l_i`` for the int64 rows ``idx``.
    strata : Strata
        From :func:`build_strata`.
    log_prior_proposal_ratio : float
        ``log rho(theta') - log rho(theta) + log q(theta|theta') - log q(theta'|theta)``.
    error_tolerance : float
        The paper's epsilon: decide at the first stage whose t-test error is below it.
    rows_per_stratum : int
        Rows drawn from each sampled stratum at the first stage (at least 2, for a variance).
    temperature : float, default 1
        The likelihood is raised to ``1 / temperature``.

    Returns
    -------
    AusterityDecision
        ``n_data`` counts the row evaluations (a sampled row can be drawn again; an exact
        decision reads every row once more than the stages had read), ``n_batches`` the
        stages, ``full_data`` whether the decision was exact on all N rows.
        ``residual_kurtosis`` is NaN: the rows of different strata have no common
        distribution.

    """
    if rows_per_stratum < 2:
        raise ValueError(f"rows_per_stratum must be at least 2, got {rows_per_stratum}.")
    u = rng.uniform()
    log_u = math.log(u) if u > 0.0 else -math.inf
    if not math.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True, -math.inf)
    # Korattikara 2014, eq. 2 multiplied through by N: accept iff sum_i l_i > target.
    target = temperature * (log_u - log_prior_proposal_ratio)
    whole = _chunked_sum(log_ratio_rows, strata.whole_rows)
    n_data = int(strata.whole_rows.size)
    if not math.isfinite(whole):
        return AusterityDecision(False, n_data, 1, False, True, -math.inf)
    if strata.n_sampled == 0:
        return _decided(whole, target, temperature, log_prior_proposal_ratio, n_data, 1, True)
    sizes = strata.sizes
    n_sampled_rows = float(sizes.sum())
    sums = np.zeros(strata.n_sampled)
    squares = np.zeros(strata.n_sampled)
    shift = np.zeros(strata.n_sampled)
    count, take, stage = 0, rows_per_stratum, 0
    while (count + take) * strata.n_sampled <= n_sampled_rows / 2:
        stage += 1
        positions = strata.starts[:, None] + (
            rng.random((strata.n_sampled, take)) * sizes[:, None]
        ).astype(np.int64)
        values = np.asarray(log_ratio_rows(strata.sampled_rows[positions.ravel()]), dtype=float)
        n_data += values.size
        if not np.all(np.isfinite(values)):
            return AusterityDecision(False, n_data, stage, False, True, -math.inf)
        values = values.reshape(strata.n_sampled, take)
        if stage == 1:  # centre each stratum on its first mean (no cancellation in the squares)
            shift = values.mean(axis=1)
        centred = values - shift[:, None]
        sums += centred.sum(axis=1)
        squares += np.square(centred).sum(axis=1)
        count += take
        means = shift + sums / count
        variances = np.maximum(squares - sums * sums / count, 0.0) / (count - 1)
        estimate = whole + float(sizes @ means)
        terms = np.square(sizes) * variances / count  # each stratum's Var(n_g mean_g)
        variance = float(terms.sum())
        if variance == 0.0:  # every sampled stratum constant so far: nothing left to estimate
            return _decided(estimate, target, temperature, log_prior_proposal_ratio, n_data, stage)
        # Welch-Satterthwaite degrees of freedom (Cochran 1977, eq. 5.32).
        # (each term over the total: no overflow of the squares)
        dof = (count - 1) / float(np.sum(np.square(terms / variance)))
        t_statistic = abs(estimate - target) / math.sqrt(variance)  # eq. 5
        if stdtr(dof, -t_statistic) < error_tolerance:  # Algorithm 1, line 8
            return _decided(estimate, target, temperature, log_prior_proposal_ratio, n_data, stage)
        take = count  # double every sampled stratum's rows
    total = whole + _chunked_sum(log_ratio_rows, strata.sampled_rows)
    n_data += int(strata.sampled_rows.size)
    if not math.isfinite(total):
        return AusterityDecision(False, n_data, stage + 1, True, True, -math.inf)
    return _decided(total, target, temperature, log_prior_proposal_ratio, n_data, stage + 1, True)


def _decided(
    total: float,
    target: float,
    temperature: float,
    log_prior_proposal_ratio: float,
    n_data: int,
    n_batches: int,
    full_data: bool = False,
) -> AusterityDecision:
    delta_star = total / temperature + log_prior_proposal_ratio
    return AusterityDecision(
        bool(total > target), n_data, n_batches, full_data, False, delta_star, math.nan
    )


def _chunked_sum(log_ratio_rows: LogRatioRows, rows: np.ndarray) -> float:
    # In chunks, so that no call holds arrays of more than FULL_PASS_CHUNK rows.
    total = 0.0
    for begin in range(0, rows.size, FULL_PASS_CHUNK):
        total += float(np.sum(log_ratio_rows(rows[begin : begin + FULL_PASS_CHUNK])))
    return total

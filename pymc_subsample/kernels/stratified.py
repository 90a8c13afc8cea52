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

Algorithm 1 reads every row where ``u`` falls within the estimate's noise of the acceptance
ratio, and the chance of such a draw times N grows with N: on a 200-group logistic regression
the shared coefficients' test read all N rows on 0.2% to 1% of draws, which at 1e7 rows was most
of the mean rows per draw. :func:`stratified_mh_test` can also stop at a *resolution*: once the
standard error ``s`` of the log acceptance ratio is at most ``r``, it decides by the estimate.
Averaged over ``u`` (Korattikara et al. 2014, section 4: the error of the acceptance
probability), a decision by an estimate ``N(Lambda, s^2)`` of ``Lambda = log`` ratio moves the
acceptance probability by at most

    |Delta| <= max over sides of  integral_0^inf Phi(-x / s) dx  =  s / sqrt(2 pi),

because ``x = Lambda - log u`` has a density of at most 1 (``log u`` is minus an exponential),
and a wrong decision at ``x`` has probability ``Phi(-|x| / s)``. With ``r = sqrt(2 pi) epsilon``
the resolution's error is at most ``epsilon`` per proposal, and the rows it needs, ``(c / r)^2``
for a standard error ``c`` of one row's term times N, do not grow with N where a control variate
keeps ``c`` O(1) (``docs/architecture.md``, "Stratified tests").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
from scipy.special import stdtr

from pymc_subsample.kernels.austerity import FULL_PASS_CHUNK, AusterityDecision
from pymc_subsample.kernels.barker import BarkerDecision
from pymc_subsample.kernels.correction import CorrectionDistribution, sample_correction

__all__ = [
    "StratifiedEstimate",
    "Strata",
    "build_strata",
    "resolution_for",
    "stratified_barker_test",
    "stratified_estimates",
    "stratified_mh_test",
]

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


class StratifiedEstimate(NamedTuple):
    """The rows' summed values estimated at one stage of a stratified test."""

    #: ``whole + sum_c N_c mean_c``: the estimate of ``sum_i l_i`` over all N rows.
    total: float
    #: Its variance ``sum_c N_c^2 s_c^2 / m_c`` (0 when exact).
    variance: float
    #: Welch-Satterthwaite's degrees of freedom of the variance (inf when it is 0).
    dof: float
    #: Row evaluations so far.
    n_data: int
    #: Stages so far.
    n_batches: int
    #: Whether ``total`` is the exact sum over all N rows.
    full_data: bool
    #: Whether a value read was NaN or infinite (the estimate is then meaningless).
    nonfinite: bool


def stratified_estimates(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    strata: Strata,
    rows_per_stratum: int,
) -> Iterator[StratifiedEstimate]:
    """Yield the estimate after each stage, until one is exact or a value is not finite.

    The first stage reads the whole groups and ``rows_per_stratum`` rows of every sampled
    stratum (uniformly, with replacement); each later stage doubles the sampled rows. Once
    the sampled rows would pass half the sampled strata's rows, the last estimate reads every
    sampled row and is exact. A caller stops iterating where its rule holds.
    """
    if rows_per_stratum < 2:
        raise ValueError(f"rows_per_stratum must be at least 2, got {rows_per_stratum}.")
    whole = _chunked_sum(log_ratio_rows, strata.whole_rows)
    n_data = int(strata.whole_rows.size)
    if not math.isfinite(whole):
        yield StratifiedEstimate(whole, math.inf, math.nan, n_data, 1, False, True)
        return
    sizes = strata.sizes
    n_sampled_rows = float(sizes.sum())
    sums = np.zeros(strata.n_sampled)
    squares = np.zeros(strata.n_sampled)
    shift = np.zeros(strata.n_sampled)
    count, take, stage = 0, rows_per_stratum, 0
    while strata.n_sampled and (count + take) * strata.n_sampled <= n_sampled_rows / 2:
        stage += 1
        positions = strata.starts[:, None] + (
            rng.random((strata.n_sampled, take)) * sizes[:, None]
        ).astype(np.int64)
        values = np.asarray(log_ratio_rows(strata.sampled_rows[positions.ravel()]), dtype=float)
        n_data += values.size
        if not np.all(np.isfinite(values)):
            yield StratifiedEstimate(math.nan, math.inf, math.nan, n_data, stage, False, True)
            return
        values = values.reshape(strata.n_sampled, take)
        if stage == 1:  # centre each stratum on its first mean (no cancellation in the squares)
            shift = values.mean(axis=1)
        centred = values - shift[:, None]
        sums += centred.sum(axis=1)
        squares += np.square(centred).sum(axis=1)
        count += take
        means = shift + sums / count
        variances = np.maximum(squares - sums * sums / count, 0.0) / (count - 1)
        terms = np.square(sizes) * variances / count  # each stratum's Var(N_c mean_c)
        variance = float(terms.sum())
        # Welch-Satterthwaite (Cochran 1977, eq. 5.32), each term over the total so that the
        # squares cannot overflow.
        dof = (
            (count - 1) / float(np.sum(np.square(terms / variance)))
            if 0.0 < variance < math.inf
            else math.inf
        )
        total = whole + float(sizes @ means)
        yield StratifiedEstimate(total, variance, dof, n_data, stage, False, False)
        take = count  # double every sampled stratum's rows
    total = whole + _chunked_sum(log_ratio_rows, strata.sampled_rows)
    n_data += int(strata.sampled_rows.size)
    yield StratifiedEstimate(
        total, 0.0, math.inf, n_data, stage + 1, True, not math.isfinite(total)
    )


def resolution_for(error_tolerance: float) -> float:
    """Return the resolution whose error in the acceptance probability is ``error_tolerance``.

    ``sqrt(2 pi) epsilon`` (the module's docstring): a decision by an estimate of standard
    error at most this moves the acceptance probability by at most ``epsilon``; 0 stays 0
    (exact decisions).
    """
    return math.sqrt(2.0 * math.pi) * error_tolerance


def stratified_mh_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    strata: Strata,
    log_prior_proposal_ratio: float,
    error_tolerance: float,
    rows_per_stratum: int,
    temperature: float = 1.0,
    resolution: float = 0.0,
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
    resolution : float, default 0
        Also decide by the estimate at the first stage whose standard error of the log
        acceptance ratio is at most this; the acceptance probability then moves by at most
        ``resolution / sqrt(2 pi)`` (the module's docstring). 0 runs Algorithm 1 as written,
        reading every row where the t-test is not confident.

    Returns
    -------
    AusterityDecision
        ``n_data`` counts the row evaluations (a sampled row can be drawn again; an exact
        decision reads every row once more than the stages had read), ``n_batches`` the
        stages, ``full_data`` whether the decision was exact on all N rows.
        ``residual_kurtosis`` is NaN: the rows of different strata have no common
        distribution.

    """
    u = rng.uniform()
    log_u = math.log(u) if u > 0.0 else -math.inf
    if not math.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True, -math.inf)
    # Korattikara 2014, eq. 2 multiplied through by N: accept iff sum_i l_i > target.
    target = temperature * (log_u - log_prior_proposal_ratio)
    # The log ratio is total / T, so its standard error is sqrt(variance) / T.
    resolved_variance = (resolution * temperature) ** 2
    for estimate in stratified_estimates(rng, log_ratio_rows, strata, rows_per_stratum):
        if estimate.nonfinite:
            break
        if estimate.full_data or estimate.variance <= resolved_variance:
            return _mh_decision(estimate, target, temperature, log_prior_proposal_ratio)
        t_statistic = abs(estimate.total - target) / math.sqrt(estimate.variance)  # eq. 5
        if stdtr(estimate.dof, -t_statistic) < error_tolerance:  # Algorithm 1, line 8
            return _mh_decision(estimate, target, temperature, log_prior_proposal_ratio)
    return AusterityDecision(
        False, estimate.n_data, estimate.n_batches, estimate.full_data, True, -math.inf
    )


def stratified_barker_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    strata: Strata,
    log_prior_proposal_ratio: float,
    rows_per_stratum: int,
    temperature: float,
    correction: CorrectionDistribution,
) -> BarkerDecision:
    """Decide one proposal by the minibatch Barker test on the stratified estimate.

    Seita et al., Algorithm 1, with ``Delta* = total / T + log_prior_proposal_ratio`` (eq. 8)
    and its variance ``s^2 = Var(total) / T^2`` from the strata: stages run while ``s^2 >=
    sigma^2``; then ``X_nc ~ N(0, sigma^2 - s^2)`` and ``X_corr`` are added (eq. 13). With all
    rows it is the exact Barker test (eq. 10). Arguments as :func:`stratified_mh_test`, and
    ``correction`` as in :func:`~pymc_subsample.kernels.barker.minibatch_barker_test`.

    Returns
    -------
    BarkerDecision
        ``clt_error`` is NaN (Corollary 1's bound is for a uniform sample).
    """
    if not math.isfinite(log_prior_proposal_ratio):
        return BarkerDecision(False, 0, 0, False, math.nan, math.nan, True, -math.inf)
    variance_limit = correction.sigma**2
    for estimate in stratified_estimates(rng, log_ratio_rows, strata, rows_per_stratum):
        if estimate.nonfinite:
            break
        variance = estimate.variance / temperature**2
        if not (estimate.full_data or variance < variance_limit):  # Algorithm 1
            continue
        delta_star = estimate.total / temperature + log_prior_proposal_ratio  # eq. 8
        if estimate.full_data:
            accepted = delta_star + rng.logistic() > 0.0  # exact Barker test, eq. 10
        else:
            noise = math.sqrt(variance_limit - variance) * rng.standard_normal()
            accepted = delta_star + noise + sample_correction(rng, correction) > 0.0  # eq. 13
        return BarkerDecision(
            bool(accepted),
            estimate.n_data,
            estimate.n_batches,
            estimate.full_data,
            variance,
            math.nan,
            False,
            delta_star,
        )
    return BarkerDecision(
        False,
        estimate.n_data,
        estimate.n_batches,
        estimate.full_data,
        math.nan,
        math.nan,
        True,
        -math.inf,
    )


def _mh_decision(
    estimate: StratifiedEstimate,
    target: float,
    temperature: float,
    log_prior_proposal_ratio: float,
) -> AusterityDecision:
    delta_star = estimate.total / temperature + log_prior_proposal_ratio
    return AusterityDecision(
        bool(estimate.total > target),
        estimate.n_data,
        estimate.n_batches,
        estimate.full_data,
        False,
        delta_star,
        math.nan,
    )


def _chunked_sum(log_ratio_rows: LogRatioRows, rows: np.ndarray) -> float:
    # In chunks, so that no call holds arrays of more than FULL_PASS_CHUNK rows.
    total = 0.0
    for begin in range(0, rows.size, FULL_PASS_CHUNK):
        total += float(np.sum(log_ratio_rows(rows[begin : begin + FULL_PASS_CHUNK])))
    return total

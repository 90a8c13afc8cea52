"""Evaluate per-row log-ratios in stages of growing batches, shared by the subsampled tests.

Both the sequential t-test (Korattikara et al. 2014, Algorithm 1) and the minibatch Barker test
(Seita et al., Algorithm 1) look at rows in stages of ``batch_size`` rows drawn without
replacement and stop at the first stage where a rule holds. :func:`run_stages` evaluates the
stages in oracle calls of 1, 2, 4, ... stages (``STAGE_GROWTH``) and applies the rule to every
stage boundary of a call in order, so the stopping stage is the one of the stage-by-stage
algorithm on the same rows while the number of calls is logarithmic. Rows evaluated past the
stopping stage (less than the rows used) are reported in ``n_data``. When a call has read all N
rows, the test uses them all and the step makes the exact decision, whatever stage the rule
would have stopped at: those rows are paid for, and an exact decision has no error. So a draw
reports ``full_data`` exactly when its ``n_data`` is N.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial, wraps
from typing import Any, NamedTuple, TypeVar

import numpy as np
from scipy.special import stdtr

from pymc_subsample.kernels.row_sampler import RowSampler

__all__ = ["StageOutcome", "StageStatistics", "evaluated_prefix", "run_stages", "stage_statistics"]

#: Each oracle call of a test evaluates this many times more stages than the previous one.
STAGE_GROWTH = 2
#: The first stage's kurtosis needs its summed squared deviations in this range: above it the
#: fourth powers' sum can overflow, below it the sum's square underflows to 0 (NaN instead).
KURTOSIS_SQUARES_MIN, KURTOSIS_SQUARES_MAX = 1e-150, 1e150

LogRatioRows = Callable[[np.ndarray], np.ndarray]
#: ``rule(stats, prefix)`` returns, per stage of a call, whether the test may stop there;
#: ``prefix(n)`` gives the first n values evaluated in this test.
StopRule = Callable[["StageStatistics", Callable[[int], np.ndarray]], np.ndarray]


class StageStatistics(NamedTuple):
    """Per-stage quantities of the sequential test, one entry per stage boundary."""

    n_values: np.ndarray
    mean: np.ndarray
    std_error: np.ndarray
    test_error: np.ndarray


class StageOutcome(NamedTuple):
    """Where a staged test stopped: the statistics of its last stage and what it cost."""

    mean: float
    std_error: float
    test_error: float
    n_used: int
    n_batches: int
    n_data: int
    full_data: bool
    nonfinite: bool
    chunks: tuple[np.ndarray, ...]
    #: Excess kurtosis of the first stage's values (NaN below 4 values, or when constant or
    #: not finite): the residual diagnostic of a control variate (``residual_kurtosis``).
    first_stage_kurtosis: float = math.nan


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
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        sample_var = np.maximum(shifted_sum_sq - shifted_sum * shifted_mean, 0.0) / (n - 1)
        finite_population = 1.0 - (n - 1) / (n_rows - 1)  # eq. 4
        std_error = np.sqrt(sample_var * finite_population / n)
        t_statistic = np.abs(mean - threshold) / std_error  # eq. 5
        test_error = stdtr(n - 1, -t_statistic)
    return StageStatistics(n_values, mean, std_error, test_error)


def run_stages(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    rows: RowSampler,
    batch_size: int,
    threshold: float,
    stop: StopRule,
) -> StageOutcome:
    """Evaluate stages until ``stop`` allows it or all rows are used.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the rows.
    log_ratio_rows : callable
        ``log_ratio_rows(idx)`` returns the per-row log-ratios ``l_i`` of the int64 rows ``idx``.
    rows : RowSampler
        Row sampler; a new test is started here.
    batch_size : int
        Rows per stage (the papers' m).
    threshold : float
        Threshold of the t-test statistics (``mu_0``); only ``test_error`` depends on it.
    stop : callable
        The stopping rule, see ``StopRule``. The stage that reaches all N rows always stops.

    Returns
    -------
    StageOutcome
        ``nonfinite`` is set, and the test should reject, when some ``l_i`` was NaN or infinite.

    """
    n_rows = rows.n_rows
    rows.start_test()
    values = log_ratio_rows(rows.draw(rng, batch_size))
    chunks = [values]
    total = float(values.sum())
    if not math.isfinite(total):
        return _nonfinite_outcome(1, rows.n_taken, chunks)
    if values.size < 2:  # N = 1: no variance to estimate; the staged path decides on it
        return _later_stages(rng, log_ratio_rows, rows, batch_size, threshold, stop, chunks)
    first = _first_stage(values, total, n_rows, threshold)
    if values.size == n_rows or stop(first.stats, partial(evaluated_prefix, (values,)))[0]:
        return StageOutcome(
            mean=first.mean,
            std_error=first.std_error,
            test_error=first.test_error,
            n_used=values.size,
            n_batches=1,
            n_data=rows.n_taken,
            full_data=values.size == n_rows,
            nonfinite=False,
            chunks=(values,),
            first_stage_kurtosis=first.kurtosis,
        )
    return _later_stages(
        rng, log_ratio_rows, rows, batch_size, threshold, stop, chunks, first.sums, first.kurtosis
    )


def _later_stages(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    rows: RowSampler,
    batch_size: int,
    threshold: float,
    stop: StopRule,
    chunks: list[np.ndarray],
    sums: _Sums | None = None,
    first_stage_kurtosis: float = math.nan,
) -> StageOutcome:
    """Run the stages after the first (all of them when ``sums`` is None), in growing calls."""
    n_rows = rows.n_rows
    n_stages = 0 if sums is None else 1
    stages_per_call = 1 if sums is None else STAGE_GROWTH
    values = chunks[-1]

    def prefix(n_values: int) -> np.ndarray:
        return evaluated_prefix(tuple(chunks), n_values)

    while True:
        if n_stages:
            values = log_ratio_rows(rows.draw(rng, stages_per_call * batch_size))
            chunks.append(values)
            if not math.isfinite(float(values.sum())):
                return _nonfinite_outcome(n_stages + 1, rows.n_taken, chunks)
        if sums is None:
            first_stage = values[:batch_size]
            sums = _Sums(0, float(first_stage.sum()) / first_stage.size, 0.0, 0.0)
        stats, sums = _chunk_stages(values, sums, batch_size, n_rows, threshold)
        stopping = (stats.n_values == n_rows) | stop(stats, prefix)
        decided = stopping.nonzero()[0]
        if decided.size:
            # All N rows read (the last stage of this call holds them all): decide on them.
            k = stats.n_values.size - 1 if rows.n_taken == n_rows else int(decided[0])
            n_used = int(stats.n_values[k])
            return StageOutcome(
                mean=float(stats.mean[k]),
                std_error=float(stats.std_error[k]),
                test_error=float(stats.test_error[k]),
                n_used=n_used,
                n_batches=n_stages + k + 1,
                n_data=rows.n_taken,
                full_data=n_used == n_rows,
                nonfinite=False,
                chunks=tuple(chunks),
                first_stage_kurtosis=first_stage_kurtosis,
            )
        n_stages += stats.n_values.size
        stages_per_call *= STAGE_GROWTH


def _nonfinite_outcome(n_batches: int, n_data: int, chunks: list[np.ndarray]) -> StageOutcome:
    nan = math.nan
    return StageOutcome(nan, nan, nan, 0, n_batches, n_data, False, True, tuple(chunks))


class _FirstStage(NamedTuple):
    stats: StageStatistics
    mean: float
    std_error: float
    test_error: float
    kurtosis: float
    sums: _Sums


_Result = TypeVar("_Result")


def _quiet_overflow(function: Callable[..., _Result]) -> Callable[..., _Result]:
    """Run ``function`` with NumPy's overflow and invalid-value warnings off.

    Finite log-ratios beyond about 1e154 (a diverged trajectory's proposal) square to inf. The
    stage is then undecided (its standard error is inf or NaN, its test error not below any
    tolerance) and the test reads on to the exact decision on all N rows, whose sum the caller
    has checked is finite; NumPy's warning would only be noise to the user. A fresh
    ``np.errstate`` per call, since NumPy 1's is not reentrant.
    """

    @wraps(function)
    def quiet(*args: Any, **kwargs: Any) -> _Result:
        with np.errstate(over="ignore", invalid="ignore"):
            return function(*args, **kwargs)

    return quiet


@_quiet_overflow
def _first_stage(values: np.ndarray, total: float, n_rows: int, threshold: float) -> _FirstStage:
    """Compute the first stage's statistics and its values' excess kurtosis in scalar arithmetic.

    Most draws of a control-variate step decide on their first stage, where NumPy calls on
    length-1 arrays would cost several times the arithmetic (``docs/architecture.md``,
    "Per-draw cost"). The formulas are those of :func:`stage_statistics` (Korattikara et al.
    2014, eqs. 4, 5), shifted by the stage's own mean, whose centred squares also give the
    excess kurtosis ``n sum d^4 / (sum d^2)^2 - 3`` (0 for a Gaussian; NaN below 4 values, for
    constant values, which second-order proxies of a Gaussian likelihood give exactly, and for
    summed squares outside ``KURTOSIS_SQUARES_MIN`` to ``KURTOSIS_SQUARES_MAX``).
    """
    n_values = values.size
    shift = total / n_values
    deviations = values - shift
    squares = deviations * deviations
    shifted_total = float(deviations.sum())
    total_sq = float(squares.sum())
    kurtosis = math.nan
    if n_values >= 4 and KURTOSIS_SQUARES_MIN < total_sq < KURTOSIS_SQUARES_MAX:
        kurtosis = n_values * float(squares @ squares) / (total_sq * total_sq) - 3.0
    mean, std_error, test_error = _t_test(
        n_values, shifted_total, total_sq, shift, n_rows, threshold
    )
    stage = np.array([n_values, mean, std_error, test_error])
    stats = StageStatistics(stage[0:1], stage[1:2], stage[2:3], stage[3:4])
    sums = _Sums(n_values, shift, shifted_total, total_sq)
    return _FirstStage(stats, mean, std_error, test_error, kurtosis, sums)


def _t_test(
    n_values: int,
    shifted_total: float,
    total_sq: float,
    shift: float,
    n_rows: int,
    threshold: float,
) -> tuple[float, float, float]:
    """Mean, standard error (eq. 4) and test error (eq. 5) of one stage, as in stage_statistics."""
    shifted_mean = shifted_total / n_values
    mean = shift + shifted_mean
    sample_var = max(total_sq - shifted_total * shifted_mean, 0.0) / (n_values - 1)
    finite_population = 1.0 - (n_values - 1) / (n_rows - 1) if n_rows > 1 else math.nan
    std_error = math.sqrt(sample_var * finite_population / n_values)
    gap = abs(mean - threshold)
    if std_error > 0.0:
        t_statistic = gap / std_error
    elif std_error == 0.0:
        t_statistic = math.inf if gap > 0.0 else math.nan
    else:  # a NaN spread (squares past 1e308): undecided, as stage_statistics has it
        t_statistic = math.nan
    return mean, std_error, float(stdtr(n_values - 1, -t_statistic))


def evaluated_prefix(chunks: tuple[np.ndarray, ...], n_values: int) -> np.ndarray:
    """Return the first ``n_values`` log-ratios evaluated in a test, in evaluation order.

    Only rules and statistics that need the values themselves (Corollary 1 of Seita et al.)
    call this; the staged test itself keeps running sums and copies nothing.
    """
    if len(chunks) == 1 or chunks[0].size >= n_values:
        return chunks[0][:n_values]
    return np.concatenate(chunks)[:n_values]


@_quiet_overflow
def _chunk_stages(
    values: np.ndarray, sums: _Sums, batch_size: int, n_rows: int, threshold: float
) -> tuple[StageStatistics, _Sums]:
    if values.size <= batch_size and sums.n_values + values.size >= 2:
        return _one_stage(values, sums, n_rows, threshold)
    starts = np.arange(0, values.size, batch_size)
    deviations = values - sums.shift
    cumulative = sums.total + np.add.reduceat(deviations, starts).cumsum()
    cumulative_sq = sums.total_sq + np.add.reduceat(deviations * deviations, starts).cumsum()
    n_values = sums.n_values + np.minimum(starts + batch_size, values.size)
    stats = stage_statistics(n_values, cumulative, cumulative_sq, sums.shift, n_rows, threshold)
    new_sums = _Sums(int(n_values[-1]), sums.shift, float(cumulative[-1]), float(cumulative_sq[-1]))
    return stats, new_sums


def _one_stage(
    values: np.ndarray, sums: _Sums, n_rows: int, threshold: float
) -> tuple[StageStatistics, _Sums]:
    """:func:`stage_statistics` of a call holding one stage, in scalar arithmetic (eqs. 4, 5).

    Called only from :func:`_chunk_stages`, whose overflow warnings are already off.
    """
    deviations = values - sums.shift
    total = sums.total + float(deviations.sum())
    total_sq = sums.total_sq + float(deviations @ deviations)
    n_values = sums.n_values + values.size
    mean, std_error, test_error = _t_test(n_values, total, total_sq, sums.shift, n_rows, threshold)
    stage = np.array([n_values, mean, std_error, test_error])
    stats = StageStatistics(stage[0:1], stage[1:2], stage[2:3], stage[3:4])
    return stats, _Sums(n_values, sums.shift, total, total_sq)

"""The numeric parts of a fused Metropolis-Hastings draw, compiled with Numba.

A fused draw (``docs/architecture.md``, "The fused draw") runs one whole draw of
:class:`~pymc_subsample.AusterityMH` or :class:`~pymc_subsample.MinibatchBarkerMH` in one
compiled call: the proposal, the log prior ratio, the control variate's exact sum, the rows'
draw, their per-row terms (the model's own graph, compiled by PyTensor's Numba backend and
called from the generated driver in ``step_methods/fused_path.py``), the running statistics of
the stages and the test. This module holds what does not depend on the model: the proposal,
the proxies' sum, the row sampler and the stage rule, each a small function of arrays.

The algorithms are those of the Python path, stage for stage: the proposal of
``kernels/proposals.py``, the rows of ``kernels/row_sampler.py`` (without replacement inside a
test; the first batch is stamped only if the test reads further), the stages of
``kernels/stages.py`` (the rule applied at each stage boundary, all N rows read means the exact
decision; the driver makes one call per stage, which costs no Python here, so the rows
evaluated are the rows the test used, where the Python path groups stages into calls of 1, 2,
4, ... and evaluates up to twice the rows it uses), the t-test of Korattikara et al. (2014,
eqs. 4-5, Algorithm 1) and the Barker test of Seita et al. (eqs. 8, 13). Random numbers come from
Numba's generator, seeded from the chain's NumPy generator at the start of every chain: a
fused chain is reproducible for a seed, and its draws differ from the Python path's.
"""

# Numba compiles NumPy's legacy np.random functions to its own per-thread generator (it has no
# Generator it can make cheaply per call: passing one costs 8 us of unboxing), seeded per chain.
# ruff: noqa: NPY002

from __future__ import annotations

import math

import numba
import numpy as np

from pymc_subsample.kernels.stages import KURTOSIS_SQUARES_MAX, KURTOSIS_SQUARES_MIN

__all__ = [
    "AUSTERITY",
    "BARKER",
    "INDEPENDENT",
    "RANDOM_WALK",
    "RESULT_FIELDS",
    "block_rows",
    "block_sums",
    "consume_stages",
    "distance_sq",
    "draw_rows",
    "finish_decision",
    "finite_total",
    "log_uniform_for",
    "no_rows",
    "propose",
    "proxy_difference",
    "seed_generator",
    "start_test",
    "take_matrix_rows",
    "take_values",
]

#: Proposal kinds of :func:`propose`.
RANDOM_WALK, INDEPENDENT = 0, 1
#: Test kinds: the sequential t-test and the minibatch Barker test.
AUSTERITY, BARKER = 0, 1
#: The entries of a draw's result vector, in order (stat names of the steps).
RESULT_FIELDS = (
    "accepted",
    "n_data",
    "n_batches",
    "full_data",
    "nonfinite_proposal",
    "delta_star",
    "residual_kurtosis",
    "variance",
    "distance_sq",
)
# Indices into the stage accumulator: values seen, shift, shifted sum and sum of squares,
# first-stage kurtosis, then the stopping stage's mean, standard error, values used, stage.
_SEEN, _SHIFT, _TOTAL, _TOTAL_SQ, _KURTOSIS, _MEAN, _STD_ERROR, _USED, _STAGE = range(9)
#: Length of the stage accumulator that :func:`consume_stages` fills.
ACCUMULATOR_SIZE = 9
# Indices into the row sampler's counters: next stamp, the test's first stamp, rows taken,
# whether the first batch is still unstamped.
_NEXT_STAMP, _TEST_START, _TAKEN, _UNSTAMPED = range(4)

_jit = numba.njit(cache=True)


@_jit
def seed_generator(seed: int) -> None:
    """Seed Numba's generator of this thread (a chain's start)."""
    np.random.seed(seed)


@_jit
def propose(
    kind: int,
    q: np.ndarray,
    scaling: float,
    factor: np.ndarray,
    inverse_factor: np.ndarray,
    mean: np.ndarray,
) -> tuple[np.ndarray, float]:
    """Return ``q'`` and ``log q(q | q') - log q(q' | q)`` (``kernels/proposals.py``).

    ``factor`` is the lower-triangular ``L`` of the proposal covariance (a diagonal one as a
    diagonal matrix). Random walk: ``q + scaling L z``, ratio 0. Independent: ``mean + L z``,
    ratio ``(|z|^2 - |L^{-1} (q - mean)|^2) / 2``.
    """
    d = q.size
    # Scalar draws and loops rather than NumPy's array functions: the same numbers, and
    # Numba types and compiles loops in a fraction of the time (a new environment's first
    # build compiles these kernels; docs/architecture.md, "The fused draw").
    noise = np.empty(d)
    noise_sq = 0.0
    for i in range(d):
        noise[i] = np.random.standard_normal()
        noise_sq += noise[i] * noise[i]
    step = np.empty(d)
    for i in range(d):
        total = 0.0
        for j in range(i + 1):
            total += factor[i, j] * noise[j]
        step[i] = total
    if kind == RANDOM_WALK:
        return q + scaling * step, 0.0
    whitened_sq = 0.0
    for i in range(d):
        total = 0.0
        for j in range(i + 1):
            total += inverse_factor[i, j] * (q[j] - mean[j])
        whitened_sq += total * total
    return mean + step, 0.5 * (noise_sq - whitened_sq)


@_jit
def proxy_difference(
    q_new: np.ndarray,
    q_old: np.ndarray,
    reference: np.ndarray,
    gradient_sum: np.ndarray,
    hessian_sum: np.ndarray,
    order: int,
) -> float:
    """``R``: the Taylor proxies' exact total difference (``kernels/control_variates.py``)."""
    d = q_new.size
    total = 0.0
    for i in range(d):
        total += gradient_sum[i] * (q_new[i] - q_old[i])
    if order == 2:
        quadratic = 0.0
        for i in range(d):
            row = 0.0
            for j in range(d):
                row += hessian_sum[i, j] * (q_new[j] + q_old[j] - 2.0 * reference[j])
            quadratic += (q_new[i] - q_old[i]) * row
        total += 0.5 * quadratic
    return total


@_jit
def distance_sq(q: np.ndarray, reference: np.ndarray, precision: np.ndarray) -> float:
    """``(q - q*)^T P (q - q*)``, the control variate's ``reference_distance`` squared."""
    d = q.size
    total = 0.0
    for i in range(d):
        row = 0.0
        for j in range(d):
            row += precision[i, j] * (q[j] - reference[j])
        total += (q[i] - reference[i]) * row
    return total


@_jit
def log_uniform_for(test: int) -> float:
    """``log u`` for the t-test's threshold (eq. 2), drawn before the rows; 0 for Barker."""
    if test != AUSTERITY:
        return 0.0
    u = np.random.random()
    return math.log(u) if u > 0.0 else -math.inf


@_jit
def start_test(counters: np.ndarray, accumulator: np.ndarray) -> None:
    """Begin a test: every row is available again (O(1)), the statistics are empty."""
    counters[_TEST_START] = counters[_NEXT_STAMP]
    counters[_TAKEN] = 0
    counters[_UNSTAMPED] = 0
    for k in range(accumulator.size):
        accumulator[k] = 0.0
    accumulator[_KURTOSIS] = math.nan


@_jit
def _stamp(rows: np.ndarray, stamps: np.ndarray, counters: np.ndarray) -> None:
    for row in rows:
        stamps[row] = counters[_NEXT_STAMP]
        counters[_NEXT_STAMP] += 1


@_jit
def _draw_untaken(
    n_rows: int, size: int, stamps: np.ndarray, counters: np.ndarray, proposals: np.ndarray
) -> np.ndarray:
    # Uniform proposals, a taken row rejected and drawn again: each row kept is uniform over
    # the rows not yet taken, so the batch is a uniform sample without replacement.
    rows = np.empty(size, dtype=np.int64)
    start = counters[_TEST_START]
    for k in range(size):
        row = proposals[k] if k < proposals.size else np.random.randint(0, n_rows)
        while stamps[row] >= start:
            row = np.random.randint(0, n_rows)
        stamps[row] = counters[_NEXT_STAMP]
        counters[_NEXT_STAMP] += 1
        rows[k] = row
    return rows


@_jit
def _distinct(rows: np.ndarray) -> bool:
    """Whether no row repeats: a hash set of twice the batch's size, O(b), no O(N) memory.

    The rows are uniform draws, so their low bits index the table evenly (linear probing).
    Numba's sort of a 100-row batch cost 2.4 us, a third of the residuals' own cost.
    """
    capacity = 1
    while capacity < 2 * rows.size:
        capacity *= 2
    table = np.empty(capacity, dtype=np.int64)
    for slot in range(capacity):
        table[slot] = -1
    mask = capacity - 1
    for row in rows:
        slot = row & mask
        while table[slot] != -1:
            if table[slot] == row:
                return False
            slot = (slot + 1) & mask
        table[slot] = row
    return True


@_jit
def _shuffle(rows: np.ndarray) -> None:
    """Shuffle in place (Fisher-Yates, as ``np.random.shuffle``)."""
    for i in range(rows.size - 1, 0, -1):
        j = np.random.randint(0, i + 1)
        rows[i], rows[j] = rows[j], rows[i]


@_jit
def _first_above(sorted_values: np.ndarray, value: float) -> int:
    """``np.searchsorted(sorted_values, value, side="right")`` by bisection."""
    low, high = 0, sorted_values.size
    while low < high:
        middle = (low + high) // 2
        if sorted_values[middle] <= value:
            low = middle + 1
        else:
            high = middle
    return low


@_jit
def draw_rows(
    n_rows: int,
    size: int,
    stamps: np.ndarray,
    counters: np.ndarray,
    first: np.ndarray,
    remaining: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw up to ``size`` rows not yet drawn in this test (``kernels/row_sampler.py``).

    Returns the rows, the test's unstamped first batch (empty once stamped) and the shuffled
    untaken rows (empty until the test needs more than half the rows: then listing them is
    O(N), as the test's own cost already is).
    """
    taken = counters[_TAKEN]
    size = min(size, n_rows - taken)
    empty = np.empty(0, dtype=np.int64)
    if taken == 0 and 2 * size <= n_rows:
        proposals = np.empty(size, dtype=np.int64)
        for k in range(size):
            proposals[k] = np.random.randint(0, n_rows)
        counters[_TAKEN] = size
        if _distinct(proposals):
            counters[_UNSTAMPED] = 1
            return proposals, proposals, remaining
        return _draw_untaken(n_rows, size, stamps, counters, proposals), empty, remaining
    if counters[_UNSTAMPED] == 1:
        _stamp(first, stamps, counters)
        counters[_UNSTAMPED] = 0
        first = empty
    if remaining.size == 0 and 2 * (taken + size) > n_rows:
        remaining = np.empty(n_rows - taken, dtype=np.int64)
        start, k = counters[_TEST_START], 0
        for row in range(n_rows):
            if stamps[row] < start:
                remaining[k] = row
                k += 1
        _shuffle(remaining)
    counters[_TAKEN] = taken + size
    if remaining.size > 0:
        offset = taken - (n_rows - remaining.size)
        return remaining[offset : offset + size], first, remaining
    return _draw_untaken(n_rows, size, stamps, counters, empty), first, remaining


@_jit
def no_rows() -> np.ndarray:
    """Return an empty array of row numbers (a test's rows before its first stage).

    The driver makes its arrays through cached kernels: NumPy's ``empty`` in the generated
    source is compiled again with the driver at every cold build (``docs/architecture.md``,
    "The fused draw").
    """
    return np.empty(0, dtype=np.int64)


@_jit
def take_values(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Return ``array[rows]`` of a 1-D array, a new C-ordered array (a stage's rows).

    A loop rather than NumPy's fancy indexing, which Numba compiles with the driver at every
    cold build (0.5 s, its broadcasting included); only the stage's rows are read.
    """
    gathered = np.empty(rows.size, dtype=array.dtype)
    for k in range(rows.size):
        gathered[k] = array[rows[k]]
    return gathered


@_jit
def take_matrix_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Return ``array[rows]`` of a 2-D array (a design matrix), as :func:`take_values` does."""
    gathered = np.empty((rows.size, array.shape[1]), dtype=array.dtype)
    for k in range(rows.size):
        row = rows[k]
        for j in range(array.shape[1]):
            gathered[k, j] = array[row, j]
    return gathered


@_jit
def finite_total(values: np.ndarray) -> bool:
    """Whether the sum of ``values`` is finite (a stage with a NaN or infinite term is not)."""
    total = 0.0
    for value in values:
        total += value
    return bool(np.isfinite(total))


@_jit
def block_rows(units: np.ndarray, block: int, n_rows: int) -> np.ndarray:
    """Return every row of the blocks ``units``, block after block.

    Unit ``b`` is rows ``b * block`` to ``min((b + 1) * block, n_rows) - 1`` (the last block
    may be shorter).
    """
    total = 0
    for unit in units:
        total += min(block, n_rows - unit * block)
    rows = np.empty(total, dtype=np.int64)
    k = 0
    for unit in units:
        for row in range(unit * block, min((unit + 1) * block, n_rows)):
            rows[k] = row
            k += 1
    return rows


@_jit
def block_sums(values: np.ndarray, units: np.ndarray, block: int, n_rows: int) -> np.ndarray:
    """Sum the values of :func:`block_rows`'s rows by block: one value per unit."""
    sums = np.zeros(units.size)
    k = 0
    for u in range(units.size):
        for _ in range(min(block, n_rows - units[u] * block)):
            sums[u] += values[k]
            k += 1
    return sums


@_jit
def consume_stages(
    values: np.ndarray,
    batch_size: int,
    n_rows: int,
    all_read: bool,
    test: int,
    threshold: float,
    scale: float,
    critical: np.ndarray,
    accumulator: np.ndarray,
) -> bool:
    """Add one call's values stage by stage; return whether the test stops in this call.

    Each stage boundary gets the statistics of ``stages.stage_statistics`` (the mean, eq. 4's
    standard error with the finite-population correction, sums shifted by the first stage's
    mean) and the test's rule: the t-test stops when ``|mean - threshold| / se`` exceeds
    ``critical[stage]``, the ``1 - epsilon`` quantile of Student's t with ``n - 1`` degrees of
    freedom (``delta < epsilon`` of Algorithm 1); Barker stops when ``(scale se)^2 < 1`` with
    ``scale = N / (T sigma)``, i.e. ``s^2 < sigma^2`` for the correction's sigma. When the call
    has read all N rows (``all_read``) the test decides on all of them. The first stage also
    gives the excess kurtosis of its values.
    """
    seen = int(accumulator[_SEEN])
    if seen == 0:
        first_size = min(batch_size, values.size)
        shift = 0.0
        for k in range(first_size):
            shift += values[k]
        shift /= first_size
        accumulator[_SHIFT] = shift
        if first_size >= 4:
            total_sq = 0.0
            fourth = 0.0
            for k in range(first_size):
                square = (values[k] - shift) ** 2
                total_sq += square
                fourth += square * square
            if KURTOSIS_SQUARES_MIN < total_sq < KURTOSIS_SQUARES_MAX:
                accumulator[_KURTOSIS] = first_size * fourth / (total_sq * total_sq) - 3.0
    shift = accumulator[_SHIFT]
    total, total_sq = accumulator[_TOTAL], accumulator[_TOTAL_SQ]
    stage = int(accumulator[_STAGE])
    start = 0
    while start < values.size:
        end = min(start + batch_size, values.size)
        for k in range(start, end):
            deviation = values[k] - shift
            total += deviation
            total_sq += deviation * deviation
        seen += end - start
        stage += 1
        start = end
        last = start >= values.size
        if all_read and not last:
            continue
        shifted_mean = total / seen
        mean = shift + shifted_mean
        variance = max(total_sq - total * shifted_mean, 0.0) / (seen - 1) if seen > 1 else 0.0
        finite_population = 1.0 - (seen - 1) / (n_rows - 1) if n_rows > 1 else 0.0
        std_error = math.sqrt(variance * finite_population / seen)
        if seen == n_rows:
            stop = True
        elif test == AUSTERITY:
            gap = abs(mean - threshold)
            if std_error > 0.0:
                stop = gap / std_error > critical[stage - 1]
            else:  # no spread decides; a NaN one (squares past 1e308) reads on
                stop = std_error == 0.0 and gap > 0.0
        else:
            spread = scale * std_error
            stop = spread * spread < 1.0
        if stop:
            accumulator[_MEAN] = mean
            accumulator[_STD_ERROR] = std_error
            accumulator[_USED] = seen
            accumulator[_STAGE] = stage
            return True
    accumulator[_SEEN] = seen
    accumulator[_TOTAL] = total
    accumulator[_TOTAL_SQ] = total_sq
    accumulator[_STAGE] = stage
    return False


@_jit
def finish_decision(
    test: int,
    nonfinite: bool,
    log_prior_proposal_ratio: float,
    log_u: float,
    n_rows: int,
    temperature: float,
    accumulator: np.ndarray,
    counters: np.ndarray,
    correction_support: np.ndarray,
    correction_cumulative: np.ndarray,
    correction_sd: float,
    result: np.ndarray,
) -> bool:
    """Make the test's decision from the stopping stage and fill ``result``; return it.

    The t-test accepts when the mean exceeds the threshold, or on all rows when the exact
    log ratio exceeds ``log u`` (``kernels/austerity.py``). Barker accepts when
    ``Delta* + X_nc + X_corr > 0`` (eq. 13), with ``X_nc ~ N(0, sigma^2 - s^2)`` and ``X_corr``
    by inverse CDF from the correction table for ``sigma = correction_sd``, or on all rows when
    ``Delta*`` plus logistic noise is positive (eq. 10).
    """
    n_data = counters[_TAKEN]
    for k in range(8):  # the test's entries; distance_sq and what follows are the driver's
        result[k] = 0.0
    result[1] = n_data
    result[2] = accumulator[_STAGE]
    result[6] = accumulator[_KURTOSIS]
    result[7] = math.nan
    if nonfinite:
        result[4] = 1.0
        result[5] = -math.inf
        return False
    mean = accumulator[_MEAN]
    full_data = accumulator[_USED] == n_rows
    delta_star = mean * n_rows / temperature + log_prior_proposal_ratio
    if test == AUSTERITY:
        if full_data:
            accepted = delta_star > log_u
        else:
            accepted = mean > temperature * (log_u - log_prior_proposal_ratio) / n_rows
    elif full_data:
        u = np.random.random()
        accepted = delta_star + math.log(u / (1.0 - u)) > 0.0
        result[7] = 0.0
    else:
        spread = accumulator[_STD_ERROR] * n_rows / temperature
        variance = spread * spread
        noise = math.sqrt(correction_sd**2 - variance) * np.random.standard_normal()
        index = _first_above(correction_cumulative, np.random.random())
        noise += correction_support[min(index, correction_support.size - 1)]
        accepted = delta_star + noise > 0.0
        result[7] = variance
    result[0] = 1.0 if accepted else 0.0
    result[3] = 1.0 if full_data else 0.0
    result[5] = delta_star
    return accepted

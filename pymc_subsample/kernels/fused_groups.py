"""The numeric parts of a group sweep's fused decisions, compiled with Numba.

A group sweep (``kernels/group_effects.py``) proposes new effects for every group and decides
each group on its own rows (``kernels/group_tests.py``). Its fused decisions
(``docs/architecture.md``, "Group effects") run that second half in one compiled call: the
rows of the groups read whole, the stages of the sampled groups (rows drawn, gathered from the
user's arrays, their residuals from the model's own graph, running statistics, the test), the
groups the test was not sure of read whole, and every exact decision. Only the driver that
calls the model's compiled functions is generated per model
(``step_methods/fused_group_path.py``); this module holds what does not depend on the model.

The algorithms are those of the Python path, stage for stage: rows drawn with replacement
inside the group, each stage reading :data:`~pymc_subsample.kernels.group_tests.STAGE_GROWTH`
times the rows read so far, the t-test of Korattikara et al. (2014, Algorithm 1, eq. 2 with the
group as the population) through the Student-t quantile of each stage's row count, and the
Barker test of Seita et al. (2018, eqs. 10 and 13). Random numbers come from Numba's generator,
seeded from the chain's generator at its start (``kernels/fused.seed_generator``).
"""

# Numba compiles NumPy's legacy np.random functions to its own per-thread generator, seeded per
# chain (``kernels/fused.py``).
# ruff: noqa: NPY002

from __future__ import annotations

import math

import numba
import numpy as np

from pymc_subsample.kernels.group_tests import ESTIMATE_SD, STAGE_GROWTH

__all__ = [
    "AUSTERITY",
    "BARKER",
    "COUNT_FIELDS",
    "add_by_group",
    "add_sweep_counts",
    "all_groups",
    "consume_group_stage",
    "draw_group_rows",
    "finish_groups",
    "new_counts",
    "no_groups",
    "rows_of_groups",
    "stage_rows",
    "start_decisions",
]

#: Test kinds: the sequential t-test and the minibatch Barker test.
AUSTERITY, BARKER = 0, 1
#: The entries of the decisions' counts vector, in order (stat names of the step).
COUNT_FIELDS = ("n_data", "n_full_groups", "n_nonfinite")
_N_COUNTS = len(COUNT_FIELDS)
# Columns of the per-group running statistics: rows read, first stage's mean (the shift),
# shifted sum and sum of squares.
_COUNT, _SHIFT, _TOTAL, _SQUARES = range(4)

# NumPy semantics for floats: a stage whose residuals are all equal has a zero standard error,
# and |mean - threshold| / 0 is inf (confident), as in the Python path.
_jit = numba.njit(cache=True, error_model="numpy")


def stage_rows(batch_size: int, largest_group: int) -> np.ndarray:
    """Rows read by the end of each stage that a group of ``largest_group`` rows can reach.

    Stage ``s`` reads ``batch_size * STAGE_GROWTH**s`` rows, so its total is
    ``batch_size * (1 + STAGE_GROWTH + ... + STAGE_GROWTH**s)``; the t-test's quantile is
    computed once per step for each of these counts.
    """
    totals = []
    draw, total = batch_size, 0
    while True:
        total += draw
        totals.append(total)
        if total >= largest_group:
            return np.asarray(totals, dtype=np.int64)
        draw *= STAGE_GROWTH


# The drivers' arrays are made by these kernels, not by NumPy calls in the generated source:
# Numba compiles NumPy's functions for each process that compiles a caller, where these are
# compiled once, cached by the kernels' warm-up, and loaded by the helper that compiles the
# drivers (``docs/architecture.md``, "Group effects").


@_jit
def start_decisions(
    rest: np.ndarray, whole: np.ndarray, exact_only: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return a sweep's decisions' buffers, and the groups read whole and those tested.

    A group is live where ``rest`` is finite. Returned: each group's ``likelihood`` change (0,
    to add its rows' into), ``on_all_rows`` (the live groups read whole), ``unsure`` (the
    groups to read whole after the stages: with ``exact_only``, the t-test at epsilon 0, every
    other live group), ``active`` (the live groups tested in stages, in order; none with
    ``exact_only``) and the stages' running ``statistics`` (groups x 4).
    """
    n_groups = rest.size
    likelihood = np.zeros(n_groups)
    on_all_rows = np.zeros(n_groups, dtype=np.bool_)
    unsure = np.zeros(n_groups, dtype=np.bool_)
    tested = np.empty(n_groups, dtype=np.int64)
    n_tested = 0
    for g in range(n_groups):
        if not math.isfinite(rest[g]):
            continue
        if whole[g]:
            on_all_rows[g] = True
        elif exact_only:
            unsure[g] = True
        else:
            tested[n_tested] = g
            n_tested += 1
    return likelihood, on_all_rows, unsure, tested[:n_tested], np.zeros((n_groups, 4))


@_jit
def all_groups(n_groups: int) -> np.ndarray:
    """Return a flag per group, every one set."""
    return np.ones(n_groups, dtype=np.bool_)


@_jit
def no_groups(n_groups: int) -> np.ndarray:
    """Return a flag per group, none set (a sweep's acceptances before its decisions)."""
    return np.zeros(n_groups, dtype=np.bool_)


@_jit
def new_counts(counts: np.ndarray) -> np.ndarray:
    """Return zero counts shaped like ``counts`` (one sweep's: its decisions overwrite them)."""
    return np.zeros(counts.size, dtype=np.int64)


@_jit
def add_sweep_counts(counts: np.ndarray, sweep_counts: np.ndarray, accept: np.ndarray) -> None:
    """Add one sweep's decision counts (:data:`COUNT_FIELDS`) and accepted groups to ``counts``."""
    for field in range(_N_COUNTS):
        counts[field] += sweep_counts[field]
    for g in range(accept.size):
        if accept[g]:
            counts[_N_COUNTS] += 1


@_jit
def rows_of_groups(
    order: np.ndarray, starts: np.ndarray, chosen: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every row of the groups where ``chosen`` is True, and the group of each."""
    n_groups = chosen.size
    total = 0
    for g in range(n_groups):
        if chosen[g]:
            total += starts[g + 1] - starts[g]
    rows = np.empty(total, dtype=np.int64)
    owners = np.empty(total, dtype=np.int64)
    k = 0
    for g in range(n_groups):
        if chosen[g]:
            for position in range(starts[g], starts[g + 1]):
                rows[k] = order[position]
                owners[k] = g
                k += 1
    return rows, owners


@_jit
def add_by_group(values: np.ndarray, owners: np.ndarray, likelihood: np.ndarray) -> None:
    """Add each row's value into its group's entry of ``likelihood`` (started at 0)."""
    for k in range(values.size):
        likelihood[owners[k]] += values[k]


@_jit
def draw_group_rows(
    order: np.ndarray, starts: np.ndarray, active: np.ndarray, draw: int
) -> np.ndarray:
    """``draw`` rows of each active group, drawn with replacement, group after group."""
    rows = np.empty(active.size * draw, dtype=np.int64)
    k = 0
    for g in active:
        start = starts[g]
        size = starts[g + 1] - start
        for _ in range(draw):
            rows[k] = order[start + int(np.random.random() * size)]
            k += 1
    return rows


@_jit
def consume_group_stage(
    values: np.ndarray,
    active: np.ndarray,
    draw: int,
    stage: int,
    sizes: np.ndarray,
    statistics: np.ndarray,
    known: np.ndarray,
    log_u: np.ndarray,
    test: int,
    critical: np.ndarray,
    correction_support: np.ndarray,
    correction_cumulative: np.ndarray,
    correction_sd: float,
    accept: np.ndarray,
    unsure: np.ndarray,
) -> np.ndarray:
    """Add one stage's residuals to each active group's statistics and decide those it can.

    ``values`` holds ``draw`` residuals per active group, in ``active``'s order. A group is
    decided when its estimate is finite, its standard error (times its size) is at most
    ``ESTIMATE_SD``, and the test is confident: the t-test when ``|mean - threshold| / se``
    exceeds ``critical[stage]`` (the ``t_{m-1}`` quantile ``1 - epsilon``, Korattikara et al.
    2014, Algorithm 1, line 7, threshold ``(log u - known) / n_g``), the Barker test when
    ``s^2 = (n_g se)^2 < sigma^2`` (Seita et al. 2018, Algorithm 1; accept iff
    ``Delta* + X_nc + X_corr > 0``, eq. 13). A group left undecided whose next stage would
    read as many rows as it holds, or whose estimate is not finite, is marked ``unsure``.
    Returns the groups still active.
    """
    left = np.empty(active.size, dtype=np.int64)
    n_left = 0
    for a in range(active.size):
        g = active[a]
        first = a * draw
        if statistics[g, _COUNT] == 0.0:  # the first stage: shift by its mean (stable sums)
            shift = 0.0
            for k in range(first, first + draw):
                shift += values[k]
            statistics[g, _SHIFT] = shift / draw
        shift = statistics[g, _SHIFT]
        total = 0.0
        squares = 0.0
        for k in range(first, first + draw):
            centred = values[k] - shift
            total += centred
            squares += centred * centred
        statistics[g, _TOTAL] += total
        statistics[g, _SQUARES] += squares
        statistics[g, _COUNT] += draw
        m = statistics[g, _COUNT]
        mean_centred = statistics[g, _TOTAL] / m
        variance = max(statistics[g, _SQUARES] - m * mean_centred * mean_centred, 0.0) / (m - 1)
        mean = shift + mean_centred
        error = math.sqrt(variance / m)
        size = sizes[g]
        finite = math.isfinite(mean) and math.isfinite(error)
        confident = False
        if finite and size * error <= ESTIMATE_SD:
            if test == BARKER:
                spread_sq = (size * error) ** 2
                if spread_sq < correction_sd * correction_sd:
                    confident = True
                    noise = math.sqrt(correction_sd * correction_sd - spread_sq)
                    noise *= np.random.standard_normal()
                    index = int(np.searchsorted(correction_cumulative, np.random.random(), "right"))
                    noise += correction_support[min(index, correction_support.size - 1)]
                    accept[g] = known[g] + size * mean + noise > 0.0
            else:
                threshold = (log_u[g] - known[g]) / size
                if abs(mean - threshold) / error > critical[stage]:
                    confident = True
                    accept[g] = mean > threshold
        if confident:
            continue
        if not finite or size <= m + STAGE_GROWTH * draw:
            unsure[g] = True
        else:
            left[n_left] = g
            n_left += 1
    return left[:n_left]


@_jit
def finish_groups(
    likelihood: np.ndarray,
    rest: np.ndarray,
    log_u: np.ndarray,
    on_all_rows: np.ndarray,
    test: int,
    accept: np.ndarray,
    counts: np.ndarray,
) -> None:
    """Decide every group read whole on its exact change, and count the non-finite ones.

    ``Delta_g = L_g(x') - L_g(x) + rest_g``: the t-test's exact decision is
    Metropolis-Hastings (``Delta_g > log u``); the Barker test's adds logistic noise (Seita et
    al. 2018, eq. 10). A group whose ``rest_g`` (the prior and proposal ratio) or whose exact
    change is not finite is rejected. ``counts`` gets the groups read whole and the non-finite.
    """
    full = 0
    nonfinite = 0
    for g in range(rest.size):
        if not math.isfinite(rest[g]):
            accept[g] = False
            nonfinite += 1
            continue
        if not on_all_rows[g]:
            continue
        full += 1
        delta = likelihood[g] + rest[g]
        if not math.isfinite(likelihood[g]):
            accept[g] = False
            nonfinite += 1
        elif test == BARKER:
            u = np.random.random()
            accept[g] = delta + math.log(u / (1.0 - u)) > 0.0
        else:
            accept[g] = delta > log_u[g]
    counts[1] = full
    counts[2] = nonfinite

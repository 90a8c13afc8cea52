"""Gibbs updates of binary variables decided by the sequential test.

Korattikara et al. (2014), supplementary F. A Gibbs update of ``x_j`` sets ``x_j = 1`` with
probability ``P(x_j = 1 | x_-j) = sigmoid(Delta_j)`` (eq. 39), where ``Delta_j = log P(x_j = 1,
x_-j) - log P(x_j = 0, x_-j)``. When the joint density is a product of N terms, ``Delta_j`` is
``N mu`` (eq. 42, ``mu`` the mean of the terms' log ratios) plus the prior's log ratio, and the
update is the decision ``Delta_j > logit(u)`` (eq. 40-41): the sequential t-test of Algorithm 1
with Barker's rule (``kernels/austerity.py``, ``rule="barker"``) decides it from a subsample of
the terms, with an error in the conditional probability bounded through ``error_tolerance``
(Theorem 4 bounds the stationary distribution's error by it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from pymc_subsample.kernels.austerity import exact_mh_test, sequential_mh_test
from pymc_subsample.kernels.row_sampler import RowSampler

__all__ = ["GibbsSweepInfo", "binary_gibbs_sweep"]

#: ``(q_one, q_zero, rows) -> l_i``: per-row log ratios of the terms at ``x_j = 1`` and ``0``.
RowRatios = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
#: ``(q_one, q_zero) -> log prior(q_one) - log prior(q_zero)``.
PriorRatio = Callable[[np.ndarray, np.ndarray], float]


class GibbsSweepInfo(NamedTuple):
    """What one sweep did; the field names are the step's stat names."""

    #: Rows (terms) read in the sweep, all updates together.
    n_data: int
    #: Binary entries updated (each once per sweep).
    n_updates: int
    #: Entries whose value changed.
    n_changed: int
    #: Updates that read all N rows (and so decided exactly).
    n_full_data: int
    #: Updates whose log ratio was not finite (the entry is kept: the chain's current value has
    #: a finite density, so the other one is impossible, or undefined where a term is NaN).
    n_nonfinite: int


def binary_gibbs_sweep(
    rng: np.random.Generator,
    q: np.ndarray,
    positions: np.ndarray,
    row_ratios: RowRatios,
    prior_ratio: PriorRatio,
    rows: RowSampler,
    error_tolerance: float,
    batch_size: int,
) -> tuple[np.ndarray, GibbsSweepInfo]:
    """Update each binary entry ``q[positions]`` once, in the given order.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws each update's ``u``, then its rows.
    q : ndarray
        The current point (binary entries 0.0 or 1.0); not modified.
    positions : ndarray of int
        The entries to update, in order.
    row_ratios : callable
        ``row_ratios(q_one, q_zero, rows)``: ``l_i`` at ``x_j = 1`` against ``x_j = 0``.
    prior_ratio : callable
        ``prior_ratio(q_one, q_zero)``: the prior's log ratio.
    rows : RowSampler
        Row sampler over the N terms.
    error_tolerance : float
        The test's epsilon; 0 reads every row (exact Gibbs).
    batch_size : int
        Rows per stage of the test.

    Returns
    -------
    q_new : ndarray
        The point after the sweep (a new array).
    info : GibbsSweepInfo
    """
    q_new = np.array(q, dtype=np.float64, copy=True)
    n_data = n_changed = n_full = n_nonfinite = 0
    for position in positions:
        q_one = q_new.copy()
        q_one[position] = 1.0
        q_zero = q_new.copy()
        q_zero[position] = 0.0
        log_ratio_rows = partial(row_ratios, q_one, q_zero)
        log_prior_ratio = float(prior_ratio(q_one, q_zero))
        if error_tolerance == 0.0:
            decision = exact_mh_test(
                rng, log_ratio_rows, rows.n_rows, log_prior_ratio, rule="barker"
            )
        else:
            decision = sequential_mh_test(
                rng,
                log_ratio_rows,
                rows,
                log_prior_ratio,
                error_tolerance,
                batch_size,
                rule="barker",
            )
        n_data += decision.n_data
        n_full += decision.full_data
        value = 1.0 if decision.accepted else 0.0
        if decision.nonfinite_proposal:
            n_nonfinite += 1
            value = float(q_new[position])
        n_changed += value != q_new[position]
        q_new[position] = value
    info = GibbsSweepInfo(n_data, len(positions), int(n_changed), n_full, n_nonfinite)
    return q_new, info

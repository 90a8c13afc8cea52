"""The reference search's full-data objective and its line search (``reference_search.py``).

The search (Korattikara, Chen and Welling 2016, section 2, Algorithm 1, as
``reference_search.py`` runs it) takes each accepted update with a backtracking (Armijo) step
on the minibatch's own objective, and judges its result on the full-data log posterior: both
read the rows chunk by chunk, or in one pass on every core where the pass is shared
(``model/parallel_pass.py``).
"""

from __future__ import annotations

import numpy as np

from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.model.row_data import Rows, row_chunks, row_count

__all__ = ["ARMIJO", "CHUNK", "MAX_HALVINGS", "line_search", "log_posterior", "loglik_sum"]

#: Armijo's sufficient-increase constant and the most halvings of a step.
ARMIJO = 1e-4
MAX_HALVINGS = 40
#: Rows per chunk of the full-data log posterior and of the search's sums over rows.
CHUNK = 8192


def log_posterior(oracles: ModelOracles, q: np.ndarray, counts: dict[str, int]) -> float:
    """Full-data log posterior, summed in chunks of rows; -inf where it is not finite."""
    # Far from the mode the row densities may overflow: that is a -inf (rejected) point here.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        total = oracles.setup_log_prior(q) + loglik_sum(oracles, q, slice(0, oracles.n_rows))
    counts["loglik"] += oracles.n_rows
    return total if np.isfinite(total) else -np.inf


def line_search(
    oracles: ModelOracles,
    q: np.ndarray,
    step: np.ndarray,
    rows: Rows,
    loglik: float,
    decrement: float,
    counts: dict[str, int],
    alpha: float = 1.0,
) -> tuple[np.ndarray, float | None]:
    """Backtrack from ``alpha`` times the step until the minibatch objective rises (Armijo).

    ``loglik`` is the rows' summed log-likelihood at ``q`` (from the iteration's pass), so
    each trial reads the rows once. Returns the new point and, when ``rows`` are all the rows
    (a slice), the full-data log posterior there (None otherwise).
    """
    n_used = row_count(rows, oracles.n_rows)
    scale = oracles.n_rows / n_used
    for _ in range(MAX_HALVINGS):
        candidate = q + alpha * step
        counts["loglik"] += n_used
        # A long trial step may overflow the row densities: a non-finite gain rejects it. The
        # sums' rounding error (about 1e-16 of the sum per row summed, 1e-9 at N = 1e7) is far
        # below the smallest gain a line search asks for, 1e-4 of a decrement above 1e-4.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            value = loglik_sum(oracles, candidate, rows)
            gain = oracles.setup_log_prior_ratio(candidate, q) + scale * (value - loglik)
        if np.isfinite(gain) and gain >= ARMIJO * alpha * decrement:
            if not isinstance(rows, slice):
                return candidate, None
            total = oracles.setup_log_prior(candidate) + value
            return candidate, total if np.isfinite(total) else None
        alpha *= 0.5
    return q, None


def loglik_sum(oracles: ModelOracles, q: np.ndarray, rows: Rows) -> float:
    """Sum the rows' log-likelihoods at ``q``, chunk by chunk (a slice read in place).

    Every row: on every core where the pass is shared (:meth:`ModelOracles.loglik_total`).
    """
    if isinstance(rows, slice) and row_count(rows, oracles.n_rows) == oracles.n_rows:
        total = oracles.loglik_total(q)
        if total is not None:
            return total
    if isinstance(rows, slice):
        pieces: list[Rows] = list(row_chunks(oracles.n_rows, CHUNK))
    else:
        pieces = [rows[begin : begin + CHUNK] for begin in range(0, rows.size, CHUNK)]
    return sum(float(oracles.loglik_rows(q, piece).sum()) for piece in pieces)

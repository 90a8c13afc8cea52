"""Where SGFS starts: the reference point and the empirical Fisher information there.

SGFS (Ahn, Korattikara and Welling 2012) has no accept step, contracts towards the mode by
about ``2 n / N`` per step, and preconditions with an online average of the minibatches'
empirical Fisher information (eq. 12). Started at the model's initial point it spends its
tuning far from the mode, where that average is wrong, and keeps it: on a 5-parameter linear
regression (N = 1e5) its posterior sds came out up to 4x too wide. Started at the reference
point, with the average seeded by the Fisher information there, it starts where the
Bernstein-von Mises approximation it samples holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import cholesky, solve_triangular

from pymc_subsample.kernels.control_variates import mahalanobis_limit
from pymc_subsample.kernels.row_sampler import SparseRowSampler
from pymc_subsample.kernels.sgfs import empirical_fisher
from pymc_subsample.model.oracles import ModelOracles

__all__ = ["FISHER_ROWS", "ReferenceFisher", "reference_fisher", "reference_score_sum"]

#: Rows whose scores give the Fisher information at the reference (all rows when fewer).
FISHER_ROWS = 10_000
#: Rows per call of the score function.
_CHUNK = 8192
#: Fixed seed of the rows drawn: the same model and data give the same start.
_ROWS_SEED = 20_120_626


@dataclass(frozen=True)
class ReferenceFisher:
    """A reference point, the empirical Fisher information there, and what a chain takes of it.

    Attributes
    ----------
    q : ndarray
        The reference point (raveled, unconstrained).
    fisher : ndarray
        Empirical Fisher information per row at ``q`` (d x d, or its diagonal).
    weight : int
        How many minibatches' worth of rows ``fisher`` stands for in the Fisher average.
    factor : ndarray
        Lower Cholesky factor of ``N I`` (the full matrix), the Bernstein-von Mises precision.
    precision : ndarray or None
        The log posterior's negative Hessian at ``q`` (from the reference search's full-data
        sums), or None when not measured.
    """

    q: np.ndarray
    fisher: np.ndarray
    weight: int
    factor: np.ndarray
    precision: np.ndarray | None = None

    def chain_start(self, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Return ``q`` if within the chi-square(d) 1 - 1e-6 limit, else a draw near ``q*``."""
        scaled = self.factor.T @ (q - self.q)  # (q - q*)^T N I (q - q*) = |L^T (q - q*)|^2
        if float(scaled @ scaled) <= mahalanobis_limit(q.size):
            return q
        noise = rng.standard_normal(q.size)
        return self.q + solve_triangular(self.factor.T, noise, lower=False)


def reference_fisher(
    oracles: ModelOracles,
    q_ref: np.ndarray,
    batch_size: int,
    diagonal: bool,
    hessian_sum: np.ndarray | None = None,
) -> ReferenceFisher:
    """Measure the empirical Fisher information at ``q_ref`` on up to :data:`FISHER_ROWS` rows.

    Parameters
    ----------
    oracles : ModelOracles
        The step's oracles (per-row gradients).
    q_ref : ndarray
        The reference point.
    batch_size : int
        The step's minibatch size, for the weight of the measured average.
    diagonal : bool
        Keep the diagonal only (SGFS-d).
    hessian_sum : ndarray, optional
        The rows' summed log-likelihood Hessian at ``q_ref`` (the reference search's), for the
        posterior precision; without it none is kept.

    Returns
    -------
    ReferenceFisher
    """
    n_rows = oracles.n_rows
    sampler = SparseRowSampler(n_rows, oracles.row_proposals())
    sampler.start_test()
    rows = np.sort(sampler.draw(np.random.default_rng(_ROWS_SEED), min(n_rows, FISHER_ROWS)))
    scores = np.concatenate(
        [oracles.score_rows(q_ref, rows[i : i + _CHUNK]) for i in range(0, rows.size, _CHUNK)]
    )
    full = empirical_fisher(scores, diagonal=False)
    precision = n_rows * full
    # A singular Fisher (a parameter no row informs) still needs a bounded start distance.
    precision += np.eye(q_ref.size) * 1e-12 * max(float(np.trace(precision)), 1e-300)
    curvature = None
    if hessian_sum is not None:
        curvature = -(hessian_sum + oracles.log_prior_hessian(q_ref))
    return ReferenceFisher(
        q=np.array(q_ref, dtype="float64"),
        fisher=np.diag(full).copy() if diagonal else full,
        weight=max(1, rows.size // batch_size),
        factor=cholesky(precision, lower=True),
        precision=curvature,
    )


def reference_score_sum(oracles: ModelOracles, q_ref: np.ndarray) -> np.ndarray:
    """``sum_i g_i(q_ref)`` over all N rows: the offset of SGFS's first-order control variate.

    One pass over the data, once per model and data, in chunks of rows through the per-row
    gradient the step compiles anyway (no other function to compile); the draws then read
    ``batch_size`` rows each.
    """
    total = np.zeros(q_ref.size)
    for start in range(0, oracles.n_rows, _CHUNK):
        rows = np.arange(start, min(start + _CHUNK, oracles.n_rows), dtype="int64")
        total += oracles.score_rows(q_ref, rows).sum(axis=0)
    return total

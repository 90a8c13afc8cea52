"""The proposal half of a compiled group sweep, in Numba.

A group sweep (``kernels/group_effects.group_effects_sweep``) builds each group's Newton
proposal from the factor's parts at the current effects, draws it, builds the reverse
proposal at the new effects, and hands every group's prior and proposal ratio ``rest_g`` and
``known_g`` (``rest_g`` plus the control variate's exact part) to the decisions. The compiled
sweep (``step_methods/fused_group_path.py``, ``docs/architecture.md``, "Group effects") does
the same in one Numba call with these functions and ``kernels/group_newton.py``; the
arithmetic is the NumPy path's, expression for expression, so that given the same noise both
reach the same proposal and the same ratios (``tests/test_fused_groups.py``).

The noise is drawn by :func:`fill_sweep_noise` from Numba's generator, seeded per chain
(``kernels/fused.seed_generator``), inside the compiled sweeps, or passed in by a test.
"""

# Numba compiles NumPy's legacy np.random functions to its own per-thread generator.
# ruff: noqa: NPY002

from __future__ import annotations

import math

import numba
import numpy as np

from pymc_subsample.kernels.group_newton import PROPOSAL_DF, proposal_log_density

__all__ = [
    "effects_of",
    "fill_sweep_noise",
    "newton_proposal",
    "proposal_terms",
    "take_groups",
    "with_effects",
]

# NumPy's float semantics: a non-finite group's NaNs propagate, as in the NumPy path.
_jit = numba.njit(cache=True, error_model="numpy")


@_jit
def fill_sweep_noise(normals: np.ndarray, scales: np.ndarray, log_u: np.ndarray) -> None:
    """Draw the noise of ``S`` sweeps in place: ``(S, G, k)`` normals, ``(S, G)`` scales, log u.

    The scale of group g is ``sqrt(nu / chi2_nu)`` (a Student-t draw is a Gaussian one times
    it, :data:`~pymc_subsample.kernels.group_newton.PROPOSAL_DF` degrees of freedom); ``log u``
    is the t-test's uniform on the log scale.
    """
    n_sweeps, n_groups, k = normals.shape
    for s in range(n_sweeps):
        for g in range(n_groups):
            for i in range(k):
                normals[s, g, i] = np.random.standard_normal()
            scales[s, g] = math.sqrt(PROPOSAL_DF / np.random.chisquare(PROPOSAL_DF))
        for g in range(n_groups):
            log_u[s, g] = math.log(np.random.random())


@_jit
def effects_of(q: np.ndarray, coordinates: np.ndarray) -> np.ndarray:
    """Return ``q[coordinates]``: every group's effects, ``(G, k)``."""
    n_groups, k = coordinates.shape
    x = np.empty((n_groups, k))
    for g in range(n_groups):
        for i in range(k):
            x[g, i] = q[coordinates[g, i]]
    return x


@_jit
def newton_proposal(
    mean: np.ndarray,
    vectors: np.ndarray,
    values: np.ndarray,
    normals: np.ndarray,
    scales: np.ndarray,
) -> np.ndarray:
    """Return each group's Student-t draw ``mean + V (z s / sqrt(values))`` (module doc)."""
    n_groups, k = mean.shape
    x_new = np.empty((n_groups, k))
    for g in range(n_groups):
        for a in range(k):
            total = 0.0
            for i in range(k):
                total += vectors[g, a, i] * (normals[g, i] * scales[g] / math.sqrt(values[g, i]))
            x_new[g, a] = mean[g, a] + total
    return x_new


@_jit
def proposal_terms(
    x: np.ndarray,
    x_new: np.ndarray,
    prior: np.ndarray,
    prior_new: np.ndarray,
    forward: tuple[np.ndarray, np.ndarray, np.ndarray],
    backward: tuple[np.ndarray, np.ndarray, np.ndarray],
    reference_cells: np.ndarray,
    cell_gradient: np.ndarray,
    cell_hessian: np.ndarray,
    cells: np.ndarray,
    cells_new: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Return every group's ``rest_g`` and ``known_g`` (``kernels/group_effects.py``).

    ``rest_g = log p(x') - log p(x) + log q(x | x') - log q(x' | x)``, NaN where it or the
    proposal is not finite; ``known_g = rest_g + t_g``, ``t_g`` the quadratic expansion's
    difference between the cells (``GroupQuadratic.change``).
    """
    n_groups, k = x.shape
    n_cells = cells.shape[1]
    back = proposal_log_density(x, backward[0], backward[1], backward[2])
    ahead = proposal_log_density(x_new, forward[0], forward[1], forward[2])
    rest = np.empty(n_groups)
    known = np.empty(n_groups)
    for g in range(n_groups):
        value = prior_new[g] - prior[g] + back[g] - ahead[g]
        finite = math.isfinite(value)
        for i in range(k):
            finite = finite and math.isfinite(x_new[g, i])
        rest[g] = value if finite else math.nan
        # b'Hb - a'Ha = (b - a)' H (b + a), with a, b the old and new cells less the reference.
        change = 0.0
        for c in range(n_cells):
            moved = 0.0
            for d in range(n_cells):
                moved += cell_hessian[g, c, d] * (
                    cells_new[g, d] - reference_cells[g, d] + cells[g, d] - reference_cells[g, d]
                )
            change += (cells_new[g, c] - cells[g, c]) * (cell_gradient[g, c] + 0.5 * moved)
        known[g] = rest[g] + change
    return rest, known


@_jit
def with_effects(
    q: np.ndarray, coordinates: np.ndarray, x_new: np.ndarray, take: np.ndarray
) -> np.ndarray:
    """Return a copy of ``q`` with the new effects of the groups in ``take`` that are finite.

    Every group (``take`` all True) gives the proposed point, where a non-finite proposal
    keeps the current effects; the accepted groups give the sweep's new point.
    """
    out = q.copy()
    n_groups, k = coordinates.shape
    for g in range(n_groups):
        if take[g]:
            for i in range(k):
                if math.isfinite(x_new[g, i]):
                    out[coordinates[g, i]] = x_new[g, i]
    return out


@_jit
def take_groups(current: np.ndarray, proposed: np.ndarray, take: np.ndarray) -> np.ndarray:
    """Return a C-contiguous copy of ``current`` with the rows of ``proposed`` where ``take``.

    The rows are the factor's groups: a sweep's accepted groups carry their values at the
    proposed effects into the next sweep (the factor's parts, effects and Newton proposal).
    An array whose rows are not the factor's groups (another factor's table, which this
    factor's sweep does not change) is copied as it is.
    """
    out = np.ascontiguousarray(current).copy()
    if current.shape[0] != take.size:
        return out
    # Row by row as (G, m) matrices: a row view per group would count references each time.
    rows_out = out.reshape((take.size, -1))
    rows_new = np.ascontiguousarray(proposed).reshape((take.size, -1))
    for g in range(take.size):
        if take[g]:
            for j in range(rows_out.shape[1]):
                rows_out[g, j] = rows_new[g, j]
    return out

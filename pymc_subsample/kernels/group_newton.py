"""Every group's Newton proposal at once, compiled with Numba: the algebra of a group sweep.

A group sweep (``kernels/group_effects.py``, module doc, "Proposal") proposes each group's
effects from a quadratic model of its conditional,

    grad = grad log p + J^T (s_g + H_g (c - c_r)),   P = -(Hess log p + J^T H_g J),
    x' ~ t_nu(x + P^-1 grad, P^-1),

with ``P``'s eigenvalues taken by magnitude and floored at :data:`PRECISION_FLOOR`, and
decides with the Metropolis-Hastings ratio of the forward and reverse proposals' densities.
A hierarchy has hundreds to thousands of groups of one to a few effects each: in NumPy each of
these steps is a dozen array operations on ``(G, k, k)`` stacks, each costing more in
overhead than its arithmetic; here each is one loop over the groups. One or two effects per
group (a varying intercept, and a slope) are diagonalised in closed form (a 2 x 2 symmetric
matrix ``[[a, b], [b, c]]`` by the rotation through ``theta = atan2(2 b, a - c) / 2``), more by
LAPACK's ``eigh`` (compiled for Numba only where a group has more than two effects: it takes
seconds to compile). ``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = [
    "PRECISION_FLOOR",
    "PROPOSAL_DF",
    "cell_model_derivatives",
    "lapack_symmetric_eigen",
    "newton_gaussian",
    "newton_mean",
    "newton_precision",
    "proposal_log_density",
    "small_symmetric_eigen",
    "symmetric_eigen",
]

#: Degrees of freedom of the proposal's Student-t: its tails are heavier than a GLM
#: conditional's (at most exponential in the effects), so a chain far out in a group's tail,
#: where the quadratic model underrates the conditional, still moves back (a Gaussian
#: independence proposal lighter-tailed than its target is not geometrically ergodic and can
#: stay stuck at a chain's start); on a Gaussian conditional it costs a little acceptance.
PROPOSAL_DF = 7.0
#: Smallest eigenvalue of a proposal's precision, relative to 1 (a flat direction of the
#: quadratic model gets a proposal sd of 1e3 rather than infinity).
PRECISION_FLOOR = 1e-6

# NumPy's float semantics (a non-finite group's NaNs propagate, as in the NumPy expressions).
_jit = numba.njit(cache=True, error_model="numpy")


@_jit
def small_symmetric_eigen(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`symmetric_eigen` of ``1 x 1`` or ``2 x 2`` matrices, in closed form."""
    n_groups, k = matrices.shape[0], matrices.shape[1]
    values = np.empty((n_groups, k))
    vectors = np.zeros((n_groups, k, k))
    for g in range(n_groups):
        if k == 1:
            values[g, 0] = matrices[g, 0, 0]
            vectors[g, 0, 0] = 1.0
        else:
            a, b, c = matrices[g, 0, 0], matrices[g, 0, 1], matrices[g, 1, 1]
            theta = 0.5 * math.atan2(2.0 * b, a - c)
            cos, sin = math.cos(theta), math.sin(theta)
            cross = 2.0 * b * cos * sin
            values[g, 0] = a * cos * cos + cross + c * sin * sin
            values[g, 1] = a * sin * sin - cross + c * cos * cos
            vectors[g, 0, 0], vectors[g, 0, 1] = cos, -sin
            vectors[g, 1, 0], vectors[g, 1, 1] = sin, cos
    return values, vectors


@_jit
def lapack_symmetric_eigen(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`symmetric_eigen` of matrices of any size, by LAPACK's ``eigh`` group by group.

    Compiled only where a group has more than two effects: Numba's ``eigh`` takes seconds to
    compile.
    """
    n_groups, k = matrices.shape[0], matrices.shape[1]
    values = np.empty((n_groups, k))
    vectors = np.zeros((n_groups, k, k))
    for g in range(n_groups):
        group_values, group_vectors = np.linalg.eigh(np.ascontiguousarray(matrices[g]))
        values[g] = group_values
        vectors[g] = group_vectors
    return values, vectors


def symmetric_eigen(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues ``(G, k)`` and eigenvectors (as columns, ``(G, k, k)``) of symmetric matrices.

    In closed form up to ``2 x 2`` (:func:`small_symmetric_eigen`), else NumPy's ``eigh``.
    """
    if matrices.shape[1] <= 2:
        return small_symmetric_eigen(np.ascontiguousarray(matrices, dtype=np.float64))
    values, vectors = np.linalg.eigh(matrices)
    return np.ascontiguousarray(values), np.ascontiguousarray(vectors)


@_jit
def newton_precision(gradient: np.ndarray, hessian: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each group's precision ``-hessian`` symmetrised, and whether its model is finite.

    A group whose gradient or Hessian is not finite gets the identity precision.
    """
    n_groups, k = gradient.shape
    precision = np.empty((n_groups, k, k))
    finite = np.empty(n_groups, dtype=np.bool_)
    for g in range(n_groups):
        ok = True
        for i in range(k):
            ok = ok and math.isfinite(gradient[g, i])
            for j in range(k):
                ok = ok and math.isfinite(hessian[g, i, j])
        finite[g] = ok
        for i in range(k):
            for j in range(k):
                if ok:
                    precision[g, i, j] = -0.5 * (hessian[g, i, j] + hessian[g, j, i])
                else:
                    precision[g, i, j] = 1.0 if i == j else 0.0
    return precision, finite


@_jit
def newton_mean(
    x: np.ndarray,
    gradient: np.ndarray,
    finite: np.ndarray,
    values: np.ndarray,
    vectors: np.ndarray,
) -> np.ndarray:
    """Return each group's Newton mean ``x + P^-1 grad``; floor ``values`` in place.

    ``values`` and ``vectors`` are the precision's eigen-decomposition; its eigenvalues are
    replaced by their magnitudes floored at :data:`PRECISION_FLOOR`. A group whose model is
    not ``finite`` gets a NaN mean (its proposal is then rejected).
    """
    n_groups, k = x.shape
    mean = np.empty((n_groups, k))
    rotated = np.empty(k)
    for g in range(n_groups):
        for i in range(k):
            values[g, i] = max(abs(values[g, i]), PRECISION_FLOOR)
            total = 0.0
            for j in range(k):
                total += gradient[g, j] * vectors[g, j, i]
            rotated[i] = total / values[g, i]
        for a in range(k):
            step = 0.0
            for i in range(k):
                step += vectors[g, a, i] * rotated[i]
            mean[g, a] = x[g, a] + step if finite[g] else math.nan
    return mean


def newton_gaussian(
    x: np.ndarray, gradient: np.ndarray, hessian: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return each group's Newton proposal: mean, and the precision's eigenvectors and values.

    The precision is ``-hessian`` symmetrised, with its eigenvalues' magnitudes floored at
    :data:`PRECISION_FLOOR`; a group whose gradient or Hessian is not finite gets the identity
    precision and a NaN mean (its proposal is then rejected). The compiled sweep makes the
    same three calls (``step_methods/fused_group_path.py``).
    """
    gradient = np.ascontiguousarray(gradient, dtype=np.float64)
    precision, finite = newton_precision(gradient, np.ascontiguousarray(hessian, dtype=np.float64))
    values, vectors = symmetric_eigen(precision)
    mean = newton_mean(np.ascontiguousarray(x, dtype=np.float64), gradient, finite, values, vectors)
    return mean, vectors, values


@_jit
def proposal_log_density(
    y: np.ndarray, mean: np.ndarray, vectors: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """Return each group's proposal log-density at ``y``, up to a constant of ``k`` alone.

    A multivariate t with :data:`PROPOSAL_DF` degrees of freedom, location ``mean`` and scale
    matrix ``(V diag(values) V^T)^-1``.
    """
    n_groups, k = y.shape
    out = np.empty(n_groups)
    for g in range(n_groups):
        distance = 0.0
        log_values = 0.0
        for i in range(k):
            z = 0.0
            for j in range(k):
                z += (y[g, j] - mean[g, j]) * vectors[g, j, i]
            distance += values[g, i] * z * z
            log_values += math.log(values[g, i])
        out[g] = -0.5 * (PROPOSAL_DF + k) * math.log1p(distance / PROPOSAL_DF) + 0.5 * log_values
    return out


@_jit
def cell_model_derivatives(
    prior_gradient: np.ndarray,
    prior_hessian: np.ndarray,
    cells: np.ndarray,
    jacobian: np.ndarray,
    reference_cells: np.ndarray,
    cell_gradient: np.ndarray,
    cell_hessian: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Return the quadratic model's gradient ``(G, k)`` and Hessian ``(G, k, k)`` in the effects.

    ``grad log p + J^T (s_g + H_g (c - c_r))`` and ``Hess log p + J^T H_g J`` (module doc),
    from the prior's derivatives, the cells ``c`` and their Jacobian ``J``, and the expansion's
    reference cells ``c_r``, gradient ``s_g`` and Hessian ``H_g``.
    """
    n_groups, k = prior_gradient.shape
    n_cells = cells.shape[1]
    gradient = np.empty((n_groups, k))
    hessian = np.empty((n_groups, k, k))
    at_cells = np.empty(n_cells)
    for g in range(n_groups):
        for c in range(n_cells):
            total = cell_gradient[g, c]
            for d in range(n_cells):
                total += cell_hessian[g, c, d] * (cells[g, d] - reference_cells[g, d])
            at_cells[c] = total
        for i in range(k):
            total = prior_gradient[g, i]
            for c in range(n_cells):
                total += jacobian[g, c, i] * at_cells[c]
            gradient[g, i] = total
            for j in range(k):
                total = prior_hessian[g, i, j]
                for c in range(n_cells):
                    inner = 0.0
                    for d in range(n_cells):
                        inner += cell_hessian[g, c, d] * jacobian[g, d, j]
                    total += jacobian[g, c, i] * inner
                hessian[g, i, j] = total
    return gradient, hessian

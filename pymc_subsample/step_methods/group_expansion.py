"""The rows' expansion behind GroupEffectsMH: exact sums by group, and the models they give.

One pass over the rows (:meth:`GroupExpansion.expand`) sums every row's first and second
derivatives in ``psi = (shared coefficients, every gather's cells)`` at a reference point: per
group of each factor, the cells' gradient and Hessian and their cross derivatives with the
shared coefficients; per pair of groups of two factors, the cells' cross derivatives (sparse);
for the shared coefficients, their gradient and Hessian. From them come each factor's
quadratic model at the current point (:meth:`GroupExpansion.shifted`: the cross terms shift
its gradient) and the shared coefficients' (:meth:`GroupExpansion.shared_model`); the same
pass finds the ridges, a shared coefficient and a cell entry read only through their sum.
``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sparse

from pymc_subsample.kernels.group_effects import GroupParts, GroupQuadratic
from pymc_subsample.model.group_effects import GroupEffectFunctions, GroupFactor
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.model.row_data import row_chunks

__all__ = ["GroupExpansion"]

#: Rows per call of the expansion's pass.
PASS_ROWS = 65_536
#: A shared coefficient and a cell entry whose per-row derivatives agree to this relative
#: error on every row are read only through their sum (a ridge).
RIDGE_TOLERANCE = 1e-9
#: Step of the central differences of the prior's gradient that give its Hessian in the
#: shared coefficients (a handful of coordinates; the model's Hessian is the rows').
PRIOR_STEP = 1e-5


class GroupExpansion:
    """The expansion of one GroupEffectsMH step's rows, and its quadratic models.

    Parameters
    ----------
    functions : GroupEffectFunctions
    oracles : ModelOracles
        The step's oracles (its rows, prior and frozen variables).
    """

    def __init__(self, functions: GroupEffectFunctions, oracles: ModelOracles) -> None:
        self.functions = functions
        self.oracles = oracles
        self.quadratics: list[GroupQuadratic] | None = None
        self.reference_tables: tuple[np.ndarray, ...] = ()
        self.reference_q = oracles.initial_q.copy()
        self.crosses: list[np.ndarray] = []
        self.factor_crosses: dict[tuple[int, int, int, int], Any] = {}
        n_shared = functions.direct_coordinates.size
        self.shared = (np.zeros(n_shared), np.zeros((n_shared, n_shared)))
        #: Pairs (shared coefficient, factor, cell entry) the rows read only through their
        #: sum, found at the first expansion; while they are compared, the largest gap between
        #: the two per-row derivatives and the largest derivative.
        self.ridges: list[tuple[int, int, int]] = []
        self._ridge_gaps: dict[tuple[int, int, int], tuple[float, float]] | None = {
            (d, f, j): (0.0, 0.0)
            for d in range(n_shared)
            for f, factor in enumerate(functions.factors)
            for j in range(factor.cell_size)
        }

    @property
    def factors(self) -> tuple[GroupFactor, ...]:
        """The grouping factors."""
        return self.functions.factors

    def parts(self, f: int, q: np.ndarray) -> GroupParts:
        """Return factor ``f``'s data-free parts at ``q``."""
        out = [np.asarray(x) for x in self.functions.parts[f](q)]
        prior, gradient, hessian, cells, jacobian = out[:5]
        tables = tuple(np.ascontiguousarray(table) for table in out[5:])
        return GroupParts(prior, gradient, hessian, cells, jacobian, tables)

    def cells(self, tables: Sequence[np.ndarray], indices: Sequence[np.ndarray]) -> list[Any]:
        """Each row's cell of every gather, shaped and typed as the functions read them."""
        cells = []
        for table, index, shape, dtype in zip(
            tables, indices, self.functions.cell_shapes, self.functions.cell_dtypes, strict=True
        ):
            picked = table[np.asarray(index, np.int64) % table.shape[0]]
            cells.append(np.ascontiguousarray(picked.reshape((-1, *shape)), dtype=dtype))
        return cells

    def expand(self, q: np.ndarray) -> None:
        """Expand every row's likelihood around ``q``, summed by group: one pass over the rows."""
        parts = [self.parts(f, q) for f in range(len(self.factors))]
        tables = parts[0].tables
        n_shared = self.functions.direct_coordinates.size
        gradients = [np.zeros((f.n_groups, f.cell_size)) for f in self.factors]
        hessians = [np.zeros((f.n_groups, f.cell_size, f.cell_size)) for f in self.factors]
        crosses = [np.zeros((f.n_groups, f.cell_size, n_shared)) for f in self.factors]
        #: (f, h, i, j) -> sparse (G_f, G_h): the rows' d2F / dc_f,i dc_h,j summed by the
        #: pair of groups they read (crossed factors).
        factor_crosses: dict[tuple[int, int, int, int], Any] = {}
        shared_gradient = np.zeros(n_shared)
        shared_hessian = np.zeros((n_shared, n_shared))
        for chunk in row_chunks(self.oracles.n_rows, PASS_ROWS):
            arrays = self.oracles.rows_at(chunk)
            indices = self.functions.indices(*arrays)
            _, first, second, summed = self.functions.derivatives(
                q, *self.cells(tables, indices), *arrays
            )
            # psi = (shared coefficients, every gather's cells): first (n, m), second
            # (n, m, cells) (per_row_derivatives_graph).
            first, second = np.asarray(first), np.asarray(second)
            if self._ridge_gaps is not None:
                self._watch_ridges(first)
            shared_gradient += first[:, :n_shared].sum(axis=0)
            shared_hessian += np.asarray(summed).reshape(n_shared, n_shared)
            for f, factor in enumerate(self.factors):
                groups = np.asarray(indices[factor.gathers[0]], np.int64) % factor.n_groups
                columns = factor.cell_columns
                for i, column in enumerate(columns):
                    gradients[f][:, i] += np.bincount(
                        groups, first[:, n_shared + column], minlength=factor.n_groups
                    )
                    for j, other in enumerate(columns):
                        hessians[f][:, i, j] += np.bincount(
                            groups, second[:, n_shared + column, other], minlength=factor.n_groups
                        )
                    for d in range(n_shared):
                        crosses[f][:, i, d] += np.bincount(
                            groups, second[:, d, column], minlength=factor.n_groups
                        )
            self._add_factor_crosses(factor_crosses, indices, second)
        self.reference_tables = tables
        self.factor_crosses = factor_crosses
        self.reference_q = q.copy()
        self.crosses = crosses
        self.shared = (shared_gradient, 0.5 * (shared_hessian + shared_hessian.T))
        if self._ridge_gaps is not None:
            self._settle_ridges()
        self.quadratics = [
            GroupQuadratic(part.cells, gradient, 0.5 * (hessian + np.swapaxes(hessian, 1, 2)))
            for part, gradient, hessian in zip(parts, gradients, hessians, strict=True)
        ]

    def _watch_ridges(self, first: np.ndarray) -> None:
        """Compare each shared coefficient's per-row derivative with each factor cell's."""
        assert self._ridge_gaps is not None
        n_shared = self.functions.direct_coordinates.size
        for (d, f, j), (gap, scale) in list(self._ridge_gaps.items()):
            column = n_shared + int(self.factors[f].cell_columns[j])
            self._ridge_gaps[d, f, j] = (
                max(gap, float(np.max(np.abs(first[:, d] - first[:, column]), initial=0.0))),
                max(scale, float(np.max(np.abs(first[:, d]), initial=0.0))),
            )

    def _settle_ridges(self) -> None:
        """Keep the pairs the rows read only through their sum: ``intercept + u[g]``."""
        assert self._ridge_gaps is not None
        self.ridges = [
            pair
            for pair, (gap, scale) in self._ridge_gaps.items()
            if scale > 0.0 and gap <= RIDGE_TOLERANCE * scale
        ]
        self._ridge_gaps = None  # decided at the first expansion, once

    def _add_factor_crosses(
        self,
        sums: dict[tuple[int, int, int, int], Any],
        indices: Sequence[np.ndarray],
        second: np.ndarray,
    ) -> None:
        """Add a chunk's cross derivatives between two factors' cells, by pair of groups."""
        n_shared = self.functions.direct_coordinates.size
        for f, factor in enumerate(self.factors):
            rows = np.asarray(indices[factor.gathers[0]], np.int64) % factor.n_groups
            for h, other in enumerate(self.factors):
                if h == f:
                    continue
                columns = np.asarray(indices[other.gathers[0]], np.int64) % other.n_groups
                for i, cell in enumerate(factor.cell_columns):
                    for j, other_cell in enumerate(other.cell_columns):
                        chunk = sparse.coo_matrix(
                            (second[:, n_shared + cell, other_cell], (rows, columns)),
                            shape=(factor.n_groups, other.n_groups),
                        ).tocsr()
                        key = (f, h, i, j)
                        sums[key] = chunk if key not in sums else sums[key] + chunk

    def shifted(self, f: int, q: np.ndarray) -> GroupQuadratic:
        """Factor ``f``'s expansion at the shared coefficients and other factors of ``q``.

        Its cross terms with the shared coefficients, ``H_cD,g (v_D - v_D,ref)``, and with the
        other factors' cells, ``sum_h H_fh (c_h - c_h,ref)`` summed by pair of groups, are
        linear in its cells: they shift the groups' gradients (``docs/architecture.md``,
        "Group effects").
        """
        assert self.quadratics is not None
        quadratic = self.quadratics[f]
        direct = self.functions.direct_coordinates
        if not direct.size and len(self.quadratics) == 1:
            return quadratic  # nothing to shift by (read-only: the sweeps never write to it)
        shift = np.zeros_like(quadratic.gradient)
        if direct.size:
            offset = q[direct] - self.reference_q[direct]
            shift += np.einsum("gcd,d->gc", self.crosses[f], offset)
        for h, other in enumerate(self.quadratics):
            if h == f:
                continue
            moved = self.parts(h, q).cells - other.reference_cells
            for i in range(shift.shape[1]):
                for j in range(moved.shape[1]):
                    shift[:, i] += self.factor_crosses[f, h, i, j] @ moved[:, j]
        return quadratic._replace(gradient=quadratic.gradient + shift)

    def shared_model(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the quadratic model's gradient and Hessian in the shared coefficients at ``q``."""
        assert self.quadratics is not None
        direct = self.functions.direct_coordinates
        gradient, hessian = self.shared
        offset = q[direct] - self.reference_q[direct]
        gradient = gradient + hessian @ offset
        for f, quadratic in enumerate(self.quadratics):
            moved = self.parts(f, q).cells - quadratic.reference_cells
            gradient = gradient + np.einsum("gcd,gc->d", self.crosses[f], moved)
        prior_gradient = self.oracles.log_prior_grad(q)[direct]
        prior_hessian = np.empty((direct.size, direct.size))
        for j, coordinate in enumerate(direct):
            up, down = q.copy(), q.copy()
            up[coordinate] += PRIOR_STEP
            down[coordinate] -= PRIOR_STEP
            difference = self.oracles.log_prior_grad(up) - self.oracles.log_prior_grad(down)
            prior_hessian[:, j] = difference[direct] / (2.0 * PRIOR_STEP)
        prior_hessian = 0.5 * (prior_hessian + prior_hessian.T)
        return gradient + prior_gradient, hessian + prior_hessian

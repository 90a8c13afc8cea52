"""Summed gradient, scores' outer products and Hessian of grouped rows, by the chain rule.

Row i's log-likelihood is ``F(psi_i, row_i)`` with ``psi_i = P_i(v) = (v_D, T_1(v)[g_i1], ...)``
(``model/grouped_rows.py``). Write ``u`` for the vector of every ``psi`` entry a row can read:
``v_D`` followed by every table's entries, ``b = |D| + sum_k n_groups_k * cell_size_k`` long,
and ``u(v) = (v_D, T_1(v), ...)``. Row i reads the entries ``c_i`` of ``u`` (its direct
coordinates and its groups' cells), so with ``J = du/dv`` (the tables' Jacobians below the
identity rows of ``D``):

- gradient: ``sum_i grad_v l_i = J^T gbar`` with ``gbar = sum_i E_i^T dF_i`` (``E_i`` selects
  ``c_i``): the rows' ``dF/dpsi`` summed per table entry;
- scores' outer products: ``sum_i s_i s_i^T = J^T (sum_i E_i^T dF_i dF_i^T E_i) J``;
- Hessian: ``J^T (sum_i E_i^T d2F_i E_i) J + sum_k Hess_v(w_k . T_k(v))``, ``w_k`` the part of
  ``gbar`` on table k.

The sums in ``u`` are sparse (a row touches ``m`` entries), accumulated from ``n m^2`` numbers
per chunk of ``n`` rows; the products with ``J`` (sparse: a cell depends on few coordinates of
``v``) are taken once per call. So a pass costs O(N m^2) whatever the number of groups, where
the dense per-row scores and vectorised Hessian cost O(N d^2) and O(N d) backward passes.
``docs/architecture.md``, "Grouped rows".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sparse

from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.grouped_rows import (
    GroupedRows,
    find_grouped_rows,
    index_graph,
    per_row_derivatives_graph,
    table_curvature_graph,
    table_derivatives_graph,
)

__all__ = ["GroupedSums", "GroupedTotals", "grouped_sums"]


class GroupedTotals(NamedTuple):
    """The rows' sums in ``v``: log-likelihood, gradient, outer products and Hessian (or None)."""

    loglik: float
    gradient: np.ndarray
    outer: np.ndarray | None
    hessian: np.ndarray | None


class GroupedSums:
    """The sums over rows of one :class:`GroupedRows`, its four functions compiled at first use.

    Parameters
    ----------
    grouped : GroupedRows
    compile_kwargs : dict
        Passed to PyTensor's compiler.
    """

    def __init__(self, grouped: GroupedRows, compile_kwargs: dict[str, Any]) -> None:
        self.direct = grouped.direct
        self.length = int(grouped.vector.type.shape[0])
        self.n_groups = tuple(gather.n_groups for gather in grouped.gathers)
        self.cell_sizes = tuple(gather.cell_size for gather in grouped.gathers)
        self.cell_shapes = tuple(
            tuple(int(dim) for dim in gather.cell.type.shape[1:]) for gather in grouped.gathers
        )
        self.dtypes = tuple(str(gather.cell.dtype) for gather in grouped.gathers)
        self.psi_size = grouped.psi_size
        self._indices = LazyFunction(partial(index_graph, grouped), compile_kwargs)
        self._per_row = LazyFunction(partial(per_row_derivatives_graph, grouped), compile_kwargs)
        self._tables = LazyFunction(partial(table_derivatives_graph, grouped), compile_kwargs)
        self._curvature = LazyFunction(partial(table_curvature_graph, grouped), compile_kwargs)

    @property
    def n_local(self) -> int:
        """The number of table entries (the group-level parameters the rows read)."""
        return sum(g * s for g, s in zip(self.n_groups, self.cell_sizes, strict=True))

    def totals(
        self,
        v: np.ndarray,
        chunks: Iterable[Sequence[np.ndarray]],
        *,
        outer: bool,
        hessian: bool,
    ) -> GroupedTotals:
        """Sum over the rows of ``chunks`` (each the row arrays of one chunk) at ``v``.

        Other model variables are read as the rows' graph reads them (live or frozen).
        """
        v = np.asarray(v, dtype="float64")
        outputs = self._tables(v)
        tables = [
            np.asarray(values).reshape(n_groups, size)
            for values, n_groups, size in zip(
                outputs[0::2], self.n_groups, self.cell_sizes, strict=True
            )
        ]
        n_direct = int(self.direct.size)
        offsets = np.cumsum(
            [n_direct, *(g * s for g, s in zip(self.n_groups, self.cell_sizes, strict=True))]
        )
        width = int(offsets[-1])
        m = self.psi_size
        pairs = np.indices((m, m)).reshape(2, -1)
        loglik = 0.0
        gbar = np.zeros(width)
        curvature = sparse.csr_matrix((width, width)) if hessian else None
        products = sparse.csr_matrix((width, width)) if outer else None
        for rows in chunks:
            indices = self._indices(*rows)
            n = int(np.shape(rows[0])[0])
            cells = []
            entries = np.empty((n, m), dtype="int64")
            entries[:, :n_direct] = np.arange(n_direct)
            column = n_direct
            for k, (index, table) in enumerate(zip(indices, tables, strict=True)):
                size = self.cell_sizes[k]
                index = np.asarray(index, dtype="int64")
                if index.size and (index.min() < 0 or index.max() >= self.n_groups[k]):
                    raise IndexError(
                        f"A group index of the rows is outside 0..{self.n_groups[k] - 1}."
                    )
                cell = table[index].reshape(n, *self.cell_shapes[k])
                cells.append(cell.astype(self.dtypes[k], copy=False))
                entries[:, column : column + size] = (
                    offsets[k] + index[:, None] * size + np.arange(size)
                )
                column += size
            values, scores, cross, direct_hessian = self._per_row(v, *cells, *rows)
            loglik += float(np.sum(values))
            gbar += np.bincount(entries.ravel(), weights=scores.ravel(), minlength=width)
            if curvature is not None:
                curvature = curvature + self._curvature_in_u(
                    entries, np.asarray(cross), np.asarray(direct_hessian), width
                )
            if products is not None:
                left, right = entries[:, pairs[0]].ravel(), entries[:, pairs[1]].ravel()
                outer_rows = scores[:, pairs[0]] * scores[:, pairs[1]]
                products = products + _summed(outer_rows.ravel(), left, right, width)
        jacobian = self._jacobian(outputs[1::2], n_direct)
        gradient = np.asarray(jacobian.T @ gbar)
        hessian_v = None
        if curvature is not None:
            weights = [gbar[offsets[k] : offsets[k + 1]] for k in range(len(tables))]
            hessian_v = _dense(jacobian.T @ curvature @ jacobian) + np.asarray(
                self._curvature(v, *weights)[0]
            )
        outer_v = None if products is None else _dense(jacobian.T @ products @ jacobian)
        return GroupedTotals(loglik, gradient, outer_v, hessian_v)

    def _curvature_in_u(
        self, entries: np.ndarray, cross: np.ndarray, direct_hessian: np.ndarray, width: int
    ) -> Any:
        """Sum the chunk's ``E_i^T d2F_i E_i`` into a sparse ``width x width`` matrix.

        ``cross[i, a, c]`` is row i's second derivative in ``psi`` entry ``a`` and cell entry
        ``c``; the direct block comes summed (``direct_hessian``).
        """
        n_direct = int(self.direct.size)
        _, m, n_cells = cross.shape
        cell_entries = entries[:, n_direct:]
        # Every psi entry against every cell entry, and the cells against the direct ones.
        left = np.repeat(entries[:, :, None], n_cells, axis=2)
        right = np.repeat(cell_entries[:, None, :], m, axis=1)
        mirrored = cross[:, :n_direct, :]
        values = np.concatenate([cross.ravel(), mirrored.ravel()])
        rows = np.concatenate([left.ravel(), right[:, :n_direct, :].ravel()])
        columns = np.concatenate([right.ravel(), left[:, :n_direct, :].ravel()])
        summed = _summed(values, rows, columns, width)
        if n_direct:
            block = sparse.coo_matrix(
                (direct_hessian.ravel(), np.indices((n_direct, n_direct)).reshape(2, -1)),
                shape=(width, width),
            )
            summed = summed + block.tocsr()
        return summed

    def _jacobian(self, table_jacobians: Sequence[np.ndarray], n_direct: int) -> sparse.csr_matrix:
        """``J = du/dv``: identity rows at the direct coordinates, then the tables' Jacobians."""
        identity = sparse.csr_matrix(
            (np.ones(n_direct), (np.arange(n_direct), self.direct)),
            shape=(n_direct, self.length),
        )
        blocks = [identity]
        blocks.extend(
            sparse.csr_matrix(np.asarray(block).reshape(-1, self.length))
            for block in table_jacobians
        )
        return sparse.vstack(blocks, format="csr")


def _summed(values: np.ndarray, left: np.ndarray, right: np.ndarray, width: int) -> Any:
    """Sum ``values`` at ``(left, right)`` into a sparse ``width x width`` matrix."""
    return sparse.coo_matrix((values, (left, right)), shape=(width, width)).tocsr()


def _dense(matrix: Any) -> np.ndarray:
    return np.asarray(matrix.toarray() if sparse.issparse(matrix) else matrix)


def grouped_sums(
    rows_logp: Any,
    vector: Any,
    row_inputs: Sequence[Any],
    v0: np.ndarray,
    compile_kwargs: dict[str, Any],
) -> GroupedSums | None:
    """Build the grouped sums of a rows' graph in ``vector`` (None: it reads no table by group).

    Parameters are those of :func:`~pymc_subsample.model.grouped_rows.find_grouped_rows`,
    with the compile options of the functions.
    """
    grouped = find_grouped_rows(rows_logp, vector, row_inputs, v0)
    return None if grouped is None else GroupedSums(grouped, compile_kwargs)

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

import itertools
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
        self._indices = LazyFunction(
            partial(index_graph, grouped), compile_kwargs, interpreted_first=True
        )
        self._per_row = LazyFunction(
            partial(per_row_derivatives_graph, grouped), compile_kwargs, interpreted_first=True
        )
        self._tables = LazyFunction(
            partial(table_derivatives_graph, grouped), compile_kwargs, interpreted_first=True
        )
        self._curvature = LazyFunction(
            partial(table_curvature_graph, grouped), compile_kwargs, interpreted_first=True
        )

    @property
    def n_local(self) -> int:
        """The number of table entries (the group-level parameters the rows read)."""
        return sum(g * s for g, s in zip(self.n_groups, self.cell_sizes, strict=True))

    def row_groups(self, chunks: Iterable[Sequence[np.ndarray]]) -> np.ndarray:
        """Each row's group in the table with the most groups (int64, from 0).

        The strata of the stratified test (``kernels/stratified.py``): a row's log-likelihood
        reads its group's parameters, so rows of one group are alike. Where the rows read
        several tables (crossed factors), the finest factor's groups are the strata.
        """
        finest = int(np.argmax(self.n_groups))
        n_groups = self.n_groups[finest]
        pieces = []
        for rows in chunks:
            index = np.asarray(self._indices(*rows)[finest], dtype="int64")
            if index.size and (index.min() < -n_groups or index.max() >= n_groups):
                raise IndexError(
                    f"A group index of the rows is outside -{n_groups}..{n_groups - 1}, "
                    f"the length of the table of group parameters it indexes."
                )
            pieces.append(index % n_groups)
        return np.concatenate(pieces)

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
        loglik = 0.0
        gbar = np.zeros(width)
        layout = _Layout(n_direct, self.n_groups, self.cell_sizes, offsets)
        curvature = _BlockSums(layout) if hessian else None
        products = _BlockSums(layout) if outer else None
        for rows in chunks:
            indices = self._indices(*rows)
            n = int(np.shape(rows[0])[0])
            cells, groups = [], []
            for k, (index, table) in enumerate(zip(indices, tables, strict=True)):
                index = np.asarray(index, dtype="int64")
                n_groups = self.n_groups[k]
                if index.size and (index.min() < -n_groups or index.max() >= n_groups):
                    raise IndexError(
                        f"A group index of the rows is outside -{n_groups}..{n_groups - 1}, "
                        f"the length of the table of group parameters it indexes."
                    )
                if index.size and index.min() < 0:  # counted from the end, as NumPy does
                    index = index % n_groups
                cell = table[index].reshape(n, *self.cell_shapes[k])
                cells.append(cell.astype(self.dtypes[k], copy=False))
                groups.append(index)
            values, scores, cross, direct_hessian = self._per_row(v, *cells, *rows)
            scores, cross = np.asarray(scores), np.asarray(cross)
            loglik += float(np.sum(values))
            gbar[:n_direct] += scores[:, :n_direct].sum(axis=0)
            for k, columns in enumerate(layout.cell_columns):
                entries = groups[k][:, None] * self.cell_sizes[k] + np.arange(self.cell_sizes[k])
                gbar[offsets[k] : offsets[k + 1]] += np.bincount(
                    entries.ravel(),
                    weights=scores[:, n_direct:][:, columns].ravel(),
                    minlength=int(offsets[k + 1] - offsets[k]),
                )
            if curvature is not None:
                curvature.add(
                    groups, np.asarray(direct_hessian), cross[:, :n_direct], cross[:, n_direct:]
                )
            if products is not None:
                direct, local = scores[:, :n_direct], scores[:, n_direct:]
                products.add(
                    groups,
                    direct.T @ direct,
                    direct[:, :, None] * local[:, None, :],
                    local[:, :, None] * local[:, None, :],
                )
        jacobian = self._jacobian(outputs[1::2], n_direct)
        gradient = np.asarray(jacobian.T @ gbar)
        hessian_v = None
        if curvature is not None:
            weights = [gbar[offsets[k] : offsets[k + 1]] for k in range(len(tables))]
            hessian_v = _dense(jacobian.T @ curvature.matrix() @ jacobian) + np.asarray(
                self._curvature(v, *weights)[0]
            )
        outer_v = None if products is None else _dense(jacobian.T @ products.matrix() @ jacobian)
        return GroupedTotals(loglik, gradient, outer_v, hessian_v)

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


class _Layout(NamedTuple):
    """Where each part of a row's ``psi`` lies in ``u``: the direct block, then each table."""

    n_direct: int
    n_groups: tuple[int, ...]
    cell_sizes: tuple[int, ...]
    offsets: np.ndarray  # u's offset of each table, then u's width

    @property
    def cell_columns(self) -> list[slice]:
        """Each table's columns among a row's cell entries (psi without the direct ones)."""
        starts = np.cumsum([0, *self.cell_sizes])
        return [slice(int(a), int(b)) for a, b in itertools.pairwise(starts)]


class _BlockSums:
    """``sum_i E_i^T A_i E_i`` over rows, for per-row ``m x m`` matrices ``A_i``, by blocks.

    A row's direct block (the same entries of ``u`` for every row) arrives summed; its cells
    lie in its groups' rows of each table, so the direct-by-cell and same-table cell-by-cell
    blocks are summed with ``np.bincount`` into arrays of the tables' size. Only two tables'
    cells (crossed factors) need a sparse matrix of arbitrary pairs. The sparse matrix in
    ``u`` is made once, by :meth:`matrix`, not per chunk (sorting the pairs of every chunk
    was 70% of a pass).
    """

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        n_direct = layout.n_direct
        self.direct = np.zeros((n_direct, n_direct))
        self.direct_cell = [np.zeros((n_direct, g * s)) for g, s in _tables(layout)]
        self.cell_cell = [np.zeros(g * s * s) for g, s in _tables(layout)]
        self.crossed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(
        self,
        groups: Sequence[np.ndarray],
        direct: np.ndarray,
        direct_cell: np.ndarray,
        cell_cell: np.ndarray,
    ) -> None:
        """Add a chunk: ``direct`` summed (|D|, |D|), the rest per row (n, |D|, c), (n, c, c)."""
        layout = self.layout
        self.direct += direct
        columns = layout.cell_columns
        n_direct = layout.n_direct
        for k, ((n_groups, size), group) in enumerate(zip(_tables(layout), groups, strict=True)):
            local = group[:, None] * size + np.arange(size)  # (n, s): entries within table k
            if n_direct:
                keys = np.arange(n_direct)[None, :, None] * (n_groups * size) + local[:, None, :]
                self.direct_cell[k] += np.bincount(
                    keys.ravel(),
                    weights=direct_cell[:, :, columns[k]].ravel(),
                    minlength=n_direct * n_groups * size,
                ).reshape(n_direct, n_groups * size)
            keys = group[:, None, None] * size * size + np.arange(size * size).reshape(size, size)
            self.cell_cell[k] += np.bincount(
                keys.ravel(),
                weights=cell_cell[:, columns[k], columns[k]].ravel(),
                minlength=n_groups * size * size,
            )
            for other in range(k + 1, len(groups)):
                other_size = layout.cell_sizes[other]
                other_local = groups[other][:, None] * other_size + np.arange(other_size)
                rows = np.broadcast_to(local[:, :, None], (group.size, size, other_size))
                cols = np.broadcast_to(other_local[:, None, :], rows.shape)
                self.crossed.append(
                    (
                        cell_cell[:, columns[k], columns[other]].ravel(),
                        layout.offsets[k] + rows.ravel(),
                        layout.offsets[other] + cols.ravel(),
                    )
                )

    def matrix(self) -> sparse.csr_matrix:
        """Return the sum as a symmetric sparse matrix over ``u``."""
        layout = self.layout
        width = int(layout.offsets[-1])
        n_direct = layout.n_direct
        values, rows, cols = [self.direct.ravel()], [], []
        square = np.indices((n_direct, n_direct)).reshape(2, -1)
        rows.append(square[0])
        cols.append(square[1])
        for k, (n_groups, size) in enumerate(_tables(layout)):
            offset = int(layout.offsets[k])
            block = np.indices((n_direct, n_groups * size)).reshape(2, -1)
            for first, second in ((block[0], offset + block[1]), (offset + block[1], block[0])):
                values.append(self.direct_cell[k].ravel())
                rows.append(first)
                cols.append(second)
            group, row_slot, col_slot = np.indices((n_groups, size, size)).reshape(3, -1)
            values.append(self.cell_cell[k])
            rows.append(offset + group * size + row_slot)
            cols.append(offset + group * size + col_slot)
        for crossed_values, first, second in self.crossed:
            values.extend([crossed_values, crossed_values])
            rows.extend([first, second])
            cols.extend([second, first])
        return sparse.coo_matrix(
            (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))),
            shape=(width, width),
        ).tocsr()


def _tables(layout: _Layout) -> list[tuple[int, int]]:
    return list(zip(layout.n_groups, layout.cell_sizes, strict=True))


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

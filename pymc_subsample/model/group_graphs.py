"""The compiled graphs of a per-group update: the groups' parts, the rows' changes and residuals.

Builders for ``model/group_effects.py`` (which finds the structure they read), each a
function of a :class:`~pymc_subsample.model.grouped_rows.GroupedRows` returning ``(inputs,
outputs)`` for :class:`~pymc_subsample.model.compiled.LazyFunction`:

- :func:`parts_graph`, data-free, per grouping factor: each group's prior term, its gradient
  and Hessian block in the group's effects, the factor's cells and their Jacobian block (one
  forward-mode pass per coordinate of a group, every group's j-th coordinate at once, exact
  because no cell or prior term reads two groups);
- :func:`change_graph`: each row's log-likelihood at a new point and tables less at the old;
- :func:`residual_graph`: that change less the change of the row's second-order Taylor proxy
  around the reference (``docs/architecture.md``, "Group effects").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import disconnected_grad
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.data_terms import without_data_terms
from pymc_subsample.model.gradients import _pushforward
from pymc_subsample.model.grouped_rows import GroupedRows

__all__ = ["GroupFactor", "change_graph", "parts_graph", "residual_graph", "variable_offsets"]


class GroupFactor(NamedTuple):
    """One grouping factor: the tables read by one group index, and the effects behind them.

    Attributes
    ----------
    gathers : tuple of int
        The factor's gathers (positions in ``GroupedRows.gathers``), all indexed alike.
    n_groups : int
    coordinates : ndarray
        ``(n_groups, k)`` int64: group g's effects are ``q[coordinates[g]]``.
    cell_columns : ndarray
        The factor's cells among a row's cell entries (positions in the concatenation of every
        gather's cell, the ``psi`` layout of ``per_row_derivatives_graph`` without direct
        coordinates).
    reads_hyperparameters : bool
        Whether its tables read step variables other than its effects (a non-centred
        hierarchy's ``mu`` and ``sd``); they are then affine in the effects, with one cell
        entry per effect (checked).
    """

    gathers: tuple[int, ...]
    n_groups: int
    coordinates: np.ndarray
    cell_columns: np.ndarray
    reads_hyperparameters: bool

    @property
    def size(self) -> int:
        """``k``: the effects of one group."""
        return int(self.coordinates.shape[1])

    @property
    def cell_size(self) -> int:
        """``c``: the cells of one group."""
        return int(self.cell_columns.size)


def variable_offsets(var_layout: Sequence[tuple[str, tuple[int, ...]]]) -> list[int]:
    """Return each step variable's first coordinate in ``q``."""
    sizes = [int(np.prod(shape, dtype=int)) for _, shape in var_layout]
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])[:-1]]


def _table_inputs(grouped: GroupedRows, name: str) -> list[TensorVariable]:
    """One float64 ``(n_groups, cell_size)`` input per gather (the ``parts`` tables' layout)."""
    return [
        pt.matrix(f"{name}_{k}", dtype="float64", shape=(gather.n_groups, gather.cell_size))
        for k, gather in enumerate(grouped.gathers)
    ]


def _row_cells(grouped: GroupedRows, tables: Sequence[TensorVariable]) -> list[TensorVariable]:
    """Each row's cell of every gather, read from the tables by the rows' group indices."""
    cells = []
    for gather, table in zip(grouped.gathers, tables, strict=True):
        index = pt.cast(gather.group_index, "int64")
        # A scalar cell (a varying intercept's a[g]) is read from the table's one column: a
        # vector's gather, which PyTensor's Numba backend fuses into the elementwise loop that
        # reads it, where a matrix's is a loop of its own (on the centred Poisson benchmark
        # model, a group sweep's cost per row read went from 48-53 ns to 42-46 ns).
        rows = table[:, 0][index] if gather.cell_size == 1 else table[index]
        cell = rows.reshape((index.shape[0], *gather.cell.type.shape[1:]))
        cells.append(pt.cast(cell, gather.cell.dtype))
    return cells


def _at_cells(
    rows_logp: TensorVariable, grouped: GroupedRows, cells: Sequence[TensorVariable]
) -> TensorVariable:
    replace: dict[Variable, Variable] = {
        gather.cell: cell for gather, cell in zip(grouped.gathers, cells, strict=True)
    }
    return cast(TensorVariable, clone_replace(rows_logp, replace=replace, rebuild_strict=False))


def _at_point(rows_logp: TensorVariable, grouped: GroupedRows, point: Variable) -> TensorVariable:
    """Return the rows' graph reading the shared coefficients from ``point``, not ``q``."""
    replace: dict[Variable, Variable] = {grouped.vector: point}
    return cast(TensorVariable, clone_replace(rows_logp, replace=replace, rebuild_strict=False))


def _change(
    grouped: GroupedRows,
) -> tuple[list[Variable], list[TensorVariable], TensorVariable]:
    """``l_i = F_i(q_new, new cells) - F_i(q_old, old cells)``: inputs, tables and graph."""
    old, new = _table_inputs(grouped, "old"), _table_inputs(grouped, "new")
    q_new = grouped.vector.type("q_new")
    # Summands that read only the data cancel in the difference (model/data_terms.py).
    rows = without_data_terms(grouped.rows_logp, list(grouped.row_inputs))
    change = _at_cells(_at_point(rows, grouped, q_new), grouped, _row_cells(grouped, new)) - (
        _at_cells(rows, grouped, _row_cells(grouped, old))
    )
    return [grouped.vector, q_new], [*old, *new], change


def change_graph(grouped: GroupedRows) -> tuple[list[Variable], Variable]:
    """Build ``l_i = F_i(q_new, new cells) - F_i(q_old, old cells)``."""
    points, tables, change = _change(grouped)
    return [*points, *tables, *grouped.row_inputs], change


def residual_graph(
    grouped: GroupedRows, frozen_rows: TensorVariable
) -> tuple[list[Variable], Variable]:
    """Build ``l_i - t_i``: a move's change less its second-order proxy's.

    Row i's proxy is its second-order Taylor expansion around ``psi_r = (q_ref on the shared
    coefficients, the reference cells)``, the other variables frozen at the reference. ``a``
    and ``b`` are the old and new points' offsets from ``psi_r``: a move of a factor's effects
    changes only that factor's cells (the shared coefficients' and other factors' offsets,
    the same in both, enter through the cross terms), a move of the shared coefficients only
    their part. With ``g_i``, ``H_i`` the row's
    gradient and Hessian at ``psi_r``, ``t_i = g_i . (b - a) + (b - a) . H_i (b + a) / 2``:
    two directional derivatives of the rows' vector (forward mode, as
    ``gradients.per_row_proxy_terms`` takes them), no gradient vector per row.
    """
    points_q, tables, change = _change(grouped)
    q_old, q_new = points_q
    n_gathers = len(grouped.gathers)
    old, new = tables[:n_gathers], tables[n_gathers:]
    reference = _table_inputs(grouped, "reference")
    q_ref = grouped.vector.type("q_ref")
    old_cells = [pt.cast(c, "float64") for c in _row_cells(grouped, old)]
    new_cells = [pt.cast(c, "float64") for c in _row_cells(grouped, new)]
    reference_cells = [pt.cast(c, "float64") for c in _row_cells(grouped, reference)]
    # The expansion is taken at placeholders for the reference cells, put in after.
    points = [
        pt.tensor(f"point_{k}", dtype="float64", shape=(None, *gather.cell.type.shape[1:]))
        for k, gather in enumerate(grouped.gathers)
    ]
    cast_points = [
        pt.cast(point, gather.cell.dtype)
        for point, gather in zip(points, grouped.gathers, strict=True)
    ]
    at_reference = _at_cells(_at_point(frozen_rows, grouped, q_ref), grouped, cast_points)
    mask = np.zeros(int(cast(Any, grouped.vector.type).shape[0]))
    mask[grouped.direct] = 1.0
    shared_old = pt.constant(mask) * (q_old - q_ref)
    shared_new = pt.constant(mask) * (q_new - q_ref)
    offsets_old, offsets_new = [], []
    for k in range(n_gathers):
        # Every cell's offset from the reference: a factor's move changes only its own, the
        # others' enter through the cross terms (the same in a and b).
        offsets_old.append(old_cells[k] - points[k])
        offsets_new.append(new_cells[k] - points[k])
    # Only where the rows read shared coefficients is q_ref an input of the expansion.
    shared = [q_ref] if grouped.direct.size else []
    wrt = [*shared, *points]
    step = [
        *(shared_new - shared_old for _ in shared),
        *(b - a for a, b in zip(offsets_old, offsets_new, strict=True)),
    ]
    centre = [
        *(disconnected_grad(shared_new + shared_old) for _ in shared),
        *(disconnected_grad(b + a) for a, b in zip(offsets_old, offsets_new, strict=True)),
    ]
    along_step = _along(at_reference, wrt, step)
    along_centre = _along(at_reference, wrt, centre)
    second = _along(along_centre, wrt, step)
    proxy = cast(
        TensorVariable,
        clone_replace(
            along_step + 0.5 * second,
            replace=cast(
                dict[Variable, Variable],
                dict(zip(points, reference_cells, strict=True)),
            ),
            rebuild_strict=False,
        ),
    )
    inputs: list[Variable] = [q_old, q_new, q_ref, *old, *new, *reference, *grouped.row_inputs]
    return inputs, change - proxy


def _along(
    rows: TensorVariable, wrt: Sequence[Variable], directions: Sequence[Variable]
) -> TensorVariable:
    """Per-row derivative of ``rows`` along ``directions`` (one per input in ``wrt``).

    The sum of one pushforward per input: PyTensor's pushforward of a list of inputs kept only
    one of them here.
    """
    terms = [
        cast(TensorVariable, _pushforward(rows, point, direction))
        for point, direction in zip(wrt, directions, strict=True)
    ]
    return cast(TensorVariable, sum(terms[1:], terms[0]))


def parts_graph(
    grouped: GroupedRows,
    prior_terms: Sequence[TensorVariable],
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    factor: GroupFactor,
) -> tuple[list[Variable], list[Variable]]:
    """Build one factor's data-free parts (the module docstring's ``parts``)."""
    q = grouped.vector
    n_groups, k = factor.n_groups, factor.size
    owned = {
        int(np.searchsorted(variable_offsets(var_layout), c, side="right") - 1)
        for c in factor.coordinates[0]
    }
    per_group = pt.zeros((n_groups,), dtype="float64")
    for v in sorted(owned):
        term = pt.cast(prior_terms[v], "float64")
        per_group = per_group + (
            term.reshape((n_groups, -1)).sum(axis=1) if term.ndim > 1 else term
        )
    total = per_group.sum()
    gradient = cast(TensorVariable, pytensor.grad(total, q, disconnected_inputs="ignore"))
    coordinates = pt.constant(factor.coordinates)
    cells = pt.concatenate(
        [
            pt.cast(grouped.gathers[g].table, "float64").reshape((n_groups, -1))
            for g in factor.gathers
        ],
        axis=1,
    )
    hessian_columns, jacobian_columns = [], []
    length = int(cast(Any, q.type).shape[0])
    for j in range(k):
        comb = np.zeros(length)
        comb[factor.coordinates[:, j]] = 1.0
        direction = pt.constant(comb)
        hessian_columns.append(
            cast(TensorVariable, _pushforward(gradient, q, direction))[coordinates]
        )
        jacobian_columns.append(_pushforward(cells, q, direction))
    tables = [
        pt.cast(gather.table, "float64").reshape((gather.n_groups, -1))
        for gather in grouped.gathers
    ]
    outputs: list[Variable] = [
        per_group,
        gradient[coordinates],
        pt.stack(hessian_columns, axis=2),
        cells,
        pt.stack(jacobian_columns, axis=2),
        *tables,
    ]
    return [q], outputs

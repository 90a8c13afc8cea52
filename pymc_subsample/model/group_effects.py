"""A hierarchy's group effects: the structure that lets each group be updated on its own rows.

Where the rows read the step's variables only through group tables (``effect[group_index]``,
``model/grouped_rows.py``) and each variable's prior factorises over its leading (group)
axis, the conditional posterior of the step's variables given every other model variable is a
product over groups: group g's effects ``x_g`` read only group g's rows and their own prior
terms,

    log pi(x_g | rest) = log p(x_g | hyperparameters) + sum_{i in g} F(T(x)[g_i], row_i).

:func:`group_effect_functions` checks that structure on the model's graphs (and numerically, by
moving half the groups' effects and watching which tables and prior terms change) and compiles
what a per-group update reads (``kernels/group_effects.py``; ``docs/architecture.md``, "Group
effects"):

- ``parts``, data-free, per grouping factor: each group's prior term, its gradient and Hessian
  block in ``x_g``, the factor's cells ``T(x)[g]`` and their Jacobian block in ``x_g`` (one
  forward-mode pass per coordinate of a group: every group's j-th coordinate moves at once,
  which is exact because no cell or prior term reads two groups);
- ``change``, per row, the log-likelihood's difference between two sets of tables, with the
  other model variables read live;
- ``residual``, per factor and row, that difference less the difference of the row's
  second-order Taylor proxy in the factor's cells around the reference tables, the other
  variables frozen at the reference (the control variate, ``docs/control_variates.md``): one
  call reads the rows' groups, their cells and both terms;
- ``derivatives``, per row, the first and second derivatives in the cells at the reference, for
  the exact sums of the proxies over each group.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import disconnected_grad
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.gradients import _pushforward
from pymc_subsample.model.grouped_rows import (
    GroupedRows,
    find_grouped_rows,
    index_graph,
    per_row_derivatives_graph,
)

__all__ = ["GroupFactor", "GroupEffectFunctions", "group_effect_functions"]


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


class GroupEffectFunctions(NamedTuple):
    """What a per-group update reads, each function compiled at its first call."""

    factors: tuple[GroupFactor, ...]
    #: Coordinates of the step's variables that no row reads (a centred hierarchy's
    #: hyperparameters): their conditional given the rest is the prior's.
    free_coordinates: np.ndarray
    #: ``q -> (prior (G,), gradient (G, k), hessian (G, k, k), cells (G, c), jacobian (G, c, k),
    #: *tables)`` per factor; tables are every gather's ``(G_k, c_k)``.
    parts: tuple[LazyFunction, ...]
    #: Coordinates the rows read directly: coefficients shared by every row.
    direct_coordinates: np.ndarray
    #: ``(q_old, q_new, *old_tables, *new_tables, *rows) -> l_i``, the others read live.
    change: LazyFunction
    #: ``(q_old, q_new, q_ref, *old_tables, *new_tables, *reference_tables, *rows) ->
    #: l_i - t_i`` for a move of a factor's effects or of the shared coefficients.
    residual: LazyFunction
    #: ``(q, *cells, *rows) -> (F_i, dF_i/dcells, d2F_i/dcells2, _)`` at the frozen values.
    derivatives: LazyFunction
    #: ``rows -> each gather's group index``.
    indices: LazyFunction
    cell_shapes: tuple[tuple[int, ...], ...]
    cell_dtypes: tuple[str, ...]


def group_effect_functions(
    rows_q: TensorVariable,
    q: TensorVariable,
    row_inputs: Sequence[TensorVariable],
    prior_terms: Sequence[TensorVariable],
    prior_q: TensorVariable,
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    frozen: Sequence[tuple[Variable, Variable]],
    q0: np.ndarray,
    compile_kwargs: dict[str, Any],
) -> GroupEffectFunctions | str:
    """Check the group structure of a step's variables and build its functions.

    Parameters
    ----------
    rows_q : TensorVariable
        Per-row log-likelihood, a graph of ``q`` and the row placeholders (other variables live).
    q : TensorVariable
        The step's raveled variables.
    row_inputs : sequence of TensorVariable
        The row placeholders.
    prior_terms : sequence of TensorVariable
        Each step variable's elementwise log-density (with its transform's Jacobian), a graph
        of ``q``, in the order of ``var_layout``.
    prior_q : TensorVariable
        The whole prior (every free variable, potential and off-row term) as a graph of ``q``.
    var_layout : sequence of (name, shape)
        The step's variables in ``q``'s order.
    frozen : sequence of (live, frozen) shared variables
        The other variables' live values and the copies frozen at the reference.
    q0 : ndarray
        A point, where shapes and the structure are checked.
    compile_kwargs : dict
        Passed to PyTensor's compiler.

    Returns
    -------
    GroupEffectFunctions, or str
        The functions, or why the structure does not hold, in the user's words.
    """
    grouped = find_grouped_rows(rows_q, q, row_inputs, q0)
    if grouped is None:
        return "no row reads them through a group index (effect[group_index])"
    factors = _factors(grouped, var_layout, q0)
    if isinstance(factors, str):
        return factors
    direct = grouped.direct
    grouped_coordinates = np.concatenate([f.coordinates.ravel() for f in factors])
    if np.intersect1d(direct, grouped_coordinates).size:
        return "the likelihood reads a group effect directly, not only through its group index"
    free = np.setdiff1d(np.arange(q0.size), grouped_coordinates).astype("int64")
    free = np.setdiff1d(free, direct).astype("int64")
    if any(f.reads_hyperparameters for f in factors) and direct.size:
        # A hyperparameter read by a table must not be read directly: its moves hold the
        # groups' parameters fixed, so that the rows do not change.
        table_free = _coordinates_read_by_tables(grouped, var_layout, q0)
        if np.intersect1d(table_free, direct).size:
            return (
                "a variable is read both directly and inside the group parameters (as mu in "
                "mu + a[g] with a = mu + sd * z)"
            )
    tables = [gather.table for gather in grouped.gathers]
    probe = pytensor.function(
        [q], [*prior_terms, prior_q, *tables], mode="FAST_COMPILE", on_unused_input="ignore"
    )
    problem = _check_separable(probe, factors, var_layout, free, len(prior_terms), q0)
    problem = problem or _check_affine(probe, factors, len(prior_terms), q0)
    if problem:
        return problem
    frozen_rows = cast(
        TensorVariable,
        clone_replace(grouped.rows_logp, replace=dict(frozen), rebuild_strict=False),
    )
    cells = [gather.cell for gather in grouped.gathers]
    return GroupEffectFunctions(
        factors=factors,
        free_coordinates=free,
        parts=tuple(
            LazyFunction(partial(_parts_graph, grouped, prior_terms, var_layout, f), compile_kwargs)
            for f in factors
        ),
        direct_coordinates=direct,
        change=LazyFunction(partial(_change_graph, grouped), compile_kwargs),
        residual=LazyFunction(partial(_residual_graph, grouped, frozen_rows), compile_kwargs),
        derivatives=LazyFunction(
            partial(per_row_derivatives_graph, grouped._replace(rows_logp=frozen_rows)),
            compile_kwargs,
        ),
        indices=LazyFunction(partial(index_graph, grouped), compile_kwargs),
        cell_shapes=tuple(tuple(int(d) for d in c.type.shape[1:]) for c in cells),
        cell_dtypes=tuple(str(c.dtype) for c in cells),
    )


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
        cell = table[index].reshape((index.shape[0], *gather.cell.type.shape[1:]))
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
    rows = grouped.rows_logp
    change = _at_cells(_at_point(rows, grouped, q_new), grouped, _row_cells(grouped, new)) - (
        _at_cells(rows, grouped, _row_cells(grouped, old))
    )
    return [grouped.vector, q_new], [*old, *new], change


def _change_graph(grouped: GroupedRows) -> tuple[list[Variable], Variable]:
    """Build ``l_i = F_i(q_new, new cells) - F_i(q_old, old cells)``."""
    points, tables, change = _change(grouped)
    return [*points, *tables, *grouped.row_inputs], change


def _residual_graph(
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


def _coordinates_read_by_tables(
    grouped: GroupedRows, var_layout: Sequence[tuple[str, tuple[int, ...]]], q0: np.ndarray
) -> np.ndarray:
    """Coordinates of every step variable some table reads."""
    starts = _offsets(var_layout)
    read: set[int] = set()
    for gather in grouped.gathers:
        read.update(_variables_read(gather.table, grouped.vector, var_layout, q0))
    pieces = [
        np.arange(starts[v], starts[v] + int(np.prod(var_layout[v][1], dtype=int)))
        for v in sorted(read)
    ]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def _offsets(var_layout: Sequence[tuple[str, tuple[int, ...]]]) -> list[int]:
    sizes = [int(np.prod(shape, dtype=int)) for _, shape in var_layout]
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)])[:-1]]


def _factors(
    grouped: GroupedRows, var_layout: Sequence[tuple[str, tuple[int, ...]]], q0: np.ndarray
) -> tuple[GroupFactor, ...] | str:
    """Group the gathers by their index and give each step variable to one factor."""
    by_index: dict[Variable, list[int]] = {}
    for k, gather in enumerate(grouped.gathers):
        by_index.setdefault(gather.group_index, []).append(k)
    offsets = _offsets(var_layout)
    cell_starts = np.concatenate([[0], np.cumsum([g.cell_size for g in grouped.gathers])])
    q = grouped.vector
    # Which step variables each gather's table reads: through q's slices (join_nonshared_inputs).
    reads = [_variables_read(gather.table, q, var_layout, q0) for gather in grouped.gathers]
    factor_gathers = list(by_index.values())
    # A variable a factor's tables read is one of its group effects where its first axis is
    # the groups' axis, and a hyperparameter of the factor otherwise (mu and sd in
    # a = mu + sd * z): the step moves those with the groups' parameters held fixed.
    owner: dict[int, int] = {}
    reads_hyperparameters = [False] * len(factor_gathers)
    hyper: set[int] = set()
    for f, gathers in enumerate(factor_gathers):
        n_groups = grouped.gathers[gathers[0]].n_groups
        for v in sorted({v for k in gathers for v in reads[k]}):
            shape = var_layout[v][1]
            if shape and shape[0] == n_groups:
                if owner.setdefault(v, f) != f:
                    return (
                        f"{var_layout[v][0]!r} is read through two different group indices; "
                        "give each grouping factor its own variables"
                    )
            else:
                hyper.add(v)
                reads_hyperparameters[f] = True
    if hyper & set(owner):
        both = sorted(hyper & set(owner))
        return (
            f"{var_layout[both[0]][0]!r} is a group effect of one grouping factor and a "
            "hyperparameter of another"
        )
    factors = []
    for f, gathers in enumerate(factor_gathers):
        n_groups = grouped.gathers[gathers[0]].n_groups
        own = [v for v in range(len(var_layout)) if owner.get(v) == f]
        if not own:
            continue
        columns = []
        for v in own:
            shape = var_layout[v][1]
            inner = int(np.prod(shape[1:], dtype=int))
            base = offsets[v] + inner * np.arange(n_groups)[:, None]
            columns.append(base + np.arange(inner)[None, :])
        cell_columns = np.concatenate(
            [np.arange(cell_starts[k], cell_starts[k + 1]) for k in gathers]
        )
        factors.append(
            GroupFactor(
                gathers=tuple(gathers),
                n_groups=n_groups,
                coordinates=np.concatenate(columns, axis=1).astype("int64"),
                cell_columns=cell_columns.astype("int64"),
                reads_hyperparameters=reads_hyperparameters[f],
            )
        )
    if not factors:
        return "no group table reads them"
    return tuple(factors)


def _variables_read(
    table: TensorVariable,
    q: TensorVariable,
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    q0: np.ndarray,
) -> list[int]:
    """Step variables a table depends on, by moving each variable's slice of ``q``."""
    if q not in set(ancestors([table])):
        return []
    function = pytensor.function([q], table, mode="FAST_COMPILE", on_unused_input="ignore")
    base = np.asarray(function(q0))
    read = []
    rng = np.random.default_rng(0)
    for v, start in enumerate(_offsets(var_layout)):
        size = int(np.prod(var_layout[v][1], dtype=int))
        moved = q0.copy()
        moved[start : start + size] += rng.uniform(0.1, 0.2, size=size)
        if not np.array_equal(np.asarray(function(moved)), base):
            read.append(v)
    return read


def _check_affine(
    probe: Any, factors: tuple[GroupFactor, ...], n_terms: int, q0: np.ndarray
) -> str:
    """Where a factor's tables read hyperparameters, check ``c_g = A(h) + B_g(h) x_g``.

    The hyperparameters' moves hold the cells fixed by solving for the effects
    (``kernels/hyper_walk.py``), which needs ``B_g`` square: one cell entry per effect. The
    tables' second difference along a random move of the effects must vanish.
    """
    rng = np.random.default_rng(2)
    for factor in factors:
        if not factor.reads_hyperparameters:
            continue
        if factor.cell_size != factor.size:
            return (
                "its group parameters depend on hyperparameters (a non-centred hierarchy) "
                f"but have {factor.cell_size} entries per group for {factor.size} effects"
            )
        step = np.zeros_like(q0)
        step[factor.coordinates.ravel()] = rng.uniform(0.2, 0.4, size=factor.coordinates.size)
        values = [probe(q0 + t * step)[n_terms + 1 :] for t in (0.0, 1.0, 2.0)]
        for k in factor.gathers:
            first, middle, last = (np.asarray(v[k], dtype=float) for v in values)
            curvature = np.abs(last - 2.0 * middle + first)
            if np.any(curvature > 1e-8 * (1.0 + np.abs(middle))):
                return (
                    "its group parameters depend on hyperparameters and are not an affine "
                    "function of the group effects (as mu + sd * z is)"
                )
    return ""


def _check_separable(
    probe: Any,
    factors: tuple[GroupFactor, ...],
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    free: np.ndarray,
    n_terms: int,
    q0: np.ndarray,
) -> str:
    """Move half of each factor's groups: only their tables' rows and prior terms may change."""
    rng = np.random.default_rng(1)
    base = [np.asarray(x) for x in probe(q0)]
    terms, prior, tables = base[:n_terms], float(base[n_terms]), base[n_terms + 1 :]
    own_total = sum(float(np.sum(t)) for t in terms)
    for factor in factors:
        for _ in range(2):
            moved_groups = rng.random(factor.n_groups) < 0.5
            if not moved_groups.any():
                moved_groups[0] = True
            moved = q0.copy()
            moved[factor.coordinates[moved_groups].ravel()] += rng.uniform(
                0.05, 0.15, size=int(moved_groups.sum()) * factor.size
            )
            after = [np.asarray(x) for x in probe(moved)]
            for k in factor.gathers:
                changed = np.any(
                    (after[n_terms + 1 + k] != tables[k]).reshape(factor.n_groups, -1), axis=1
                )
                if np.any(changed & ~moved_groups):
                    return (
                        "a group's parameters depend on another group's effects (the table "
                        "read by the group index mixes groups)"
                    )
            for before_term, after_term in zip(terms, after[:n_terms], strict=True):
                if before_term.ndim == 0 or before_term.shape[0] != factor.n_groups:
                    continue
                changed = np.any((after_term != before_term).reshape(factor.n_groups, -1), axis=1)
                if np.any(changed & ~moved_groups):
                    return (
                        "the prior of a group's effects reads another group's (a distribution "
                        "across groups, such as a multivariate normal over the groups' axis)"
                    )
            new_total = sum(float(np.sum(t)) for t in after[:n_terms])
            if not np.isclose(
                float(after[n_terms]) - new_total, prior - own_total, rtol=1e-9, atol=1e-8
            ):
                return (
                    "another variable's prior depends on them (they are the parameters of a "
                    "further variable or a Potential), so groups are not independent given "
                    "the rest"
                )
    starts = _offsets(var_layout)
    for (name, shape), term, start in zip(var_layout, terms, starts, strict=True):
        if start in set(free.tolist()) or not shape:
            continue
        if term.ndim == 0 or term.shape[0] != shape[0]:
            return (
                f"the prior of {name!r} does not factorise over its groups (its log-density "
                "is not one term per group, e.g. a multivariate distribution across groups)"
            )
    return ""


def _parts_graph(
    grouped: GroupedRows,
    prior_terms: Sequence[TensorVariable],
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    factor: GroupFactor,
) -> tuple[list[Variable], list[Variable]]:
    """Build one factor's data-free parts (the module docstring's ``parts``)."""
    q = grouped.vector
    n_groups, k = factor.n_groups, factor.size
    owned = {
        int(np.searchsorted(_offsets(var_layout), c, side="right") - 1)
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

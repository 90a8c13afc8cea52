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

- ``parts``, data-free, per grouping factor (``group_graphs.parts_graph``);
- ``change``, per row, the log-likelihood's difference between two points and sets of
  tables, the other model variables read live (``group_graphs.change_graph``);
- ``residual``, per row, that difference less the difference of the row's second-order
  Taylor proxy in ``(shared coefficients, cells)`` around the reference, the other variables
  frozen there (the control variate, ``group_graphs.residual_graph``);
- ``derivatives``, per row, the first and second derivatives in ``psi`` at the reference, for
  the exact sums of the proxies by group.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np
import pytensor
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.group_graphs import (
    GroupFactor,
    change_graph,
    parts_graph,
    residual_graph,
    variable_offsets,
)
from pymc_subsample.model.grouped_rows import (
    GroupedRows,
    find_grouped_rows,
    index_graph,
    per_row_derivatives_graph,
)

__all__ = ["NO_GROUP_INDEX", "GroupFactor", "GroupEffectFunctions", "group_effect_functions"]


#: Why a model is no hierarchy at all (no other reason means it is one the step refuses).
NO_GROUP_INDEX = "no row reads them through a group index (effect[group_index])"


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
        return NO_GROUP_INDEX
    factors = _checked_factors(grouped, var_layout, q0)
    if isinstance(factors, str):
        # Moving a parameter inside a gather (``sink_gathers``) can leave it read both there
        # and directly (``sigma`` in ``Normal(mu + sigma * z[g], sigma)``): the rows as
        # written, with it a coefficient every row reads, may still have the structure.
        plain = find_grouped_rows(rows_q, q, row_inputs, q0, sink=False)
        if plain is None:
            return factors
        plain_factors = _checked_factors(plain, var_layout, q0)
        if isinstance(plain_factors, str):
            return factors
        grouped, factors = plain, plain_factors
    direct = grouped.direct
    grouped_coordinates = np.concatenate([f.coordinates.ravel() for f in factors])
    free = np.setdiff1d(np.arange(q0.size), grouped_coordinates).astype("int64")
    free = np.setdiff1d(free, direct).astype("int64")
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
            LazyFunction(partial(parts_graph, grouped, prior_terms, var_layout, f), compile_kwargs)
            for f in factors
        ),
        direct_coordinates=direct,
        change=LazyFunction(partial(change_graph, grouped), compile_kwargs),
        residual=LazyFunction(partial(residual_graph, grouped, frozen_rows), compile_kwargs),
        derivatives=LazyFunction(
            partial(per_row_derivatives_graph, grouped._replace(rows_logp=frozen_rows)),
            compile_kwargs,
            interpreted_first=True,
        ),
        indices=LazyFunction(partial(index_graph, grouped), compile_kwargs, interpreted_first=True),
        cell_shapes=tuple(tuple(int(d) for d in c.type.shape[1:]) for c in cells),
        cell_dtypes=tuple(str(c.dtype) for c in cells),
    )


def _checked_factors(
    grouped: GroupedRows,
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    q0: np.ndarray,
) -> tuple[GroupFactor, ...] | str:
    """Return the grouping factors, or why the rows do not factorise over groups (user words)."""
    factors = _factors(grouped, var_layout, q0)
    if isinstance(factors, str):
        return factors
    direct = grouped.direct
    grouped_coordinates = np.concatenate([f.coordinates.ravel() for f in factors])
    if np.intersect1d(direct, grouped_coordinates).size:
        return "the likelihood reads a group effect directly, not only through its group index"
    if any(f.reads_hyperparameters for f in factors) and direct.size:
        # A hyperparameter read by a table must not be read directly: its moves hold the
        # groups' parameters fixed, so that the rows do not change.
        table_free = _coordinates_read_by_tables(grouped, var_layout, q0)
        if np.intersect1d(table_free, direct).size:
            return (
                "a variable is read both directly and inside the group parameters (as mu in "
                "mu * x + a[g] with a = mu + sd * z)"
            )
    return factors


def _coordinates_read_by_tables(
    grouped: GroupedRows, var_layout: Sequence[tuple[str, tuple[int, ...]]], q0: np.ndarray
) -> np.ndarray:
    """Coordinates of every step variable some table reads."""
    starts = variable_offsets(var_layout)
    read: set[int] = set()
    for gather in grouped.gathers:
        read.update(_variables_read(gather.table, grouped.vector, var_layout, q0))
    pieces = [
        np.arange(starts[v], starts[v] + int(np.prod(var_layout[v][1], dtype=int)))
        for v in sorted(read)
    ]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def _factors(
    grouped: GroupedRows, var_layout: Sequence[tuple[str, tuple[int, ...]]], q0: np.ndarray
) -> tuple[GroupFactor, ...] | str:
    """Group the gathers by their index and give each step variable to one factor."""
    by_index: dict[Variable, list[int]] = {}
    for k, gather in enumerate(grouped.gathers):
        by_index.setdefault(gather.group_index, []).append(k)
    offsets = variable_offsets(var_layout)
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
        # A group effect has one value per group along its first axis; a ZeroSumNormal's
        # unconstrained value, say, has one fewer.
        return "no sampled variable holds one value per group along its first axis"
    return tuple(factors)


def _variables_read(
    table: TensorVariable,
    q: TensorVariable,
    var_layout: Sequence[tuple[str, tuple[int, ...]]],
    q0: np.ndarray,
) -> list[int]:
    """Step variables a table depends on, by moving each variable's slice of ``q``.

    From a point moved off ``q0`` in every coordinate: at ``q0`` itself a product can hide a
    factor (``sigma`` in ``mu + sigma * z`` where every ``z`` starts at 0).
    """
    if q not in set(ancestors([table])):
        return []
    function = pytensor.function([q], table, mode="FAST_COMPILE", on_unused_input="ignore")
    rng = np.random.default_rng(0)
    start_point = q0 + rng.uniform(0.1, 0.2, size=q0.shape)
    base = np.asarray(function(start_point))
    read = []
    for v, start in enumerate(variable_offsets(var_layout)):
        size = int(np.prod(var_layout[v][1], dtype=int))
        moved = start_point.copy()
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
    starts = variable_offsets(var_layout)
    for (name, shape), term, start in zip(var_layout, terms, starts, strict=True):
        if start in set(free.tolist()) or not shape:
            continue
        if term.ndim == 0 or term.shape[0] != shape[0]:
            return (
                f"the prior of {name!r} does not factorise over its groups (its log-density "
                "is not one term per group, e.g. a multivariate distribution across groups)"
            )
    return ""

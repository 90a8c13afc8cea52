"""Rows that read parameters through a group index: the hierarchy's structure in the rows' graph.

In a hierarchical model a row reads its group's effects by indexing a table of parameters
with a row-aligned integer array, ``effect[group_index]``: row i depends on the table only
through its own cell ``effect[g_i]``. :func:`find_grouped_rows` finds those gathers in the
rows' graph of a parameter vector ``v`` (the sampled ``q``, or the likelihood's parameters
``theta``) and rewrites the rows on small per-row vectors

    psi_i = (v_D, cell_1[g_i1], ..., cell_K[g_iK]),

where ``v_D`` are the coordinates the rows still read directly (the shared coefficients) and
each cell is a row of a table ``T_k(v)``, a graph of ``v`` alone. Row i's log-likelihood is
``F(psi_i, row_i)``, with ``m = |D| + sum_k |cell_k|`` inputs whatever the number of groups,
so its gradient and Hessian in ``psi`` are small and contain no scatter into a table
(``AdvancedIncSubtensor``, whose compile and run cost grew with groups times rows). The chain
rule through ``psi_i = P_i(v)`` gives back the sums in ``v`` (``model/grouped_sums.py``;
``docs/architecture.md``, "Grouped rows").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.gradient import jacobian
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors, toposort
from pytensor.scalar import basic as ps
from pytensor.tensor import subtensor
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.subtensor import AdvancedSubtensor, Subtensor, indices_from_subtensor
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.gradients import _pushforward
from pymc_subsample.warnings import missing_blas_notice_silenced

__all__ = [
    "Gather",
    "GroupedRows",
    "find_grouped_rows",
    "reads_a_group_index",
    "sink_gathers",
    "split_column_gathers",
    "per_row_derivatives_graph",
    "table_derivatives_graph",
    "table_curvature_graph",
    "index_graph",
]


class Gather(NamedTuple):
    """One table of parameters read by the rows through a row-aligned integer index.

    Attributes
    ----------
    table : TensorVariable
        ``T(v)``, a graph of the parameter vector alone, of shape ``(n_groups, *cell_shape)``.
    group_index : TensorVariable
        The groups of the rows, an integer vector, a graph of the row placeholders alone.
    cell : TensorVariable
        The placeholder that stands for ``table[index]`` in :attr:`GroupedRows.rows_logp`.
    n_groups : int
        The table's length.
    cell_size : int
        The number of parameters in one cell (``prod(cell_shape)``).
    """

    table: TensorVariable
    group_index: TensorVariable
    cell: TensorVariable
    n_groups: int
    cell_size: int


class GroupedRows(NamedTuple):
    """The rows' graph rewritten on the per-row vectors ``psi_i`` (module docstring).

    Attributes
    ----------
    vector : TensorVariable
        The parameter vector ``v`` (length ``d``).
    rows_logp : TensorVariable
        Per-row log-likelihoods as a graph of ``vector`` (read only at :attr:`direct`), the
        gathers' cells and the row placeholders.
    row_inputs : tuple of TensorVariable
        The row placeholders.
    gathers : tuple of Gather
    direct : ndarray
        The coordinates of ``vector`` the rewritten rows read directly, sorted (int64).
    """

    vector: TensorVariable
    rows_logp: TensorVariable
    row_inputs: tuple[TensorVariable, ...]
    gathers: tuple[Gather, ...]
    direct: np.ndarray

    @property
    def psi_size(self) -> int:
        """``m``: the length of a row's vector ``psi_i``."""
        return int(self.direct.size) + sum(gather.cell_size for gather in self.gathers)


def find_grouped_rows(
    rows_logp: TensorVariable,
    vector: TensorVariable,
    row_inputs: Sequence[TensorVariable],
    v0: np.ndarray,
    sink: bool = True,
) -> GroupedRows | None:
    """Find the gathers ``table[index]`` of the rows' graph and rewrite it on their cells.

    A gather is an advanced index on the first axis of a tensor computed from ``vector``
    alone (no row placeholder) by a one-dimensional integer tensor computed from the row
    placeholders alone: ``effect[group_index]``, ``b[county, :]``. Returns None where there
    is none.

    Parameters
    ----------
    rows_logp : TensorVariable
        Per-row log-likelihood, a graph of ``vector`` and ``row_inputs``.
    vector : TensorVariable
        The parameter vector, of static length.
    row_inputs : sequence of TensorVariable
        The row placeholders.
    v0 : ndarray
        A value of ``vector``, where the tables' shapes are read (one uncompiled evaluation).
    sink : bool, default True
        First move the parameters read beside a gather inside it (:func:`sink_gathers`).
    """
    rows_logp = split_column_gathers(rows_logp, vector, row_inputs)
    if sink:
        rows_logp = sink_gathers(rows_logp, vector, row_inputs)
    found: dict[Variable, tuple[TensorVariable, TensorVariable]] = {
        node.outputs[0]: (
            cast(TensorVariable, node.inputs[0]),
            cast(TensorVariable, node.inputs[1]),
        )
        for node, is_gather, _, _ in _walk(rows_logp, vector, set(row_inputs))
        if is_gather
    }
    if not found:
        return None
    shapes = pytensor.function(
        [vector],
        [table.shape for table, _ in found.values()],
        mode="FAST_COMPILE",
        on_unused_input="ignore",
    )(v0)
    gathers: list[Gather] = []
    replacements: dict[Variable, Variable] = {}
    for (output, (table, index)), shape in zip(found.items(), shapes, strict=True):
        cell_shape = tuple(int(dim) for dim in shape[1:])
        static_table = pt.specify_shape(table, tuple(int(dim) for dim in shape))
        cell = pt.tensor(dtype=table.dtype, shape=(None, *cell_shape), name=f"cell_{len(gathers)}")
        replacements[output] = cell
        gathers.append(
            Gather(
                table=cast(TensorVariable, static_table),
                group_index=index,
                cell=cell,
                n_groups=int(shape[0]),
                cell_size=int(np.prod(cell_shape, dtype=int)),
            )
        )
    rewritten = cast(
        TensorVariable, clone_replace(rows_logp, replace=replacements, rebuild_strict=False)
    )
    # Stabilised before it is differentiated (log(1 - sigmoid(x)) becomes -softplus(x)): the
    # derivatives of the raw graph are NaN where a logistic row saturates (|x| > 37), with
    # any construction of PyTensor's Hessian. "specialize" holds PyTensor 2's pattern for
    # log1p(-sigmoid(x)), which its canonical form (a product by -1) does not match.
    # PyTensor may look for a BLAS here (a sparse rewrite's constraint reads its flags): its
    # notice is about the C backend, not these functions (missing_blas_notice_silenced).
    with missing_blas_notice_silenced():
        rewritten = cast(
            TensorVariable,
            rewrite_graph(rewritten, include=("canonicalize", "stabilize", "specialize")),
        )
    direct = _directly_read_coordinates(rewritten, vector)
    return GroupedRows(vector, rewritten, tuple(row_inputs), tuple(gathers), direct)


def split_column_gathers(
    rows_logp: TensorVariable, vector: TensorVariable, row_inputs: Sequence[TensorVariable]
) -> TensorVariable:
    """Read ``T[g, j]`` as ``T[g][:, j]``: a gather of whole cells, then a column of them.

    A table of a group's several effects (varying intercepts and slopes as one ``(groups,
    2)`` tensor, as an ``MvNormal`` with an LKJ prior gives them) is read per row as
    ``ab[g, 0] + ab[g, 1] * x``: one advanced index of the group index and a fixed column.
    Row i still reads only its group's cell ``ab[g_i]``, so the same rows are a gather of
    whole cells followed by a basic index of the columns, which :func:`find_grouped_rows`
    finds; both columns then read one gather (one ``T[g]`` per table and index). The
    columns must be integer scalars that read neither ``vector`` nor the rows; the rows'
    values are unchanged.
    """
    rows: set[Variable] = set(row_inputs)
    gathered: dict[tuple[Variable, Variable], TensorVariable] = {}
    replacements: dict[Variable, Variable] = {}
    for node, _, of_rows, of_vector in _walk(rows_logp, vector, rows):
        parts = _column_gather(node)
        if parts is None:
            continue
        table, index, columns = parts
        fixed = all(c not in of_rows and c not in of_vector for c in columns)
        of_vector_alone = table in of_vector and table not in of_rows
        of_rows_alone = index in of_rows and index not in of_vector
        if not (fixed and of_vector_alone and of_rows_alone):
            continue
        cells = gathered.setdefault((table, index), cast(TensorVariable, table)[index])
        replacements[node.outputs[0]] = cells[(slice(None), *columns)]
    if not replacements:
        return rows_logp
    return cast(
        TensorVariable, clone_replace(rows_logp, replace=replacements, rebuild_strict=False)
    )


def _column_gather(node: Any) -> tuple[Variable, Variable, tuple[Variable, ...]] | None:
    """Return ``(T, g, (j, ...))`` where ``node`` is ``T[g, j, ...]``, else None.

    ``g`` is an integer vector and each ``j`` an integer scalar (no slice among them).
    """
    op = getattr(node, "op", None)
    if not isinstance(op, _GATHER_OPS) or len(node.inputs) < 3:
        return None
    idx_list = getattr(op, "idx_list", None)
    entries = (
        list(indices_from_subtensor(node.inputs[1:], idx_list))
        if idx_list is not None
        else list(node.inputs[1:])
    )
    variables = [entry for entry in entries if isinstance(entry, Variable)]
    if len(variables) != len(entries):
        return None  # a slice among the indices
    index, *columns = variables
    if not (_is_integer(index, 1) and columns and all(_is_integer(c, 0) for c in columns)):
        return None
    return node.inputs[0], index, tuple(columns)


def _is_integer(variable: Any, ndim: int) -> bool:
    """Whether ``variable`` is an integer tensor of ``ndim`` dimensions."""
    kind = str(getattr(variable, "dtype", ""))
    return getattr(variable, "ndim", None) == ndim and kind.startswith(("int", "uint"))


def sink_gathers(
    rows_logp: TensorVariable, vector: TensorVariable, row_inputs: Sequence[TensorVariable]
) -> TensorVariable:
    """Move parameters read beside a gather inside it: ``mu + tau * z[g]`` -> ``(mu + tau * z)[g]``.

    An elementwise operation of one gather ``T[g]`` and of tensors of ``vector`` alone that are
    constant along the rows (size 1 on their first axis: scalars such as a hierarchy's mean
    and scale) gives row i the same value as the operation on the table, read at ``g_i``. So a
    non-centred hierarchy written inline, ``mu + tau * z[g] + beta * x``, reads ``mu`` and
    ``tau`` only through its groups' parameters, as ``a = mu + tau * z; a[g]`` does: they are
    hyperparameters, not coefficients every row reads (``docs/architecture.md``, "Grouped
    rows"). A sum or product that also reads the rows is split: ``(mu + tau * z)[g] + beta *
    x``. Applied until no such operation is left, and only where every gather reads one group
    index (one grouping factor; with crossed factors the graph is returned as it is); the
    rows' values are unchanged.
    """
    rows: set[Variable] = set(row_inputs)
    if len(_gather_indices(rows_logp, vector, rows)) != 1:
        # Crossed factors: the rows read an intercept beside two gathers, and the ridge moves
        # along both (``step_methods/group_moves.py``) need it read directly; inside one
        # factor's table it would move along that factor's ridge only, and the chain stuck on
        # the other's (an intercept 11 sds off on a crossed benchmark model).
        return rows_logp
    for _ in range(_SINK_ROUNDS):
        replacement = _first_sinkable(rows_logp, vector, rows)
        if replacement is None:
            return rows_logp
        old, new = replacement
        rows_logp = cast(
            TensorVariable, clone_replace(rows_logp, replace={old: new}, rebuild_strict=False)
        )
    return rows_logp


def _gather_indices(
    rows_logp: TensorVariable, vector: TensorVariable, rows: set[Variable]
) -> set[Variable]:
    """Return the distinct group indices of the rows' gathers (one per grouping factor)."""
    return {node.inputs[1] for node, is_gather, _, _ in _walk(rows_logp, vector, rows) if is_gather}


def _walk(
    rows_logp: TensorVariable, vector: TensorVariable, rows: set[Variable]
) -> Iterator[tuple[Any, bool, set[Variable], set[Variable]]]:
    """Yield each node of the rows' graph in order, whether it is a gather, what reads rows.

    A gather indexes the first axis of a tensor of ``vector`` alone by an integer vector of
    the rows alone (``effect[group_index]``). With each node come the variables computed so
    far from the rows and those computed from ``vector`` (its outputs are added after it is
    yielded).
    """
    of_vector: set[Variable] = {vector}
    of_rows: set[Variable] = set(rows)
    for node in toposort([rows_logp]):
        inputs = node.inputs
        is_gather = bool(
            _is_first_axis_gather(node)
            and inputs[0] in of_vector
            and inputs[0] not in of_rows
            and inputs[1] in of_rows
            and inputs[1] not in of_vector
        )
        yield node, is_gather, of_rows, of_vector
        if is_gather or any(inp in of_rows for inp in inputs):
            of_rows.update(node.outputs)
        if not is_gather and any(inp in of_vector for inp in inputs):
            of_vector.update(node.outputs)


#: Most sinks :func:`sink_gathers` makes (each one operation of a row's expression).
_SINK_ROUNDS = 64


def _first_sinkable(
    rows_logp: TensorVariable, vector: TensorVariable, rows: set[Variable]
) -> tuple[Variable, Variable] | None:
    """Return the first operation :func:`sink_gathers` can move inside a gather, and its sink."""
    gathers: dict[Variable, tuple[Variable, Variable]] = {}
    for node, is_gather, of_rows, _ in _walk(rows_logp, vector, rows):
        if is_gather:
            gathers[node.outputs[0]] = (node.inputs[0], node.inputs[1])
        elif isinstance(node.op, Elemwise) and len(node.outputs) == 1:
            sunk = _sink(node, gathers, of_rows)
            if sunk is not None:
                return node.outputs[0], sunk
    return None


def _sink(
    node: Any, gathers: dict[Variable, tuple[Variable, Variable]], of_rows: set[Variable]
) -> Variable | None:
    """``node``'s output with its gather moved outside, or None where it cannot be."""
    read = [inp for inp in node.inputs if inp in gathers]
    if len(read) != 1:  # two tables may differ in length: leave them two gathers
        return None
    (gathered,) = read
    params = [
        inp
        for inp in node.inputs
        if inp is not gathered
        and inp not in of_rows
        and inp.type.broadcastable[:1] == (True,)
        and inp.ndim == gathered.ndim
    ]
    others = [
        inp for inp in node.inputs if inp is not gathered and not any(inp is p for p in params)
    ]
    if not params:
        return None
    if others and not (isinstance(node.op.scalar_op, (ps.Add, ps.Mul)) and len(node.inputs) > 2):
        return None
    table, index = gathers[gathered]
    # The table's cells keep their shape; the parameters broadcast over its groups.
    inner = [table if inp is gathered else inp for inp in node.inputs if inp not in others]
    sunk = cast(TensorVariable, node.op(*inner))[index]
    if not others:
        return sunk
    return cast(Variable, node.op(sunk, *others))


#: PyTensor 2 (PyMC 5) also has ``AdvancedSubtensor1``, the one-index gather; PyTensor 3 folds
#: it into ``AdvancedSubtensor``.
_GATHER_OPS: tuple[type, ...] = tuple(
    op for op in (AdvancedSubtensor, getattr(subtensor, "AdvancedSubtensor1", None)) if op
)


def reads_a_group_index(outputs: Sequence[Variable], values: Sequence[Variable]) -> bool:
    """Whether ``outputs`` gather a tensor of ``values`` by an index that reads none of them.

    The graph-only first look of :func:`find_grouped_rows` (no row placeholders, nothing
    evaluated): ``effect[group_index]`` in a model's observed log-densities.
    """
    of_values: set[Variable] = set(values)
    for node in toposort(outputs):
        inputs = node.inputs
        if _is_first_axis_gather(node) and inputs[0] in of_values and inputs[1] not in of_values:
            return True
        column = _column_gather(node)
        if (
            column is not None
            and column[0] in of_values
            and not any(part in of_values for part in (column[1], *column[2]))
        ):
            return True  # T[g, j], split_column_gathers's form
        if any(inp in of_values for inp in inputs):
            of_values.update(node.outputs)
    return False


def _is_first_axis_gather(node: object) -> bool:
    op = getattr(node, "op", None)
    inputs: Sequence[Any] = getattr(node, "inputs", ())
    if not isinstance(op, _GATHER_OPS) or len(inputs) != 2:
        return False
    if getattr(op, "idx_list", (0,)) not in ((0,), None):
        return False
    return _is_integer(inputs[1], 1) and inputs[0].ndim >= 1


def _directly_read_coordinates(rows_logp: TensorVariable, vector: TensorVariable) -> np.ndarray:
    """Coordinates of ``vector`` that ``rows_logp`` reads (all, unless only by constant slices)."""
    length = _length(vector)
    if vector not in set(ancestors([rows_logp])):
        return np.zeros(0, dtype="int64")
    read = np.zeros(length, dtype=bool)
    for node in toposort([rows_logp]):
        if vector not in node.inputs:
            continue
        span = _constant_span(node, vector, length)
        if span is None:
            return np.arange(length, dtype="int64")
        read[span[0] : span[1]] = True
    return np.flatnonzero(read).astype("int64")


def _constant_span(node: object, vector: TensorVariable, length: int) -> tuple[int, int] | None:
    """``(start, stop)`` where ``node`` is a constant unit-step slice of ``vector``, else None."""
    op = getattr(node, "op", None)
    inputs: Sequence[Any] = getattr(node, "inputs", ())
    if not isinstance(op, Subtensor) or inputs[0] is not vector:
        return None
    (index,) = indices_from_subtensor(inputs[1:], op.idx_list)
    if not isinstance(index, slice):
        return None
    bounds = []
    for bound, default in ((index.start, 0), (index.stop, length), (index.step, 1)):
        if bound is None:
            bounds.append(default)
        elif isinstance(bound, Constant):
            bounds.append(int(bound.data))
        else:
            return None
    start, stop, step = bounds
    if step != 1:
        return None
    return slice(start, stop).indices(length)[:2]


def index_graph(grouped: GroupedRows) -> tuple[list[Variable], list[Variable]]:
    """Build the rows' group indices, one int64 vector per gather, from the row placeholders."""
    indices: list[Variable] = [pt.cast(gather.group_index, "int64") for gather in grouped.gathers]
    return list(grouped.row_inputs), indices


def per_row_derivatives_graph(grouped: GroupedRows) -> tuple[list[Variable], list[Variable]]:
    """Build the derivatives of a batch of rows in their vectors ``psi_i`` (n rows, m entries).

    Inputs are ``v``, each gather's cells ``T_k(v)[g_ik]`` (n, *cell_shape) and the rows.
    Outputs:

    - ``F_i`` (n,);
    - ``dF_i/dpsi`` (n, m): along a direct coordinate ``v_j``, a directional derivative of
      the vector of per-row values (forward mode, as in ``gradients.per_row_proxy_terms``);
      along the row's own cells, the gradient of the rows' sum with respect to the cells,
      which reach no other row;
    - ``d2F_i/dpsi dcell`` (n, m, c), ``c`` the cells' entries: gradients with respect to the
      cells of the rows' summed first derivatives (reverse over reverse);
    - ``sum_i d2F_i/dv_D2`` (|D|, |D|): the direct block, needed only summed over the rows.

    Every second derivative is taken in reverse over reverse, as the dense Hessian
    (``gradients.summed_gradient_and_hessian``) is: forward over reverse gave NaN where a
    logistic row saturates (PyTensor's stabilised ``softplus`` is lost in the pushforward).
    No operation is vectorised over rows (PyTensor's ``Blockwise`` loops ran at 20 us per row
    here against 0.4 us) and no gradient is scattered into a table.
    """
    vector = grouped.vector
    cells = [gather.cell for gather in grouped.gathers]
    units = np.eye(_length(vector))
    rows_logp = grouped.rows_logp
    total = rows_logp.sum()
    direct_first = [
        cast(TensorVariable, _pushforward(rows_logp, vector, pt.constant(units[j])))
        for j in grouped.direct
    ]
    cell_first = _cell_columns(_gradients(total, cells), grouped)
    summed_direct = cast(
        TensorVariable, pytensor.grad(total, vector, disconnected_inputs="ignore")
    )[grouped.direct]
    cross_rows = [
        pt.stack(_cell_columns(_gradients(summed_direct[k], cells), grouped), axis=1)
        for k in range(int(grouped.direct.size))
    ]
    cross_rows.extend(
        pt.stack(_cell_columns(_gradients(column.sum(), cells), grouped), axis=1)
        for column in cell_first
    )
    # One reverse pass per direct coordinate: PyTensor's vectorised Jacobian batched every
    # row's operation (Blockwise) and took 22 s of a cold first build to compile on a
    # 1,000-group logistic hierarchy.
    direct_hessian = (
        pt.stack(
            [
                cast(
                    TensorVariable,
                    pytensor.grad(summed_direct[k], vector, disconnected_inputs="ignore"),
                )[grouped.direct]
                for k in range(int(grouped.direct.size))
            ]
        )
        if grouped.direct.size
        else pt.zeros((0, 0))
    )
    outputs: list[Variable] = [
        rows_logp,
        pt.stack([*direct_first, *cell_first], axis=1),
        pt.stack(cross_rows, axis=1),
        direct_hessian,
    ]
    return [vector, *cells, *grouped.row_inputs], outputs


def _gradients(cost: TensorVariable, cells: list[TensorVariable]) -> list[Variable]:
    """``pytensor.grad`` of ``cost`` with respect to each cell (zero where it reads none)."""
    return cast(list[Variable], pytensor.grad(cost, cells, disconnected_inputs="ignore"))


def _length(vector: TensorVariable) -> int:
    """Return the static length of a parameter vector."""
    return int(cast(Any, vector.type).shape[0])


def _cell_columns(gradients: Sequence[Variable], grouped: GroupedRows) -> list[TensorVariable]:
    """Per-row gradients with respect to each gather's cells, one (n,) column per entry."""
    columns: list[TensorVariable] = []
    for gradient, gather in zip(gradients, grouped.gathers, strict=True):
        flat = cast(TensorVariable, gradient).reshape((gather.cell.shape[0], gather.cell_size))
        columns.extend(flat[:, slot] for slot in range(gather.cell_size))
    return columns


def table_derivatives_graph(grouped: GroupedRows) -> tuple[list[Variable], list[Variable]]:
    """Build each table's values (``n_groups * cell_size``) and Jacobian in ``v``, data-free."""
    vector = grouped.vector
    outputs: list[Variable] = []
    for gather in grouped.gathers:
        values = pt.cast(gather.table, "float64").ravel()
        outputs.append(values)
        outputs.append(jacobian(values, vector, vectorize=True, disconnected_inputs="ignore"))
    return [vector], outputs


def table_curvature_graph(grouped: GroupedRows) -> tuple[list[Variable], list[Variable]]:
    """Build the Hessian in ``v`` of ``sum_k w_k . T_k(v)``, given the weights ``w_k``, data-free.

    With ``w_k`` the rows' summed ``dF_i/dcell`` per table entry this is the second term of
    the chain rule, ``sum_i (dF_i/dpsi_i) d2 psi_i / dv2``.
    """
    vector = grouped.vector
    weights = [
        pt.vector(f"w_{k}", dtype="float64", shape=(gather.n_groups * gather.cell_size,))
        for k, gather in enumerate(grouped.gathers)
    ]
    terms = [
        (pt.cast(gather.table, "float64").ravel() * weight).sum()
        for gather, weight in zip(grouped.gathers, weights, strict=True)
    ]
    total = sum(terms[1:], terms[0])
    gradient = pytensor.grad(total, vector, disconnected_inputs="ignore")
    hessian = jacobian(gradient, vector, vectorize=True, disconnected_inputs="ignore")
    return [vector, *weights], [hessian]

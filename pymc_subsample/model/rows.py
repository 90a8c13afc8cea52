"""Find the row axis of a model and rebuild its likelihood as per-row terms for chosen rows.

The graph surgery (docs/architecture.md, "Model adapter"): for each observed variable
on the row axis, unwrap the ``total_size`` wrapper, rebuild the random variable on the model's
value variables, resize its batch dimension to the number of selected rows with
``change_dist_size``, replace every row-aligned data input ``D`` by a placeholder for ``D[idx]``
and take ``logp(rv, value[idx])``. The result costs O(len(idx)) to evaluate, whatever N is.
An observed variable with missing values (PyMC's imputation) is put back on its original rows
first (``model/imputation.py``): its observed rows are subsampled where their covariates are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pytensor.tensor as pt
from pymc.data import MinibatchIndexRV, MinibatchOp
from pymc.distributions.shape_utils import change_dist_size
from pymc.logprob.basic import logp
from pymc.model import Model
from pymc.variational.minibatch_rv import MinibatchRandomVariable, get_scaling
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.type import TensorType
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.checks import check_one_term_per_row, check_support_is_fixed
from pymc_subsample.model.imputation import (
    Imputation,
    find_imputations,
    full_rv,
    observed_terms_on_rows,
    restrict_to_missing_rows,
)
from pymc_subsample.warnings import missing_blas_notice_silenced, warn_user

__all__ = [
    "RowGraph",
    "RowLayout",
    "find_row_layout",
    "gather_missing_rows",
    "row_loglik_graph",
]

#: Observed variables off the row axis with more elements than this are costly to evaluate in
#: full at every step; the user is warned.
LARGE_FULL_TERM = 10_000


@dataclass(frozen=True)
class RowLayout:
    """Which observed variables share the row axis, and how long it is.

    Attributes
    ----------
    n_rows : int
        Number of rows N.
    row_rvs : tuple of TensorVariable
        Observed variables whose leading axis is the row axis: subsampled.
    full_rvs : tuple of TensorVariable
        Observed variables off the row axis: evaluated in full with the prior at every step.
    obs_dim : str or None
        The named dimension of the rows, when known.
    imputations : tuple of Imputation
        The observed variables with missing values (``y_observed``), on their original rows.

    """

    n_rows: int
    row_rvs: tuple[Variable, ...]
    full_rvs: tuple[Variable, ...]
    obs_dim: str | None
    imputations: tuple[Imputation, ...] = ()

    def imputation(self, rv: Variable) -> Imputation | None:
        """Return the imputation of the observed variable ``rv`` (``y_observed``), or None."""
        return next((i for i in self.imputations if i.observed is rv), None)


def _observed_shape(model: Model, rv: Variable) -> tuple[int, ...]:
    value = model.rvs_to_values[rv]
    if any(
        v.owner is not None and isinstance(v.owner.op, MinibatchIndexRV | MinibatchOp)
        for v in ancestors([value])
    ):
        raise ValueError(
            f"Observed variable {rv.name!r} uses pm.Minibatch data. pymc_subsample draws its own "
            "rows: pass the full data arrays (numpy arrays or pm.Data) instead of pm.Minibatch."
        )
    # Data (a constant, or pm.Data's shared variable) has its shape at hand; evaluating the
    # shape graph instead compiles a function (1.3 s at set-up on a 1e6-row logistic model).
    if isinstance(value, Constant):
        return tuple(int(n) for n in np.shape(value.data))
    if isinstance(value, SharedVariable):
        return tuple(int(n) for n in np.shape(value.get_value(borrow=True)))
    return tuple(int(n) for n in value.shape.eval())


def find_row_layout(model: Model, obs_dim: str | None = None) -> RowLayout:
    """Split the model's observed variables into those on the row axis and the rest.

    Parameters
    ----------
    model : pymc.Model
        The user's model.
    obs_dim : str, optional
        Name of the row dimension (a key of ``model.coords``). Without it the rows are the
        leading axis of the observed variables with the longest leading axis.

    Returns
    -------
    RowLayout

    Raises
    ------
    ValueError
        When the model has no observed variable, or none lies on ``obs_dim``.

    """
    observed = list(model.observed_RVs)
    imputations = find_imputations(model)
    if not observed:
        raise ValueError(
            "The model has no observed variables, so there are no rows to subsample. "
            "A likelihood written as pm.Potential cannot be split into rows: write it as an "
            "observed distribution (pm.CustomDist(..., observed=data) if need be)."
        )
    # An imputed variable lies on its original rows (y's, not y_observed's), with y's dims.
    shapes = {
        rv: imputations[rv].shape if rv in imputations else _observed_shape(model, rv)
        for rv in observed
    }
    dims = {
        rv: imputations[rv].dims if rv in imputations else model.named_vars_to_dims.get(rv.name)
        for rv in observed
    }
    if obs_dim is not None:
        if obs_dim not in model.coords:
            raise ValueError(
                f"obs_dim={obs_dim!r} is not a dimension of the model; its dims are "
                f"{sorted(model.coords)}. Pass the name given in `coords` for the rows."
            )
        n_rows = len(model.coords[obs_dim])
        row_rvs = [rv for rv in observed if (dims[rv] or (None,))[0] == obs_dim]
        if not row_rvs:
            raise ValueError(
                f"No observed variable has obs_dim={obs_dim!r} as its first dimension. Declare "
                f"it with dims=({obs_dim!r}, ...) on the observed variables."
            )
    else:
        lengths = [shape[0] for shape in shapes.values() if len(shape) > 0]
        if not lengths:
            raise ValueError(
                "Every observed variable is a scalar, so there are no rows to subsample."
            )
        n_rows = max(lengths)
        row_rvs = [rv for rv in observed if len(shapes[rv]) > 0 and shapes[rv][0] == n_rows]
    full_rvs = [rv for rv in observed if rv not in row_rvs]
    _warn_large_full_terms(full_rvs, shapes)
    used = tuple(imputations[rv] for rv in observed if rv in imputations)
    return RowLayout(n_rows, tuple(row_rvs), tuple(full_rvs), obs_dim, used)


def _warn_large_full_terms(full_rvs: Sequence[Variable], shapes: dict) -> None:
    large = [rv.name for rv in full_rvs if int(np.prod(shapes[rv])) > LARGE_FULL_TERM]
    if large:
        warn_user(
            f"Observed variables {large} are not on the row axis and are evaluated in full at "
            "every step, which costs as much as their size. If they share the rows, give them "
            "the same leading dimension and pass obs_dim=<that dimension's name>.",
        )


def _unwrap_total_size(rv: Variable) -> Variable:
    if rv.owner is not None and isinstance(rv.owner.op, MinibatchRandomVariable):
        return rv.owner.inputs[0]
    return rv


def _rebuild_on_values(model: Model, rv: Variable) -> TensorVariable:
    """Clone ``rv``'s node with every random variable among its inputs replaced by its value."""
    node = rv.owner
    new_inputs = [_folded(i) for i in model.replace_rvs_by_values(node.inputs)]
    new_node = node.clone_with_new_inputs(new_inputs, strict=False)
    return cast(TensorVariable, new_node.outputs[node.outputs.index(rv)])


def _folded(graph: Variable) -> Variable:
    """Fold ``graph`` to a constant when it is computed from constants only.

    PyMC's model log-density folds such inputs before it reads the distributions'
    log-probabilities (``construct_ir_fgraph``), and some of them branch on whether an input
    is a constant: ``pm.Truncated`` and ``pm.Censored`` drop an infinite bound's terms only
    when the bound is a constant. Calling ``logp`` on the rebuilt variable skips that step, so
    without folding the row terms kept ``lower=0, upper=ExpandDims(inf)`` as two finite
    bounds: the same values, but the log-normaliser's gradient in the scale was NaN.
    """
    if graph.owner is None:
        return graph
    roots = (v for v in ancestors([graph]) if v.owner is None)
    if not all(isinstance(root, Constant) for root in roots):
        return graph
    with missing_blas_notice_silenced():
        folded = rewrite_graph(graph, include=("canonicalize",))
    return folded if isinstance(folded, Constant) else graph


def _row_aligned_data(graph: Variable, model: Model, layout: RowLayout) -> list[TensorVariable]:
    """List the data roots of ``graph`` (constants, shared tensors) on the row axis."""
    data_dims = {model[name]: dims for name, dims in model.named_vars_to_dims.items()}
    found = []
    for var in ancestors([graph]):
        if var.owner is not None or not isinstance(var.type, TensorType) or var.type.ndim == 0:
            continue
        if isinstance(var, Constant):
            length = var.data.shape[0]
        elif isinstance(var, SharedVariable):
            length = var.get_value(borrow=True).shape[0]
        else:
            continue
        dims = data_dims.get(var)
        if layout.obs_dim is not None and dims is not None:
            aligned = dims[0] == layout.obs_dim
        else:
            aligned = length == layout.n_rows
        if aligned:
            found.append(cast(TensorVariable, var))
    return found


def gather_missing_rows(model: Model, graph: TensorVariable, layout: RowLayout) -> TensorVariable:
    """Rewrite the prior part ``graph`` so missing values' density reads only their rows.

    See :func:`pymc_subsample.model.imputation.restrict_to_missing_rows`; ``graph`` unchanged
    for a model without missing values.
    """
    if not layout.imputations:
        return graph
    return restrict_to_missing_rows(
        model, graph, layout.imputations, lambda part: _row_aligned_data(part, model, layout)
    )


def _sum_trailing(per_element: TensorVariable) -> TensorVariable:
    if per_element.ndim > 1:
        return per_element.sum(axis=tuple(range(1, per_element.ndim)))
    return per_element


@dataclass(frozen=True)
class RowGraph:
    """Per-row log-likelihood graphs.

    Attributes
    ----------
    rows_logp : TensorVariable
        Vector with one entry per selected row: the sum over observed row variables of each
        row's log-likelihood. A graph of the model's value variables and ``row_inputs``.
    row_inputs : tuple of TensorVariable
        Placeholders standing for ``data[idx]``, one per row-aligned data array.
    row_data : tuple of Variable
        The row-aligned data arrays (constants or shared variables), in the order of
        ``row_inputs``; the caller gathers their rows (``np.take(data, idx, axis=0)``).
    full_logp : TensorVariable
        Vector of length N: the same for all rows, without any indexing (the self-check's
        reference).

    """

    rows_logp: TensorVariable
    row_inputs: tuple[TensorVariable, ...]
    row_data: tuple[TensorVariable, ...]
    full_logp: TensorVariable


def row_loglik_graph(model: Model, layout: RowLayout) -> RowGraph:
    """Build the per-row log-likelihood on row subsets of the data, and on all rows.

    The row subsets enter the graph as inputs rather than as ``data[idx]`` inside it, so that
    the compiled function never sees an array of length N and the gather runs in NumPy's fast
    ``take``. An observed value may itself be an expression of row-aligned data (an integer
    ``pm.Data`` is stored as int32 and cast back; ``observed=pt.log(z)``): its data roots are
    replaced the same way. PyMC's ``total_size`` scaling is kept: each row's term is multiplied
    by ``total_size / N``, as in the model's own log-density.

    Raises
    ------
    ValueError
        If an observed variable's log-likelihood is one summed value, or its support depends
        on the parameters (see :mod:`pymc_subsample.model.checks`).
    """
    placeholders: dict[TensorVariable, TensorVariable] = {}

    def placeholder(data: TensorVariable) -> TensorVariable:
        if data not in placeholders:
            subset_type = data.type.clone(shape=(None, *data.type.shape[1:]))
            placeholders[data] = subset_type(name=f"{data.name or 'data'}_rows")
        return placeholders[data]

    def rows_of(graph: TensorVariable) -> TensorVariable:
        replacements: dict[Variable, Variable] = {
            d: placeholder(d) for d in _row_aligned_data(graph, model, layout)
        }
        return cast(
            TensorVariable, clone_replace(graph, replace=replacements, rebuild_strict=False)
        )

    rows_terms, full_terms = [], []
    for observed_rv in layout.row_rvs:
        name = str(observed_rv.name)
        imputation = layout.imputation(observed_rv)
        if imputation is not None:
            row_term, full_term = _imputed_terms(model, imputation, placeholder, rows_of)
            check_support_is_fixed(row_term, placeholders.values(), model.values_to_rvs, [name])
            rows_terms.append(row_term)
            full_terms.append(full_term)
            continue
        value = model.rvs_to_values[observed_rv]
        rv = _rebuild_on_values(model, _unwrap_total_size(observed_rv))
        scale = _total_size_scale(observed_rv, value)
        full_term = _sum_trailing(logp(rv, value))
        check_one_term_per_row(full_term, name)
        full_terms.append(full_term * scale)

        value_rows = placeholder(value) if value.owner is None else rows_of(value)
        ndim_supp = getattr(rv.owner.op, "ndim_supp", 0)
        batch_shape = _observed_shape(model, observed_rv)[: value.ndim - ndim_supp]
        resized = change_dist_size(rv, new_size=(value_rows.shape[0], *batch_shape[1:]))
        row_term = _sum_trailing(logp(rows_of(resized), value_rows))
        check_support_is_fixed(row_term, placeholders.values(), model.values_to_rvs, [name])
        rows_terms.append(row_term * scale)
    return RowGraph(
        rows_logp=_total(rows_terms),
        row_inputs=tuple(placeholders.values()),
        row_data=tuple(placeholders),
        full_logp=_total(full_terms),
    )


def _imputed_terms(
    model: Model,
    imputation: Imputation,
    placeholder: Callable[[TensorVariable], TensorVariable],
    rows_of: Callable[[TensorVariable], TensorVariable],
) -> tuple[TensorVariable, TensorVariable]:
    """Row terms of an observed variable with missing values, on its original rows.

    A row's term is the original distribution's log-density at its observed value, and 0 where
    the value is missing (its density belongs to the imputed variable, in the prior part). The
    values and the mask are two row-aligned constants; the full-rows reference is PyMC's own
    ``y_observed`` terms put on the rows, so the self-check compares the two.
    """
    rv = full_rv(model, imputation)
    values = pt.constant(imputation.values, name=f"{imputation.name}_values")
    observed = pt.constant(imputation.observed_mask, name=f"{imputation.name}_observed_mask")
    values_rows, observed_rows = placeholder(values), placeholder(observed)
    batch_shape = imputation.observed_mask.shape
    resized = change_dist_size(rv, new_size=(values_rows.shape[0], *batch_shape[1:]))
    terms = logp(rows_of(resized), values_rows)
    row_term = _sum_trailing(cast(TensorVariable, pt.switch(observed_rows, terms, 0.0)))
    check_one_term_per_row(row_term, imputation.name)
    return row_term, _sum_trailing(observed_terms_on_rows(model, imputation))


def _total_size_scale(observed_rv: Variable, value: TensorVariable) -> TensorVariable:
    """PyMC's ``total_size / N`` factor of an observed variable (1 without ``total_size``)."""
    if observed_rv.owner is not None and isinstance(observed_rv.owner.op, MinibatchRandomVariable):
        _, *total_size = observed_rv.owner.inputs
        return cast(TensorVariable, get_scaling(total_size, value.shape))
    return cast(TensorVariable, pt.constant(1.0))


def _total(terms: list[TensorVariable]) -> TensorVariable:
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total

"""Observed variables with missing values, as PyMC imputes them, put back on their rows.

PyMC splits ``pm.Normal("y", mu, sigma, observed=y)`` with NaNs in ``y`` into an observed
variable ``y_observed`` (the entries with values, flattened) and a free variable
``y_unobserved`` (one entry per missing value), joined by the deterministic ``y``. Both are the
original variable indexed by a constant mask: PyMC lifts ``rv[mask]`` into the distribution's
parameters, so ``y_observed``'s mean is ``(X @ beta)[~mask]`` and its rows no longer line up
with the rows of ``X``.

The steps subsample the observed rows on the original row axis (docs/architecture.md,
"Missing values"): each row's term is the original distribution's log-density at the observed
value where the row is observed, and 0 where it is missing, so the sum over the N rows is
``y_observed``'s log-likelihood and a row of ``X`` is read where its value is. The missing
values' own density, ``y_unobserved ~ Normal(mu[mask], sigma)``, is a term of the prior part
(it depends on the step's parameters but is not a likelihood of the observed rows), evaluated
in full at every step on the missing rows only (:func:`restrict_to_missing_rows`). ``y_unobserved``
itself is left to PyMC's own step (:func:`imputed_value_vars`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.logprob.basic import logp
from pymc.model import Model
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor import subtensor
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.warnings import warn_user

__all__ = [
    "Imputation",
    "find_imputations",
    "restrict_to_missing_rows",
    "imputed_value_vars",
]

_OBSERVED, _UNOBSERVED = "_observed", "_unobserved"

#: Advanced indexing ops (PyTensor 3 has no ``AdvancedSubtensor1``).
_ADVANCED: tuple[type, ...] = tuple(
    getattr(subtensor, name)
    for name in ("AdvancedSubtensor", "AdvancedSubtensor1")
    if hasattr(subtensor, name)
)


@dataclass(frozen=True, eq=False)
class Imputation:
    """An observed variable whose data have missing values, on its original rows.

    Attributes
    ----------
    name : str
        The user's name of the variable (``"y"``); PyMC's deterministic of that name joins the
        two parts.
    observed : TensorVariable
        ``y_observed``: the observed entries, flattened.
    unobserved : TensorVariable
        ``y_unobserved``: the free variable of the missing entries.
    observed_mask : ndarray of bool
        True where a value is observed, over the variable's batch shape (rows first).
    values : ndarray
        The observed values on the original shape, with the first observed value where a value
        is missing (a point of the support, so that the masked-out terms and their derivatives
        are finite): one array the size of ``y``, built once.
    dims : tuple of str or None
        The dims the user gave the variable.

    """

    name: str
    observed: TensorVariable
    unobserved: TensorVariable
    observed_mask: np.ndarray
    values: np.ndarray
    dims: tuple[str, ...] | None

    @property
    def shape(self) -> tuple[int, ...]:
        """The variable's original shape, rows first."""
        return tuple(int(n) for n in self.values.shape)

    @property
    def missing_positions(self) -> tuple[np.ndarray, ...]:
        """``np.nonzero`` of the missing entries over the batch shape."""
        return cast(tuple[np.ndarray, ...], np.nonzero(~self.observed_mask))


def imputed_value_vars(model: Model) -> list[TensorVariable]:
    """Return the value variables of the imputed missing values (``y_unobserved``).

    A subsampling step leaves them out of its default ``vars``: their density given the
    parameters is not a likelihood of the observed rows, and ``pm.sample`` assigns them its own
    step (NUTS for continuous ones, Metropolis for discrete ones) in a compound step.
    """
    free = {str(rv.name): rv for rv in model.free_RVs}
    return [
        model.rvs_to_values[free[f"{str(rv.name)[: -len(_OBSERVED)]}{_UNOBSERVED}"]]
        for rv in model.observed_RVs
        if _is_imputed(model, rv, free)
    ]


def find_imputations(model: Model) -> dict[Variable, Imputation]:
    """Find the model's observed variables with missing values, keyed by ``y_observed``.

    Raises
    ------
    ValueError
        For missing values PyMC cannot split by a mask over the batch dimensions (a multivariate
        variable with some, not all, entries of a row missing), which have no row terms.

    """
    free = {str(rv.name): rv for rv in model.free_RVs}
    found: dict[Variable, Imputation] = {}
    for observed in model.observed_RVs:
        if not _is_imputed(model, observed, free):
            continue
        name = str(observed.name)[: -len(_OBSERVED)]
        unobserved = free[f"{name}{_UNOBSERVED}"]
        node = observed.owner
        mask = _observed_mask(model[name], observed)
        if node is None or not isinstance(node.op, RandomVariable) or mask is None:
            raise ValueError(
                f"The observed data of {name!r} have missing values inside some rows of a "
                "multivariate distribution, which PyMC imputes as one joint variable: its rows "
                "have no separate terms to subsample. Drop (or impute) those rows before "
                "building the model (keep = ~np.isnan(y).any(axis=1)), mark a whole row missing "
                "(every entry NaN), or sample the model with pm.sample() (NUTS)."
            )
        observed_values = np.asarray(cast(Constant, model.rvs_to_values[observed]).data)
        support = observed_values.shape[1:]
        values = np.empty(mask.shape + support, dtype=observed_values.dtype)
        values[...] = observed_values[0]
        values[mask] = observed_values
        values.setflags(write=False)
        dims = model.named_vars_to_dims.get(name)
        found[observed] = Imputation(
            name,
            cast(TensorVariable, observed),
            cast(TensorVariable, unobserved),
            mask,
            values,
            tuple(dims) if dims else None,
        )
    return found


def _is_imputed(model: Model, observed: Variable, free: dict[str, Variable]) -> bool:
    name = str(observed.name)
    if not name.endswith(_OBSERVED):
        return False
    base = name[: -len(_OBSERVED)]
    return f"{base}{_UNOBSERVED}" in free and base in model.named_vars


def _observed_mask(joined: Variable, observed: Variable) -> np.ndarray | None:
    """Return the constant mask ``m`` of PyMC's ``joined[m] = y_observed``, or None."""
    for variable in ancestors([joined]):
        node = variable.owner
        if node is None or node.inputs[1:2] != [observed] or len(node.inputs) != 3:
            continue
        index = node.inputs[2]
        if isinstance(index, Constant) and np.asarray(index.data).dtype == bool:
            return np.asarray(index.data)
    return None


def full_rv(model: Model, imputation: Imputation) -> TensorVariable:
    """Rebuild ``y_observed``'s distribution on the original shape, before PyMC's mask.

    PyMC's lift indexes each parameter that varies over the batch shape by the mask
    (``mu[~mask]``, or ``mu[0, cols]`` where ``mu`` broadcasts along the rows); its input is the
    original parameter. Parameters that broadcast over the batch shape are left as they are.
    The self-check compares the result with PyMC's own ``y_observed`` terms.
    """
    node = imputation.observed.owner
    rng, _, *params = node.inputs
    size = pt.as_tensor(np.asarray(imputation.observed_mask.shape, dtype="int64"))
    batch_ndim = imputation.observed_mask.ndim
    unmasked = [_unmasked(param, batch_ndim, imputation.name) for param in params]
    inputs = model.replace_rvs_by_values([rng, size, *unmasked])
    rebuilt = node.op.make_node(*inputs)
    return cast(TensorVariable, rebuilt.outputs[node.outputs.index(imputation.observed)])


def _unmasked(param: Variable, batch_ndim: int, name: str) -> Variable:
    node = param.owner
    if node is not None and isinstance(node.op, _ADVANCED) and _constant_only(node.inputs[1:]):
        return node.inputs[0]
    if all(cast(TensorVariable, param).type.broadcastable[:batch_ndim]):
        return param
    raise ValueError(
        f"The parameters of {name!r}, which has missing values, could not be put back on the "
        "rows of the data (PyMC's imputation indexes them in a form pymc_subsample does not "
        "know). Drop the rows with missing values before building the model "
        "(keep = ~np.isnan(y); X, y = X[keep], y[keep]), or sample it with pm.sample() (NUTS)."
    )


def _constant_only(graphs: list[Variable]) -> bool:
    roots = [v for v in ancestors(graphs) if v.owner is None]
    return all(isinstance(root, Constant) for root in roots)


def observed_terms_on_rows(model: Model, imputation: Imputation) -> TensorVariable:
    """PyMC's own ``y_observed`` log-density terms placed on the original shape (0 if missing).

    The self-check's reference for the rebuilt row terms.
    """
    observed = imputation.observed
    node = observed.owner
    inputs = model.replace_rvs_by_values(node.inputs)
    on_values = node.clone_with_new_inputs(inputs, strict=False).outputs[
        node.outputs.index(observed)
    ]
    terms = logp(on_values, model.rvs_to_values[observed])
    zeros = pt.zeros(imputation.observed_mask.shape, dtype=terms.dtype)
    return cast(TensorVariable, pt.set_subtensor(zeros[imputation.observed_mask], terms))


def restrict_to_missing_rows(
    model: Model,
    graph: TensorVariable,
    imputations: Sequence[Imputation],
    row_data: Callable[[Variable], list[TensorVariable]],
) -> TensorVariable:
    """Rewrite ``graph`` so the imputed values' density reads only the missing rows.

    PyMC's ``y_unobserved`` has the parameter ``(X @ beta)[mask]``: a product over all N rows
    at every evaluation, then the few missing ones kept (29 ms per prior call at N = 1e6). Each
    such indexing of row-aligned data ``D`` by a constant mask becomes the same expression on
    ``D[rows]``, the missing rows (a constant index, folded once for constant data). The
    rewrite is checked against the original at one point; where they differ the original is
    kept, and the user is told its cost.

    Parameters
    ----------
    model : pymc.Model
        The user's model (its initial point is where the rewrite is checked).
    graph : TensorVariable
        The prior part's log-density, a graph of the model's value variables.
    imputations : sequence of Imputation
        From :func:`find_imputations`.
    row_data : callable
        ``row_data(graph)`` lists the row-aligned data roots of ``graph``.

    Returns
    -------
    TensorVariable
        ``graph``, rewritten where that gives the same value at a jittered initial point.

    """
    missing_rows = [imputation.missing_positions[0] for imputation in imputations]
    replacements: dict[Variable, Variable] = {}
    for variable in ancestors([graph]):
        node = variable.owner
        if (
            node is None
            or not isinstance(node.op, _ADVANCED)
            or not _constant_only(node.inputs[1:])
        ):
            continue
        rows = _first_axis_rows(node.inputs[1:])
        if rows is None or not any(np.array_equal(rows[0], m) for m in missing_rows):
            continue
        data = row_data(node.inputs[0])
        if not data:
            continue
        index = pt.as_tensor(rows[0])
        on_rows: dict[Variable, Variable] = {d: d[index] for d in data}
        gathered = cast(
            TensorVariable, clone_replace(node.inputs[0], replace=on_rows, rebuild_strict=False)
        )
        if len(rows) > 1:
            gathered = gathered[(pt.arange(rows[0].size), *rows[1:])]
        replacements[variable] = gathered
    if not replacements:
        return graph
    rewritten = cast(
        TensorVariable, clone_replace(graph, replace=replacements, rebuild_strict=False)
    )
    if not _same_at_a_point(model, graph, rewritten):
        names = [imputation.name for imputation in imputations]
        warn_user(
            f"The density of the missing values of {names} could not be restricted to the "
            "missing rows, so every step evaluates it on all N rows (O(N) per draw). Drop the "
            "rows with missing values before building the model to avoid that cost."
        )
        return graph
    return rewritten


def _first_axis_rows(indices: list[Variable]) -> tuple[np.ndarray, ...] | None:
    """Return the integer positions an advanced index picks, axis by axis, or None.

    None unless the first is a vector of rows (an index along axis 0).
    """
    values = [
        np.asarray(index.data if isinstance(index, Constant) else index.eval()) for index in indices
    ]
    positions: list[np.ndarray] = []
    for value in values:
        if value.dtype == bool:
            positions.extend(np.nonzero(value))
        else:
            positions.append(value)
    if not positions or positions[0].ndim != 1 or positions[0].dtype.kind not in "iu":
        return None
    return tuple(positions)


def _same_at_a_point(model: Model, original: TensorVariable, rewritten: TensorVariable) -> bool:
    point = model.initial_point()
    rng = np.random.default_rng(20140614)
    values = [
        np.asarray(point[str(v.name)])
        + (rng.normal(scale=0.3, size=np.shape(point[str(v.name)])) if v.dtype[0] == "f" else 0)
        for v in model.value_vars
    ]
    arguments = [
        np.asarray(v, dtype=w.dtype) for v, w in zip(values, model.value_vars, strict=True)
    ]
    try:
        function = pytensor.function(
            list(model.value_vars),
            [original, rewritten],
            mode="FAST_COMPILE",
            on_unused_input="ignore",
        )
        before, after = function(*arguments)
    except Exception:  # any failure keeps the original graph
        return False
    return bool(np.allclose(before, after, rtol=1e-8, atol=1e-8, equal_nan=True))

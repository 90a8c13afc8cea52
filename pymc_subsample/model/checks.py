"""Refuse, before anything is compiled, the models that row subsampling cannot sample right.

Each check reads the model graph and raises a ``ValueError`` that names the model feature and the
fix in the user's words. ``docs/architecture.md`` ("Which models are refused") lists them; the
reason each one defeats a subsample is given in its docstring.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pymc.model import Model
from pymc.vartypes import discrete_types
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.scalar.basic import Switch
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.shape import Shape, Shape_i
from pytensor.tensor.variable import TensorVariable

__all__ = [
    "check_continuous",
    "check_no_per_row_latents",
    "check_one_term_per_row",
    "check_support_is_fixed",
    "discrete_names",
]


def check_no_per_row_latents(
    model: Model,
    row_rvs: Sequence[Variable],
    initial_point: dict[str, np.ndarray],
    n_rows: int,
    obs_dim: str | None,
) -> None:
    """Refuse free variables with one entry per row that the row likelihood depends on.

    Each row of such a model has its own parameter: a subsample leaves most of them without any
    data, and their gradients and Taylor proxies are not sums over rows (eight schools, random
    effects per observation).
    """
    row_inputs = [inp for rv in row_rvs if rv.owner is not None for inp in rv.owner.inputs]
    row_values = set(ancestors(model.replace_rvs_by_values(row_inputs)))
    dims = model.named_vars_to_dims
    per_row = []
    for rv in model.free_RVs:
        value = model.rvs_to_values[rv]
        if value not in row_values:
            continue
        shape = np.shape(initial_point[str(value.name)])
        rv_dims = dims.get(str(rv.name))
        if obs_dim is not None and rv_dims:
            aligned = rv_dims[0] == obs_dim
        else:
            aligned = len(shape) > 0 and shape[0] == n_rows
        if aligned:
            per_row.append(str(rv.name))
    if per_row:
        raise ValueError(
            f"Free variables {per_row} have one entry per row (N={n_rows}) and the likelihood "
            "depends on them: per-row latent variables cannot be subsampled, because a "
            "minibatch leaves most of them without data. Sample this model with pm.sample() "
            "(NUTS), or marginalise the per-row variables out of the likelihood. If the "
            "variable only happens to have N entries, give the rows a named dim and pass "
            "obs_dim=<that name>."
        )


def check_one_term_per_row(term: TensorVariable, rv_name: str) -> None:
    """Refuse a log-likelihood that is one summed number instead of one term per row."""
    if term.ndim == 0:
        raise ValueError(
            f"The log-likelihood of {rv_name!r} is a single summed value, not one term per "
            "row, so it cannot be evaluated on a subset of rows. A time series over the rows "
            "(pm.AR, pm.GaussianRandomWalk, pm.GARCH11, ...), whose terms depend on the previous "
            "rows, cannot be subsampled: sample it with pm.sample() (NUTS). If it is a "
            "pm.CustomDist, make its logp return the elementwise terms (no pt.sum over the "
            "rows); if it is a pm.Potential-style likelihood, write it as an observed "
            "distribution."
        )


def check_support_is_fixed(
    rows_logp: TensorVariable,
    row_inputs: Iterable[Variable],
    parameters: Mapping[Variable, Variable],
    rv_names: Sequence[str],
) -> None:
    """Refuse likelihoods whose support depends on the parameters (``Uniform(0, theta)``).

    A row outside the support makes the whole likelihood zero, but a subsample cannot see the
    rows it did not read: the chain would walk into parameter values that some unread row
    excludes. Such a support shows in the graph as a ``switch(condition, -inf, ...)`` whose
    condition reads both the row data and a parameter (a parameter-only condition, such as
    ``sigma > 0``, or a data-only one, such as ``y in {0, 1}``, is fine).
    """
    rows = set(row_inputs)
    params = set(parameters)  # value variables, mapped to their random variables for names
    nodes = {variable.owner for variable in ancestors([rows_logp]) if variable.owner is not None}
    for node in nodes:
        if not (isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Switch)):
            continue
        condition, if_true, if_false = node.inputs
        if not (_is_minus_inf(if_true) or _is_minus_inf(if_false)):
            continue
        inputs_of_condition = _value_ancestors(condition)
        bound_params = sorted(str(parameters[p].name) for p in params & inputs_of_condition)
        if bound_params and rows & inputs_of_condition:
            raise ValueError(
                f"The likelihood of {list(rv_names)} has a support that depends on the "
                f"parameters {bound_params} (for example a Uniform or truncated likelihood "
                "whose bounds are free variables): one row outside the bounds makes the whole "
                "likelihood zero, and a subsample cannot see the rows it did not read. Sample "
                "this model with pm.sample() (NUTS or Metropolis), or reparametrise so the "
                "bounds do not depend on parameters (for Uniform(0, theta), the likelihood "
                "depends on the data only through max(y))."
            )


def _value_ancestors(variable: Variable) -> set[Variable]:
    """Return the variables whose values ``variable`` reads (``shape(x)`` does not read ``x``).

    Categorical's bound ``y <= shape(p)[-1] - 1`` is fixed even when ``p`` is computed from
    parameters (``pm.OrderedLogistic``); walking into the ``Shape`` would call it a bound that
    depends on them.
    """
    seen: set[Variable] = set()
    stack = [variable]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        node = current.owner
        if node is not None and not isinstance(node.op, Shape | Shape_i):
            stack.extend(node.inputs)
    return seen


def _is_minus_inf(variable: Variable) -> bool:
    while variable.owner is not None and isinstance(variable.owner.op, DimShuffle):
        variable = variable.owner.inputs[0]
    if not isinstance(variable, Constant):
        return False
    data = np.asarray(variable.data)
    return bool(data.size) and bool(np.all(np.isneginf(data)))


def discrete_names(vars: Sequence[TensorVariable]) -> list[str]:
    """Return the names of the discrete value variables among ``vars``."""
    return [str(v.name) for v in vars if v.dtype in discrete_types]


def check_continuous(model: Model, vars: Sequence[TensorVariable]) -> None:
    """Refuse discrete value variables: the random-walk proposals are continuous."""
    discrete = discrete_names(vars)
    if discrete:
        raise ValueError(
            f"Discrete variables {discrete} cannot be sampled by a pymc_subsample step. "
            "Pass only continuous variables in `vars` and let pm.sample assign another step "
            "(for example pm.Metropolis or pm.CategoricalGibbsMetropolis) to the discrete ones."
        )

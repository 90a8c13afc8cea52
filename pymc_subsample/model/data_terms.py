"""Drop the summands of a per-row log-likelihood that read only the data.

A move's row terms are differences ``F_i(theta') - F_i(theta)``, and every summand of ``F_i``
that reads no parameter cancels in them: the Poisson's ``-log(y_i!)`` (a ``gammaln`` per row,
evaluated twice per difference, half the cost of a Poisson row's change), the Normal's
``-log(2 pi) / 2``. PyTensor's rewrites do not cancel them across the two sides of the
difference, so :func:`without_data_terms` replaces them by zeros before the difference is
built (``docs/architecture.md``, "Group effects").

A summand is dropped only where the difference is unchanged:

- it is an operand of an addition or subtraction (or of a negation of one) on the way down from
  the output, so it enters ``F_i`` with a constant sign;
- through a ``switch`` only where the other branch is an infinite constant (PyMC's support
  checks, ``switch(y < 0, -inf, logp)``): a row on that branch is infinite on both sides, with
  or without the summand; any other ``switch`` is left whole, as its branches may differ
  between the two sides;
- through PyMC's parameter checks (``CheckParameterValue``), which pass their first input on.

A dropped summand is finite on every row: the rows are checked finite at the start
(``ModelOracles.ensure_rows_finite``), and a summand that reads no parameter has the same value
at every point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import graph_inputs
from pytensor.scalar import basic as scalar
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.exceptions import NotScalarConstantError
from pytensor.tensor.variable import TensorVariable

__all__ = ["without_data_terms"]


def without_data_terms(rows_logp: TensorVariable, data: list[Variable]) -> TensorVariable:
    """Return ``rows_logp`` with its summands that read only ``data`` and constants set to 0.

    Parameters
    ----------
    rows_logp : TensorVariable
        The per-row log-likelihood.
    data : list of Variable
        The rows' placeholders. Every other input that is not a constant (the step's point,
        the tables of the groups' cells, shared variables) counts as a parameter.

    Returns
    -------
    TensorVariable
        ``rows_logp`` itself where nothing was dropped, else a new graph whose differences
        between two points are those of ``rows_logp``.
    """
    reads: dict[Variable, bool] = {}
    rows = set(data)

    def reads_parameters(variable: Variable) -> bool:
        """Whether ``variable`` reads a parameter (any root but a row or a constant)."""
        known = reads.get(variable)
        if known is None:
            node = variable.owner
            if node is None:
                known = variable not in rows and not isinstance(variable, Constant)
            else:
                known = any(reads_parameters(parent) for parent in node.inputs)
            reads[variable] = known
        return known

    def strip(variable: Variable, guards: tuple[Guard, ...]) -> Variable:
        node = variable.owner
        if node is None or not isinstance(node.op, Elemwise):
            if node is not None and type(node.op).__name__ == "CheckParameterValue":
                inner = strip(node.inputs[0], guards)
                if inner is not node.inputs[0]:
                    return cast(Variable, node.op(inner, *node.inputs[1:]))
            return variable
        operation = node.op.scalar_op
        if isinstance(operation, scalar.Add | scalar.Sub):
            inputs = [
                strip(parent, guards)
                if reads_parameters(parent)
                else (pt.zeros_like(parent) if _vanishes(parent, guards, rows) else parent)
                for parent in node.inputs
            ]
        elif isinstance(operation, scalar.Neg):
            inputs = [strip(node.inputs[0], guards)]
        elif isinstance(operation, scalar.Switch):
            condition, first, second = node.inputs
            inputs = [
                condition,
                _strip_branch(strip, first, second, condition, guards),
                _strip_branch(strip, second, first, condition, guards),
            ]
        else:
            return variable
        if all(new is old for new, old in zip(inputs, node.inputs, strict=True)):
            return variable
        return cast(Variable, node.op(*inputs))

    return cast(TensorVariable, strip(rows_logp, ()))


def _constant(variable: Variable) -> np.ndarray | None:
    """Return the value of a constant (or one broadcast by ``ExpandDims``), else None."""
    if isinstance(variable, Constant):
        return np.asarray(variable.data)
    try:
        return np.asarray(pt.get_underlying_scalar_constant_value(variable))
    except NotScalarConstantError:
        return None


#: A row placeholder and a value it equals on the rows where a summand is to vanish.
Guard = tuple[Variable, np.ndarray]


def _strip_branch(
    strip: Callable[[Variable, tuple[Guard, ...]], Variable],
    branch: Variable,
    other: Variable,
    condition: Variable,
    guards: tuple[Guard, ...],
) -> Variable:
    """Strip a switch's branch where the switch's two sides cannot disagree about it.

    The other branch infinite (a support check): a row there is infinite on both sides. The
    other branch a finite constant taken where ``condition`` holds: a dropped summand must be 0
    wherever it holds; each conjunct ``placeholder == value`` of the condition (PyMC's Poisson:
    ``mu == 0 and y == 0`` gives ``0``, where ``-log(y!)`` is ``-log(0!) = 0``) becomes a guard
    that every summand dropped in the branch is checked against.
    """
    value = _constant(other)
    if value is None:
        return branch
    if value.size and np.issubdtype(value.dtype, np.floating) and np.isinf(value).all():
        return strip(branch, guards)
    equalities = _equalities(condition)
    if not equalities:
        return branch
    return strip(branch, (*guards, *equalities))


def _equalities(condition: Variable) -> tuple[Guard, ...]:
    """Return the conjuncts ``placeholder == constant`` of a conjunction (``and``, ``*``)."""
    node = condition.owner
    if node is None or not isinstance(node.op, Elemwise):
        return ()
    operation = node.op.scalar_op
    if isinstance(operation, scalar.AND | scalar.Mul):
        return tuple(guard for parent in node.inputs for guard in _equalities(parent))
    if isinstance(operation, scalar.EQ):
        left, right = node.inputs
        for placeholder, other in ((left, right), (right, left)):
            value = _constant(other)
            if placeholder.owner is None and _constant(placeholder) is None and value is not None:
                return ((placeholder, value),)
    return ()


def _vanishes(summand: Variable, guards: tuple[Guard, ...], rows: set[Variable]) -> bool:
    """Whether a data-only summand is 0 wherever every guard's condition can hold.

    With no guard it may be dropped (it cancels); with guards it must evaluate to exactly 0
    once their placeholders are set to their values (and read no other placeholder).
    """
    if not guards:
        return True
    replace: dict[Variable, Variable] = {
        placeholder: pt.as_tensor(value, dtype=placeholder.type.dtype)
        for placeholder, value in guards
    }
    fixed = clone_replace(summand, replace=replace, rebuild_strict=False)
    if any(not isinstance(root, Constant) for root in graph_inputs([fixed])):
        return False  # it reads another placeholder: its value on those rows is not known
    try:
        value = np.asarray(pytensor.function([], fixed, mode="FAST_COMPILE")())
    except Exception:
        return False
    return bool(value.size and np.all(value == 0.0))

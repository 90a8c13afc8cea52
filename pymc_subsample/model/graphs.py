"""The graph builders of the oracles' functions of ``q``: each returns ``(inputs, outputs)``.

:class:`~pymc_subsample.model.compiled.LazyFunction` calls one (a picklable ``partial`` of it)
when its function is first called. Used by ``functions.py`` for the functions in ``q`` and by
``likelihood_space.py`` for those in the likelihood's parameters.
"""

from __future__ import annotations

from typing import Any, cast

import pytensor
import pytensor.tensor as pt
from pytensor.gradient import disconnected_grad, jacobian
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.gradients import (
    per_row_gradient,
    per_row_proxy_terms,
    summed_gradient_and_hessian,
)

__all__ = [
    "given",
    "posterior_gradient_graph",
    "prior_gradient_graph",
    "prior_hessian_graph",
    "remainder_gradient_graph",
    "residual_graph",
    "score_graph",
    "search_graph",
    "sums_graph",
]


def given(inputs: list[Variable], outputs: Any) -> tuple[list[Variable], Any]:
    """Return a graph already built: ``inputs`` and ``outputs`` as they are."""
    return inputs, outputs


def score_graph(
    rows_q: TensorVariable, q: TensorVariable, row_inputs: list[TensorVariable]
) -> tuple[list[Variable], Any]:
    """Build the rows' per-row gradients (scores), the rows batched as ``(n, 1, ...)``."""
    scores, batched_inputs = per_row_gradient(rows_q, q, row_inputs)
    return [q, *batched_inputs], scores


def residual_graph(
    rows_q: TensorVariable,
    rows_q_old: Variable,
    rows_ref: TensorVariable,
    point: TensorVariable,
    point_old: TensorVariable,
    ref: TensorVariable,
    inputs: list[TensorVariable],
    row_inputs: list[TensorVariable],
    order: int,
) -> tuple[list[Variable], Any]:
    """Residuals ``l_i(q) - l_i(q_old)`` minus the Taylor proxies' difference at ``ref``.

    ``point`` and ``point_old`` are ``q`` and ``q_old`` in the proxies' space (themselves, or
    the likelihood's parameters ``phi(q)``, ``phi(q_old)``), ``rows_ref`` the rows' graph of
    ``ref`` in that space. The proxies read the other model variables at their frozen values
    (the ``_frozen`` shared copies), so that the sums of :func:`sums_graph` are those of the
    proxies subtracted here.
    """
    step = point - point_old
    centre = point + point_old - 2 * ref if order == 2 else None
    proxies = per_row_proxy_terms(rows_ref, ref, step, centre)
    return [*inputs, ref, *row_inputs], rows_q - rows_q_old - proxies


def sums_graph(
    rows_ref: TensorVariable, q_ref: TensorVariable, row_inputs: list[TensorVariable]
) -> tuple[list[Variable], Any]:
    """Build the rows' summed gradient and Hessian at ``q_ref``."""
    gradient_sum, hessian_sum = summed_gradient_and_hessian(rows_ref, q_ref)
    return [q_ref, *row_inputs], [gradient_sum, hessian_sum]


def search_graph(
    rows_q: TensorVariable, q: TensorVariable, row_inputs: list[TensorVariable], hessian: bool
) -> tuple[list[Variable], Any]:
    """Build the rows' summed log-likelihood, gradient, scores' outer products and Hessian.

    Inputs are the rows batched as for :func:`score_graph` (``(n, 1, ...)``); the per-row
    scores stay inside the function.
    """
    scores, batched_inputs = per_row_gradient(rows_q, q, row_inputs)
    unbatched: dict[Variable, Variable] = {
        row: batch[:, 0] for row, batch in zip(row_inputs, batched_inputs, strict=True)
    }
    rows = cast(TensorVariable, clone_replace(rows_q, replace=unbatched))
    outputs = [rows.sum(), scores.sum(0), scores.T @ scores]
    if hessian:
        outputs.append(summed_gradient_and_hessian(rows, q)[1])
    return [q, *batched_inputs], outputs


def full_sums_graph(
    rows_q: TensorVariable, q: TensorVariable, row_inputs: list[TensorVariable]
) -> tuple[list[Variable], Any]:
    """Build the rows' summed log-likelihood, gradient and Hessian, without per-row scores.

    What a Newton iteration on every row needs (:meth:`ModelOracles.search_sums` on all
    rows): the scores' outer products feed only the direction test's variance, whose
    finite-population factor is 0 there. About half the work of :func:`search_graph`.
    """
    gradient_sum, hessian_sum = summed_gradient_and_hessian(rows_q, q)
    return [q, *row_inputs], [rows_q.sum(), gradient_sum, hessian_sum]


def posterior_gradient_graph(
    prior_q: TensorVariable,
    rows_q: TensorVariable,
    q: TensorVariable,
    row_inputs: list[TensorVariable],
) -> tuple[list[Variable], Any]:
    """Build the gradient of the prior plus ``factor`` times the rows' summed log-likelihood."""
    # One backward pass through the rows' sum: no (n, d) matrix of per-row scores.
    factor = pt.dscalar("likelihood_factor")
    gradient = pytensor.grad(prior_q + factor * rows_q.sum(), q, disconnected_inputs="ignore")
    return [q, factor, *row_inputs], gradient


def remainder_gradient_graph(
    prior_q: TensorVariable,
    rows_q: TensorVariable,
    rows_ref: TensorVariable,
    q: TensorVariable,
    q_ref: TensorVariable,
    row_inputs: list[TensorVariable],
    point: TensorVariable | None = None,
) -> tuple[list[Variable], Any]:
    """Build the prior's gradient plus ``factor`` times the rows' summed second-order remainders."""
    # Rows' summed remainders s_i(q) - s_i(q_ref) - H_i(q_ref) (q - q_ref): the summed Hessian
    # times the direction is the gradient of the summed score's projection on it (a
    # Hessian-vector product, no d x d matrix per row), the direction held constant. With
    # ``point = phi(q)`` the expansion is in the likelihood's parameters, and its gradient
    # (score_ref + H (phi(q) - q_ref)) is taken back to q by J_phi(q)^T.
    [_, factor, *_], gradient = posterior_gradient_graph(prior_q, rows_q, q, row_inputs)
    score_ref = cast(
        TensorVariable, pytensor.grad(rows_ref.sum(), q_ref, disconnected_inputs="ignore")
    )
    direction = disconnected_grad((q if point is None else point) - q_ref)
    hessian_direction = cast(
        TensorVariable,
        pytensor.grad((score_ref * direction).sum(), q_ref, disconnected_inputs="ignore"),
    )
    expansion = score_ref + hessian_direction
    if point is not None:
        held = disconnected_grad(expansion)
        expansion = cast(
            TensorVariable,
            pytensor.grad((point * held).sum(), q, disconnected_inputs="ignore"),
        )
    return [q, q_ref, factor, *row_inputs], gradient - factor * expansion


def prior_gradient_graph(prior_q: TensorVariable, q: TensorVariable) -> tuple[list[Variable], Any]:
    """Build the gradient of the prior part."""
    return [q], _prior_gradient(prior_q, q)


def prior_hessian_graph(prior_q: TensorVariable, q: TensorVariable) -> tuple[list[Variable], Any]:
    """Build the gradient and Hessian of the prior part."""
    gradient = _prior_gradient(prior_q, q)
    hessian = jacobian(gradient, q, vectorize=True, disconnected_inputs="ignore")
    return [q], [gradient, hessian]


def _prior_gradient(prior_q: TensorVariable, q: TensorVariable) -> TensorVariable:
    # Flat priors (pm.Flat, and pm.HalfFlat's constant log-Jacobian gradient) leave the prior's
    # gradient or Hessian disconnected from q: those are zero, not an error.
    return cast(TensorVariable, pytensor.grad(prior_q, q, disconnected_inputs="ignore"))

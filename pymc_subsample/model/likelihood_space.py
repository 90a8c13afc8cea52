"""The control variates' functions in the likelihood's parameters ``theta = phi(q)``.

Built from the cut that ``likelihood_parameters.py`` finds, at first use; the oracles in the
likelihood's parameters (``ModelOracles.in_likelihood_parameters``) read them.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np
import pytensor
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.compiled import GraphBuilder, LazyFunction
from pymc_subsample.model.graphs import (
    given,
    remainder_gradient_graph,
    residual_graph,
    sums_graph,
)
from pymc_subsample.model.grouped_sums import GroupedSums, grouped_sums
from pymc_subsample.model.likelihood_parameters import likelihood_parameters

__all__ = ["LikelihoodSpace", "likelihood_space"]


class LikelihoodSpace(NamedTuple):
    """The functions of control variates expanded in the likelihood's parameters ``theta``.

    ``theta = phi(q)`` (``model/likelihood_parameters.py``): the Taylor proxies are polynomials
    in ``theta``, their sums ``d_theta``-dimensional. Each function compiles at first use.
    """

    size: int
    phi: LazyFunction  # q -> theta
    pullback: LazyFunction  # q, v -> J_phi(q)^T v
    residual: dict[int, LazyFunction]  # q, q_old, theta_ref, rows -> l_i - r_i
    sums: LazyFunction  # theta_ref, rows -> (G, H) in theta
    remainder_gradient: LazyFunction  # q, theta_ref, factor, rows
    grouped: GroupedSums | None  # sums by group in theta (grouped_sums.py), where there are groups


def likelihood_space(
    rows_q: TensorVariable,
    rows_q_old: Variable,
    prior_q: TensorVariable,
    q: TensorVariable,
    q_old: TensorVariable,
    row_inputs: list[TensorVariable],
    frozen: tuple[tuple[SharedVariable, SharedVariable], ...],
    kwargs: dict[str, Any],
    q0: np.ndarray,
) -> LikelihoodSpace | None:
    """Build the control variates' functions in the likelihood's parameters (or None)."""
    found = likelihood_parameters(rows_q, q, row_inputs, q0)
    if found is None:
        return None
    theta_ref = found.theta.type("theta_ref")
    to_reference: dict[Variable, Variable] = {found.theta: theta_ref, **dict(frozen)}
    rows_ref = cast(TensorVariable, clone_replace(found.rows_logp, replace=to_reference))
    phi = found.phi
    to_old: dict[Variable, Variable] = {q: q_old}
    phi_old = cast(TensorVariable, clone_replace(phi, replace=to_old))

    def lazy(build: GraphBuilder) -> LazyFunction:
        return LazyFunction(build, kwargs)

    points = (phi, phi_old, theta_ref, [q, q_old])
    residual_inputs = (rows_q, rows_q_old, rows_ref, *points, row_inputs)
    vector = phi.type("vector")
    pullback = pytensor.grad((phi * vector).sum(), q, disconnected_inputs="ignore")
    theta0 = pytensor.function([q], phi, mode="FAST_COMPILE", on_unused_input="ignore")(q0)
    return LikelihoodSpace(
        size=int(found.theta.type.shape[0] or 0),
        phi=lazy(partial(given, [q], phi)),
        pullback=lazy(partial(given, [q, vector], pullback)),
        residual={
            order: lazy(partial(residual_graph, *residual_inputs, order)) for order in (1, 2)
        },
        sums=lazy(partial(sums_graph, rows_ref, theta_ref, row_inputs)),
        remainder_gradient=lazy(
            partial(
                remainder_gradient_graph, prior_q, rows_q, rows_ref, q, theta_ref, row_inputs, phi
            )
        ),
        grouped=grouped_sums(rows_ref, theta_ref, row_inputs, np.asarray(theta0), kwargs),
    )

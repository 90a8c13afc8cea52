"""Per-row gradients of the log-likelihood without a Scan over rows.

Row i's log-likelihood depends only on row i's data, so its gradient is the gradient of a
one-row graph. We build that graph (row placeholders of leading length 1), differentiate it, and
vectorise the gradient over a batch of rows with ``vectorize_graph`` (DESIGN.md section 5:
0.07 ms for 500 x 50 against 1.5 ms for a Scan-based Jacobian; measured here 9.5 us on Numba).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.tensor.variable import TensorVariable

__all__ = ["per_row_gradient"]


def per_row_gradient(
    rows_logp: TensorVariable, q: TensorVariable, row_inputs: Sequence[TensorVariable]
) -> tuple[TensorVariable, list[TensorVariable]]:
    """Return the (n, d) matrix of per-row gradients and its batched row inputs.

    Parameters
    ----------
    rows_logp : TensorVariable
        Per-row log-likelihood, a graph of ``q`` and the row placeholders ``row_inputs``.
    q : TensorVariable
        The raveled parameter vector.
    row_inputs : sequence of TensorVariable
        Placeholders for the rows of each row-aligned data array.

    Returns
    -------
    scores : TensorVariable
        ``scores[i] = d loglik_i / dq``.
    batched_inputs : list of TensorVariable
        One input per placeholder, with shape ``(n, 1, *row_shape)``: the rows of each data array
        with an axis of length 1 inserted after the first.
    """
    single = [_with_leading(inp, 1) for inp in row_inputs]
    replacements: dict[Variable, Variable] = dict(zip(row_inputs, single, strict=True))
    one_row = cast(
        TensorVariable, clone_replace(rows_logp, replace=replacements, rebuild_strict=False)
    )
    gradient = cast(TensorVariable, pytensor.grad(one_row.sum(), q))
    batched = [
        pt.tensor(dtype=inp.dtype, shape=(None, *inp.type.shape), name=f"{inp.name}_batch")
        for inp in single
    ]
    scores = vectorize_graph(gradient, replace=dict(zip(single, batched, strict=True)))
    return cast(TensorVariable, scores), batched


def _with_leading(variable: TensorVariable, length: int) -> TensorVariable:
    return variable.type.clone(shape=(length, *variable.type.shape[1:]))(
        name=f"{variable.name}_one"
    )

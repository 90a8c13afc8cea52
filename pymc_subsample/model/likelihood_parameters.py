"""The likelihood's own parameters: where the per-row graph stops depending on ``q`` alone.

A row's log-likelihood reads the sampled vector ``q`` only through a few tensors computed from
``q`` and no data: in a non-centred hierarchy, the group effects ``a = mu + sd * z`` (not
``mu``, ``sd`` and ``z``), the slope and the noise scale (not its logarithm). Those tensors,
raveled into one vector ``theta = phi(q)``, are the likelihood's parameters. A Taylor
control variate expanded in ``theta`` instead of ``q`` keeps the nonlinear map ``phi`` exact
and approximates only the rows' log-likelihoods, which are close to quadratic in ``theta``
wherever the data identify it: the second-order proxy of a non-centred hierarchy, whose ``q``
posterior is a curved ridge (``sd`` times ``z`` fixed by the data), then holds as well as that
of the centred form. ``docs/architecture.md`` ("Model adapter") places this in the layers;
``docs/control_variates.md`` gives the estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors, toposort
from pytensor.tensor.variable import TensorVariable

__all__ = ["LikelihoodParameters", "likelihood_parameters"]


class LikelihoodParameters(NamedTuple):
    """The rows' graph rewritten on the likelihood's parameters ``theta = phi(q)``.

    Attributes
    ----------
    theta : TensorVariable
        A vector of static length: the raveled parameters.
    phi : TensorVariable
        ``phi(q)``, a graph of ``q`` (and of other model variables, read live).
    rows_logp : TensorVariable
        The per-row log-likelihood as a graph of ``theta`` and the row placeholders; ``q``
        is not among its inputs.
    """

    theta: TensorVariable
    phi: TensorVariable
    rows_logp: TensorVariable


def likelihood_parameters(
    rows_logp: TensorVariable,
    q: TensorVariable,
    row_inputs: Sequence[TensorVariable],
    q0: np.ndarray,
) -> LikelihoodParameters | None:
    """Find the tensors through which the rows' graph reads ``q``, and rebuild it on them.

    The cut is every float tensor that depends on ``q`` but on no row placeholder and is an
    input of an operation whose output depends on a row placeholder. Returns None where the
    cut is not usable: an integer tensor computed from ``q`` reaches the rows (an index or a
    shape), or the rows' graph still reads ``q`` after the replacement.

    Parameters
    ----------
    rows_logp : TensorVariable
        Per-row log-likelihood, a graph of ``q`` and ``row_inputs``.
    q : TensorVariable
        The raveled parameter vector.
    row_inputs : sequence of TensorVariable
        The row placeholders.
    q0 : ndarray
        A point, where the cut's shapes are read (one uncompiled evaluation).
    """
    tensors = cut_tensors(rows_logp, q, row_inputs)
    if not tensors:
        return None
    evaluate = pytensor.function(
        [q],
        [tensor.shape for tensor in tensors] + [t for t in tensors if t.dtype == "bool"],
        mode="FAST_COMPILE",
        on_unused_input="ignore",
    )
    values = evaluate(q0)
    shapes, conditions = values[: len(tensors)], iter(values[len(tensors) :])
    replacements: dict[Variable, Variable] = {}
    cut, cut_shapes = [], []
    for tensor, shape in zip(tensors, shapes, strict=True):
        if tensor.dtype == "bool":
            # A parameter check (PyMC's Check{sigma > 0}) of q alone: it holds at q0, and the
            # proxies built on theta are taken where the rows' own graph, which keeps the
            # check, is finite. It becomes a constant there.
            condition = next(conditions)
            if not np.all(condition):
                return None
            replacements[tensor] = pt.constant(np.asarray(condition), dtype="bool")
        elif str(tensor.dtype).startswith("float"):
            cut.append(tensor)
            cut_shapes.append(tuple(int(dim) for dim in shape))
        else:
            return None  # an index or a shape computed from q
    if not cut:
        return None
    sizes = [int(np.prod(shape)) for shape in cut_shapes]
    theta = pt.vector("theta", dtype="float64", shape=(int(sum(sizes)),))
    offset = 0
    for tensor, shape, size in zip(cut, cut_shapes, sizes, strict=True):
        piece = theta[offset : offset + size].reshape(shape)
        replacements[tensor] = pt.cast(piece, tensor.dtype)
        offset += size
    rebuilt = cast(
        TensorVariable, clone_replace(rows_logp, replace=replacements, rebuild_strict=False)
    )
    if q in set(ancestors([rebuilt])):
        return None
    phi = pt.concatenate([pt.cast(tensor, "float64").ravel() for tensor in cut])
    return LikelihoodParameters(theta, cast(TensorVariable, phi), rebuilt)


def cut_tensors(
    rows_logp: TensorVariable, q: TensorVariable, row_inputs: Sequence[TensorVariable]
) -> list[TensorVariable]:
    """Return the tensors of ``q`` alone (and constants) that operations on the rows read."""
    rows = set(row_inputs)
    of_q: set[Variable] = {q}
    of_rows: set[Variable] = set(rows)
    cut: dict[Variable, None] = {}
    for node in toposort([rows_logp]):
        reads_q = any(inp in of_q for inp in node.inputs)
        reads_rows = any(inp in of_rows for inp in node.inputs)
        if reads_rows:
            of_rows.update(node.outputs)
            for inp in node.inputs:
                if inp in of_q and inp not in of_rows:
                    cut[inp] = None
        elif reads_q:
            of_q.update(node.outputs)
    return [cast(TensorVariable, tensor) for tensor in cut]

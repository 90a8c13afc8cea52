"""Rewrites for PyTensor's Python linker: elementwise nodes as whole-array NumPy calls.

The set-up functions that run interpreted first (``compiled.LazyFunction``,
``docs/architecture.md``, "Model layer") run each elementwise node as one NumPy call where its
scalar op names a NumPy or SciPy function (``nfunc_spec``), and otherwise as a Python call per
element (``np.frompyfunc``). ``softplus``, which every logistic likelihood's derivatives read
(``log(sigmoid(x)) = -softplus(-x)``), has none: on a hierarchical logistic regression's per-row
derivatives its two nodes were two thirds of an interpreted pass (0.5 us per row each against
5 ns for a NumPy node). :data:`PYTHON_LINKER_TAG` names the rewrites that write such nodes
with NumPy's functions instead, for the Python linker's mode only: compiled graphs keep
PyTensor's own ops.
"""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.compile.mode import optdb
from pytensor.graph.rewriting.basic import WalkingGraphRewriter, node_rewriter
from pytensor.scalar.math import Softplus
from pytensor.tensor.elemwise import Elemwise

__all__ = ["PYTHON_LINKER_TAG"]

#: The tag of the rewrites registered here, included by the Python linker's mode only.
PYTHON_LINKER_TAG = "pymc_subsample_python_linker"


@node_rewriter([Elemwise])
def softplus_with_numpy_functions(fgraph: object, node: object) -> list[pt.TensorVariable] | None:
    """Write ``softplus(x)`` as ``max(x, 0) + log1p(exp(-|x|))``, exact and overflow-free.

    The two forms agree to rounding for every ``x`` (``log(1 + e^x) = max(x, 0) +
    log(1 + e^-|x|)``); each node of the second is one NumPy call.
    """
    if not isinstance(node.op.scalar_op, Softplus):  # type: ignore[attr-defined]
        return None
    (x,) = node.inputs  # type: ignore[attr-defined]
    return [pt.maximum(x, 0) + pt.log1p(pt.exp(-pt.abs(x)))]


# After the other rewrites (stabilisation writes softplus where it sees log(1 + exp(x)); the
# elementwise fusion, which the Python linker's mode excludes, is at 49).
optdb.register(
    "pymc_subsample_softplus_with_numpy_functions",
    WalkingGraphRewriter(softplus_with_numpy_functions),
    PYTHON_LINKER_TAG,
    position=48.9,
)

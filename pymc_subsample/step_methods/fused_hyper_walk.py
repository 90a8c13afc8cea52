"""The hyperparameters' walk of a centred hierarchy in one compiled call.

:class:`~pymc_subsample.GroupEffectsMH` moves a hierarchy's hyperparameters by
``kernels/hyper_walk.MOVES`` exact Metropolis steps per draw, each evaluating the model's
prior at a new point (``step_methods/group_moves.py``, ``_move_hyperparameters``). In a
centred hierarchy, where no factor's cells read the hyperparameters, that target is the prior
itself, and the walk is one loop over the prior's PyTensor Numba kernel:
:class:`CompiledHyperWalk` generates it (cached on disk with PyTensor's Numba cache, under a key
made of the kernel's and the driver's source). The increments and uniforms are drawn by the
chain's generator as in Python, so the walk makes the same moves as the Python loop
(``kernels/hyper_walk.HyperWalk``); ``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pymc_subsample.kernels.hyper_walk import WalkMoves
from pymc_subsample.model.compiled import compile_driver

if TYPE_CHECKING:
    from pymc_subsample.model.compiled import NumbaKernel

__all__ = ["CompiledHyperWalk"]

#: Bump when the generated driver's source changes (the key of its disk cache includes it).
DRIVER_VERSION = 1

_DRIVER_TEMPLATE = """
def hyper_walk(q, free, h, increments, uniforms, acceptances{shared}):
    point = q.copy()
    h = h.copy()
    for i in range(free.size):
        point[free[i]] = h[i]
    current = prior(point{shared})[0].item()
    for m in range(increments.shape[0]):
        for i in range(free.size):
            point[free[i]] = h[i] + increments[m, i]
        candidate = prior(point{shared})[0].item()
        log_ratio = candidate - current
        acceptance = math.exp(min(log_ratio, 0.0)) if math.isfinite(log_ratio) else 0.0
        acceptances[m] = acceptance
        if uniforms[m] < acceptance:
            for i in range(free.size):
                h[i] += increments[m, i]
            current = candidate
    return h
"""


class CompiledHyperWalk:
    """The walk's moves (``kernels/hyper_walk.WalkMoves``) of the prior, as one Numba call.

    Parameters
    ----------
    prior : NumbaKernel
        The model's prior (``q -> log p(q)``) compiled for Numba.
    free : ndarray
        The coordinates of the step's point that the walk moves (the others held).

    Raises
    ------
    RuntimeError
        If PyTensor's Numba backend cannot compile the driver.
    """

    def __init__(self, prior: NumbaKernel, free: np.ndarray) -> None:
        self._prior = prior
        self._free = np.asarray(free, dtype=np.int64)
        self._driver = _driver(prior)

    def moves(self, q: np.ndarray) -> WalkMoves:
        """Return the moves from the step's point ``q`` (its ``free`` coordinates replaced)."""

        def moves(
            h: np.ndarray, increments: np.ndarray, uniforms: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray]:
            acceptances = np.zeros(uniforms.size)
            end = self._driver(
                q,
                self._free,
                np.asarray(h, dtype=np.float64),
                np.ascontiguousarray(increments),
                uniforms,
                acceptances,
                *self._prior.implicit_values(),
            )
            return end, acceptances

        return moves


def _driver(prior: NumbaKernel) -> Callable[..., Any]:
    """Generate, compile (or load from PyTensor's Numba cache) the walk for ``prior``."""
    shared = "".join(f", shared_{k}" for k in range(len(prior.implicit)))
    source = _DRIVER_TEMPLATE.format(shared=shared)
    environment = {"__name__": __name__, "np": np, "math": math, "prior": prior.function}
    return compile_driver(
        source, "hyper_walk", environment, f"hyper_walk_{DRIVER_VERSION}", [prior.cache_key]
    )

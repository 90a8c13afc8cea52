"""The hyperparameters' walk of a centred hierarchy in one compiled call.

:class:`~pymc_subsample.GroupEffectsMH` moves a hierarchy's hyperparameters by
``kernels/hyper_walk.MOVES`` exact Metropolis steps per draw, each evaluating the model's
prior at a new point (``step_methods/group_moves.py``, ``_move_hyperparameters``). In a
centred hierarchy, where no factor's cells read the hyperparameters, that target is the prior
itself, and the walk is one loop over the prior's PyTensor Numba kernel:
:class:`CompiledHyperWalk` generates it (cached on disk with PyTensor's Numba cache, under a key
made of the kernel's and the driver's source). The walk draws its increments and uniforms from
Numba's generator, which the group sweep seeds from the chain's at its first draw
(``kernels/fused.seed_generator``): a draw's Python code runs slowly after the compiled sweep
(its code and data out of the caches: the walk's two NumPy draws and their mean took some
80 us of a 0.6 ms draw on the centred Poisson benchmark, the moves themselves 25 us). Given
the same increments and uniforms, it makes the Python loop's moves
(``kernels/hyper_walk.walk``); ``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from pymc_subsample.kernels.hyper_walk import MOVES, WalkMoves
from pymc_subsample.model.compiled import compile_driver

if TYPE_CHECKING:
    from pymc_subsample.model.compiled import NumbaKernel

__all__ = ["CompiledHyperWalk"]

#: Bump when the generated driver's source changes (the key of its disk cache includes it).
DRIVER_VERSION = 2

_DRIVER_TEMPLATE = """
def hyper_walk(q, free, h, increments, uniforms, acceptances, draw_noise, factor, scale{shared}):
    size = free.size
    if draw_noise:  # increments scale * factor @ z, z standard normal; uniforms on (0, 1)
        z = np.empty(size)
        for m in range(increments.shape[0]):
            for j in range(size):
                z[j] = np.random.standard_normal()
            for i in range(size):
                total = 0.0
                for j in range(size):
                    total += factor[i, j] * z[j]
                increments[m, i] = scale * total
            uniforms[m] = np.random.random()
    point = q.copy()
    h = h.copy()
    for i in range(size):
        point[free[i]] = h[i]
    current = prior(point{shared})[0].item()
    accepted = 0
    for m in range(increments.shape[0]):
        for i in range(size):
            point[free[i]] = h[i] + increments[m, i]
        candidate = prior(point{shared})[0].item()
        log_ratio = candidate - current
        acceptance = math.exp(min(log_ratio, 0.0)) if math.isfinite(log_ratio) else 0.0
        acceptances[m] = acceptance
        if uniforms[m] < acceptance:
            for i in range(size):
                h[i] += increments[m, i]
            current = candidate
            accepted += 1
    return h, accepted
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
        """Return the moves from the step's point ``q`` (its ``free`` coordinates replaced).

        Their noise comes from Numba's generator (the module docstring).
        """

        def moves(
            h: np.ndarray, factor: np.ndarray, scale: float
        ) -> tuple[np.ndarray, np.ndarray, int]:
            increments, uniforms = np.empty((MOVES, self._free.size)), np.empty(MOVES)
            return self._walk(q, h, increments, uniforms, (factor, scale))

        return moves

    def given_moves(
        self, q: np.ndarray, h: np.ndarray, increments: np.ndarray, uniforms: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Make the moves from ``h`` through the given ``increments`` and ``uniforms``.

        What :func:`~pymc_subsample.kernels.hyper_walk.walk` makes in Python: the end point
        and every move's acceptance probability.
        """
        end, acceptances, _ = self._walk(q, h, increments, uniforms, None)
        return end, acceptances

    def _walk(
        self,
        q: np.ndarray,
        h: np.ndarray,
        increments: np.ndarray,
        uniforms: np.ndarray,
        noise: tuple[np.ndarray, float] | None,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Call the driver; ``noise`` is the increments' factor and scale where it draws them."""
        factor, scale = (np.eye(self._free.size), 1.0) if noise is None else noise
        acceptances = np.zeros(uniforms.size)
        end, accepted = self._driver(
            q,
            self._free,
            np.asarray(h, dtype=np.float64),
            np.ascontiguousarray(increments, dtype=np.float64),
            np.ascontiguousarray(uniforms, dtype=np.float64),
            acceptances,
            noise is not None,
            np.ascontiguousarray(factor, dtype=np.float64),
            float(scale),
            *self._prior.implicit_values(),
        )
        return end, acceptances, accepted


def _driver(prior: NumbaKernel) -> Callable[..., Any]:
    """Generate, compile (or load from PyTensor's Numba cache) the walk for ``prior``."""
    shared = "".join(f", shared_{k}" for k in range(len(prior.implicit)))
    source = _DRIVER_TEMPLATE.format(shared=shared)
    environment = {"__name__": __name__, "np": np, "math": math, "prior": prior.function}
    return compile_driver(
        source, "hyper_walk", environment, f"hyper_walk_{DRIVER_VERSION}", [prior.cache_key]
    )

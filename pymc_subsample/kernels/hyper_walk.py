"""Exact random-walk moves of a hierarchy's hyperparameters, the group parameters held fixed.

Given the groups' parameters (the cells ``c_g`` the rows read), a hierarchy's hyperparameters
``h`` read no row: in a centred hierarchy they appear only in the prior, and in a non-centred
one, where ``c_g = A(h) + B_g(h) x_g``, holding ``c_g`` fixed while ``h`` moves means moving
the effects with them, ``x_g = B_g(h)^-1 (c_g - A(h))``. That is the sufficient-augmentation
(centred) update of Yu and Meng (2011, section 2), written in the non-centred coordinates:
its target is the density of ``(h, c)``,

    log p(h) + sum_g log p(x_g(h) | h) - sum_g log |det B_g(h)|,

the prior of the step's point at ``(h, x(h))`` and the change of variables from ``x_g`` to
``c_g``. A centred hierarchy has ``B_g = I`` and ``A = 0``: the moves are then the plain
conditional update of ``h``. Both cost ``O(G)`` and are exact.

A call makes :data:`MOVES` Metropolis steps with a Gaussian proposal. During tuning the scale
follows a Robbins-Monro recursion towards :data:`TARGET_ACCEPTANCE`, and at the end of each
window (each twice the last) the proposal's covariance becomes the window's draws' covariance
(Haario, Saksman and Tamminen 2001) times ``2.38^2 / d`` (Roberts and Rosenthal 2001).
``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["HyperWalk", "HyperWalkInfo", "WalkMoves", "walk"]

#: Metropolis steps per call (per sweep of the step).
MOVES = 16
#: Proposal sd of every coordinate before the first window ends.
FIRST_SD = 0.1
#: Tuning draws (calls) in the first window of the covariance's adaptation.
FIRST_WINDOW = 50
#: The acceptance rate the scale's adaptation aims at (Roberts and Rosenthal 2001: 0.234 in
#: high dimension, about 0.44 in one).
TARGET_ACCEPTANCE = 0.3


class HyperWalkInfo(NamedTuple):
    """What one call did; the field names are the step's stat names."""

    #: Share of the call's moves that were accepted.
    hyper_accept_rate: float
    #: The proposal's scale (a multiple of the adapted covariance's square root).
    hyper_scale: float


#: ``(h, factor, scale) -> (h, acceptances, accepted)``: :data:`MOVES` Metropolis moves from
#: ``h`` with increments ``scale * factor @ z`` (``z`` standard normal), each accepted where a
#: uniform is below its acceptance probability, the noise drawn by the moves themselves; the
#: end point, every move's acceptance probability and the number accepted.
WalkMoves = Callable[[np.ndarray, np.ndarray, float], tuple[np.ndarray, np.ndarray, int]]


def walk(
    h: np.ndarray,
    log_target: Callable[[np.ndarray], float],
    increments: np.ndarray,
    uniforms: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Make the :data:`WalkMoves` of ``log_target``, one Python call of it per move."""
    current = log_target(h)
    acceptances = np.zeros(uniforms.size)
    with np.errstate(all="ignore"):
        for m, (increment, uniform) in enumerate(zip(increments, uniforms, strict=True)):
            proposal = h + increment
            candidate = log_target(proposal)
            log_ratio = candidate - current
            acceptance = math.exp(min(log_ratio, 0.0)) if math.isfinite(log_ratio) else 0.0
            acceptances[m] = acceptance
            if uniform < acceptance:
                h, current = proposal, candidate
    return h, acceptances


class HyperWalk:
    """Adaptive random-walk Metropolis on ``size`` coordinates of an exact, cheap log density.

    Parameters
    ----------
    size : int
        Number of coordinates moved.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.reset()

    def reset(self) -> None:
        """Return to the state before any tuning (a new chain)."""
        self.factor = np.eye(self.size) * FIRST_SD
        self.log_scale = 0.0
        self._window: list[np.ndarray] = []
        self._window_end = FIRST_WINDOW
        self._calls = 0

    def __call__(
        self,
        rng: np.random.Generator,
        h: np.ndarray,
        log_target: Callable[[np.ndarray], float],
        tune: bool,
        moves: WalkMoves | None = None,
    ) -> tuple[np.ndarray, HyperWalkInfo]:
        """Make :data:`MOVES` Metropolis steps from ``h``; tune while ``tune``.

        ``moves`` makes them in place of the Python loop over ``log_target``: a compiled walk
        of the same target that draws its own noise (``step_methods/fused_hyper_walk.py``).
        """
        scale = math.exp(self.log_scale)
        if moves is None:
            # Every move's increment and uniform drawn at once: they do not depend on the
            # chain's path, and a call moves at one scale (its adaptation applies from the
            # next call).
            increments = scale * (rng.standard_normal((MOVES, self.size)) @ self.factor.T)
            uniforms = rng.uniform(size=MOVES)
            h, acceptances = walk(h, log_target, increments, uniforms)
            accepted = int(np.count_nonzero(uniforms < acceptances))
        else:
            h, acceptances, accepted = moves(h, self.factor, scale)
        if tune:
            for acceptance in acceptances:
                self._adapt_scale(float(acceptance))
            self._adapt_covariance(h)
        return h, HyperWalkInfo(accepted / MOVES, scale)

    def _adapt_scale(self, acceptance: float) -> None:
        self.log_scale += (acceptance - TARGET_ACCEPTANCE) / math.sqrt(1.0 + self._calls)

    def _adapt_covariance(self, h: np.ndarray) -> None:
        self._calls += 1
        self._window.append(h.copy())
        if self._calls < self._window_end:
            return
        draws = np.asarray(self._window)
        n = draws.shape[0]
        covariance = np.atleast_2d(np.cov(draws, rowvar=False))
        # Shrunk towards a small diagonal, as Stan regularises its metric: weight 5 / (n + 5).
        covariance = (n / (n + 5.0)) * covariance + 1e-6 * (5.0 / (n + 5.0)) * np.eye(self.size)
        try:
            self.factor = np.linalg.cholesky(covariance) * (2.38 / math.sqrt(self.size))
            self.log_scale = 0.0
        except np.linalg.LinAlgError:
            pass  # a degenerate window (the chain did not move): keep the last proposal
        self._window = []
        self._window_end = self._calls + 2 * n

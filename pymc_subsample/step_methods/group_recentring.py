"""Where a group step expands the rows' likelihood: at a chain's start, moved towards the mode.

A mixin of :class:`~pymc_subsample.GroupEffectsMH` (``docs/architecture.md``, "Group
effects"): the expansion (``step_methods/group_expansion.py``) is taken at a point, and at a
chain's start that point first moves by capped Newton steps, one block of variables at a
time, each after a pass over the rows. The step decides when (its ``astep``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pymc_subsample.kernels.group_effects import model_derivatives, newton_gaussian
from pymc_subsample.kernels.hyper_walk import HyperWalk

if TYPE_CHECKING:
    from pymc_subsample.model.group_effects import GroupEffectFunctions
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.group_expansion import GroupExpansion

__all__ = [
    "NEWTON_MOVE",
    "SETTLED",
    "STALLED",
    "STALL_BELOW",
    "START_NEWTON_STEPS",
    "GroupRecentring",
]

#: Newton steps of the expansion point at a chain's start, at most, and the move (in
#: conditional sds) under which it stops.
START_NEWTON_STEPS = 12
SETTLED = 0.01
#: Once a round's largest move is under :data:`STALL_BELOW` sds, the start also stops when it
#: is not under :data:`STALLED` times the round's before: blocks that share a ridge (an
#: intercept and the crossed factors' effects it is confounded with) can settle into moving
#: each other back and forth by a few hundredths of an sd, round after round (on the crossed
#: benchmark model every round from the sixth moved 0.022, 0.017 and 0.005 sds, and all 12
#: rounds, 36 passes over 2e5 rows, took 8.7 s of a chain's start). The expansion is then
#: within that of the mode, and the chain's own draws recentre it at tuning draw 10.
STALL_BELOW = 1.0
STALLED = 0.5
#: Longest Newton move of an effect at a chain's start, in the variables' own
#: (unconstrained) units.
NEWTON_MOVE = 1.0


class GroupRecentring:
    """The expansion's moves of :class:`GroupEffectsMH`: to a point, or towards the mode."""

    # What the recentring reads of the step.
    expansion: GroupExpansion
    functions: GroupEffectFunctions
    oracles: ModelOracles
    _ridge_walks: list[HyperWalk]

    def _recentre(self, q: np.ndarray, newton_steps: int = 0) -> None:
        """Expand every group's likelihood around its current cells, or near its mode.

        With ``newton_steps``, the expansion point first moves by up to that many rounds of
        Newton steps, one block at a time (each factor's effects, then the shared
        coefficients), each after a pass over the rows at the point the last block left:
        blocks moved at once would each absorb the same misfit (an intercept and the groups'
        effects it is confounded with) and overshoot together. It stops once no block moved
        by more than :data:`SETTLED` of its conditional sd, or once the moves are small and
        stall (:data:`STALLED`): a chain's start is often far out, where the expansion would
        make poor proposals.
        """
        self.oracles.freeze_shared()
        point = q.copy()
        blocks: list[int | None] = [*range(len(self.functions.factors))]
        if self.functions.direct_coordinates.size:
            blocks.append(None)
        previous = math.inf
        for _ in range(newton_steps):
            largest = 0.0
            for block in blocks:
                self.expansion.expand(point)
                largest = max(largest, self._newton_block(point, block))
            if largest < SETTLED or STALLED * previous <= largest < STALL_BELOW:
                break
            previous = largest
        self.expansion.expand(point)
        if len(self._ridge_walks) != len(self.expansion.ridges):
            self._ridge_walks = [HyperWalk(1) for _ in self.expansion.ridges]

    def _newton_block(self, point: np.ndarray, block: int | None) -> float:
        """Move one block of ``point`` by a capped Newton step; its largest move in sds.

        A Newton step from far out can overshoot without bound (a log link's rows grow like
        the exponential of the move): at most :data:`NEWTON_MOVE` per coordinate.
        """
        assert self.expansion.quadratics is not None
        if block is None:
            coordinates = self.functions.direct_coordinates[None, :]
            gradient, hessian = self.expansion.shared_model(point)
            derivatives = (gradient[None], hessian[None])
        else:
            coordinates = self.functions.factors[block].coordinates
            derivatives = model_derivatives(
                self.expansion.parts(block, point), self.expansion.shifted(block, point)
            )
        x = point[coordinates]
        mode, _, values = newton_gaussian(x, *derivatives)
        step = mode - x
        longest = np.max(np.abs(step), axis=1, keepdims=True, initial=0.0)
        step = step * np.minimum(1.0, NEWTON_MOVE / np.maximum(longest, 1e-300))
        usable = np.isfinite(step).all(axis=1)
        point[coordinates[usable]] = x[usable] + step[usable]
        return float(np.max((np.abs(step) * np.sqrt(values))[usable], initial=0.0))

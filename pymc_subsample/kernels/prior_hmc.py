"""Exact Hamiltonian Monte Carlo on coordinates no row reads: a hierarchy's hyperparameters.

Given the group effects, a centred hierarchy's hyperparameters (the groups' mean and scale)
read no row at all: their conditional is the prior's, ``O(G)`` to evaluate. A draw is one
leapfrog trajectory (Neal 2011, eqs. 5.18-5.20) on those coordinates, in the coordinates
whitened by a diagonal mass, accepted by exact Metropolis-Hastings. During tuning the step size
follows dual averaging (Hoffman and Gelman 2014, section 3.2) and the mass is the draws'
variance over doubling windows (the windows of Stan's adaptation), after each of which the step
size's adaptation restarts. ``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_subsample.kernels.trajectory import (
    DualAveraging,
    HamiltonianProposal,
    dual_averaging_step,
    jittered_steps,
    start_dual_averaging,
)

__all__ = ["PriorHamiltonian", "PriorHMCInfo"]

#: Integration time in whitened coordinates: a quarter period of a unit Gaussian.
INTEGRATION_TIME = 0.5 * math.pi
#: Most leapfrog steps per trajectory.
MAX_STEPS = 64
#: Tuning draws at which a window of the mass adaptation ends (each twice the last).
FIRST_WINDOW = 50
#: Step size at the start of a chain.
FIRST_STEP_SIZE = 0.1
#: The acceptance rate the step size's adaptation aims at.
TARGET_ACCEPTANCE = 0.8


class PriorHMCInfo(NamedTuple):
    """What one trajectory did; the field names are the step's stat names."""

    hyper_accepted: bool
    hyper_n_steps: int
    hyper_step_size: float


class PriorHamiltonian:
    """HMC on ``size`` coordinates of an exact, cheap log density, with its own tuning.

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
        self.variance = np.ones(self.size)
        self.adaptation: DualAveraging = start_dual_averaging(FIRST_STEP_SIZE)
        self.step_size = FIRST_STEP_SIZE
        self._window: list[np.ndarray] = []
        self._window_end = FIRST_WINDOW
        self._draws = 0

    def __call__(
        self,
        rng: np.random.Generator,
        x: np.ndarray,
        log_density: Callable[[np.ndarray], float],
        gradient: Callable[[np.ndarray], np.ndarray],
        tune: bool,
    ) -> tuple[np.ndarray, PriorHMCInfo]:
        """One trajectory from ``x``, accepted exactly; tunes itself while ``tune``."""
        step_size = math.exp(self.adaptation.log_step) if tune else self.step_size
        n_steps = jittered_steps(rng, step_size, INTEGRATION_TIME, MAX_STEPS)
        proposal = HamiltonianProposal(self.size, self.variance)
        x_new, kinetic, info = proposal(rng, x, step_size, n_steps, gradient)
        with np.errstate(all="ignore"):
            log_ratio = log_density(x_new) - log_density(x) + kinetic
        acceptance = 0.0 if not math.isfinite(log_ratio) else min(1.0, math.exp(log_ratio))
        accepted = bool(rng.uniform() < acceptance)
        result = x_new if accepted else x
        if tune:
            self._tune(result, acceptance)
        return result, PriorHMCInfo(accepted, info.n_steps, step_size)

    def _tune(self, x: np.ndarray, acceptance: float) -> None:
        self.adaptation = dual_averaging_step(self.adaptation, acceptance, TARGET_ACCEPTANCE)
        self.step_size = math.exp(self.adaptation.log_step_mean)
        self._draws += 1
        self._window.append(x.copy())
        if self._draws >= self._window_end:
            draws = np.asarray(self._window)
            n = draws.shape[0]
            # Stan's regularised variance: shrunk towards 1e-3 with weight 5 / (n + 5).
            self.variance = (n / (n + 5.0)) * draws.var(axis=0) + 1e-3 * (5.0 / (n + 5.0))
            self._window = []
            self._window_end = self._draws + 2 * n
            self.adaptation = start_dual_averaging(self.step_size)

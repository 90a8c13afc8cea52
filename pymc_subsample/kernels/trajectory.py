"""Hamiltonian trajectories as a Metropolis-Hastings proposal on a gradient estimate.

A leapfrog trajectory (Neal 2011, "MCMC using Hamiltonian dynamics", eqs. 5.18-5.20) of
``n_steps`` steps of size ``step_size`` from ``(q, p)``, ``p ~ N(0, M)``, followed by a flip of
the momentum, is a deterministic involution that preserves volume, whatever the gradient
function that drives it, as long as that function is fixed during the trajectory. Its
Metropolis-Hastings acceptance is then ``pi(q') / pi(q)`` times ``exp(K(p) - K(p'))``: the log
proposal ratio is the kinetic energies' difference, which the subsampled tests fold into their
threshold like any proposal's (Korattikara et al. 2016, eq. 22). So the gradient may be a
minibatch estimate drawn once per trajectory, independently of the state (each minibatch's map
is an involution, and the chain keeps detailed balance for each, hence for their mixture): its
noise lowers the acceptance, never the correctness. This is where the step departs from
HMCECS (Dang et al. 2019), which accepts on a subsampled estimate of the energy (a perturbed
target): here the step's own test decides on the log posterior's difference.

The trajectory runs in whitened coordinates ``x = L^{-1} q`` with ``L L^T = M^{-1}`` (the
proposal covariance: the Laplace covariance at the reference point, or the diagonal adapted
during tuning), where ``p ~ N(0, I)``. See ``docs/architecture.md`` ("Proposals").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from pymc_subsample.kernels.proposals import _cholesky_factor, _times_factor

__all__ = [
    "DualAveraging",
    "HamiltonianProposal",
    "TrajectoryInfo",
    "dual_averaging_step",
    "jittered_steps",
    "leapfrog",
    "start_dual_averaging",
]

#: ``gradient(q)``: an estimate of the gradient of the log target at ``q``, fixed during one
#: trajectory.
Gradient = Callable[[np.ndarray], np.ndarray]


class TrajectoryInfo(NamedTuple):
    """What one trajectory did.

    Attributes
    ----------
    n_steps : int
        Leapfrog steps taken (the gradient was evaluated ``n_steps + 1`` times).
    diverging : bool
        The position, momentum, gradient or kinetic energy became non-finite: the proposal is
        rejected.
    """

    n_steps: int
    diverging: bool


class HamiltonianProposal:
    """A leapfrog trajectory with momentum ``p ~ N(0, M)``, ``M^{-1} = L L^T = proposal_cov``.

    Parameters
    ----------
    n_params : int
        Length of ``q``.
    proposal_cov : array_like, optional
        The inverse mass matrix: a vector of variances or a (d, d) SPD matrix (the posterior's
        covariance, ideally). Defaults to the identity.

    Examples
    --------
    On a standard normal target a quarter-period trajectory maps ``(q, p)`` to ``(p, -q)``, so
    the log ratio ``|p|^2 / 2 - |p'|^2 / 2`` is ``(q'^2 - q^2) / 2``:

    >>> proposal = HamiltonianProposal(1)
    >>> rng = np.random.default_rng(0)
    >>> q_new, log_ratio, info = proposal(rng, np.array([1.0]), 0.01, 157, lambda q: -q)
    >>> bool(abs(log_ratio - (q_new[0] ** 2 - 1.0) / 2) < 1e-3), info.n_steps
    (True, 157)
    """

    def __init__(self, n_params: int, proposal_cov: ArrayLike | None = None) -> None:
        self.n_params = n_params
        self.chol_factor = _cholesky_factor(n_params, proposal_cov)

    def __call__(
        self,
        rng: np.random.Generator,
        q: np.ndarray,
        step_size: float,
        n_steps: int,
        gradient: Gradient,
    ) -> tuple[np.ndarray, float, TrajectoryInfo]:
        """Return ``q'``, the log proposal ratio ``K(p) - K(p')``, and the trajectory's info.

        The ratio is ``-inf`` (a certain rejection) when the trajectory diverges.
        """
        momentum = rng.standard_normal(self.n_params)
        position, final, diverged_at = leapfrog(
            q, momentum, step_size, n_steps, gradient, self.chol_factor
        )
        with np.errstate(all="ignore"):
            log_ratio = 0.5 * (float(momentum @ momentum) - float(final @ final))
        if diverged_at or not math.isfinite(log_ratio):
            return position, -math.inf, TrajectoryInfo(diverged_at or n_steps, True)
        return position, log_ratio, TrajectoryInfo(n_steps, False)


def leapfrog(
    q: np.ndarray,
    momentum: np.ndarray,
    step_size: float,
    n_steps: int,
    gradient: Gradient,
    factor: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``n_steps`` leapfrog steps (Neal 2011, eqs. 5.18-5.20) in whitened coordinates.

    With ``q = L x`` (``factor`` is ``L``: a vector for a diagonal one) and ``p ~ N(0, I)``,
    the force on ``x`` is ``L^T grad log pi(q)``. Reversible: from the returned position with
    the returned momentum negated, the same steps lead back to ``q`` and ``-momentum``.

    Returns
    -------
    position : ndarray
        The end point ``q'``.
    momentum : ndarray
        The end momentum (not negated).
    diverged_at : int
        0, or the step (from 1) at which the position, momentum or gradient became non-finite.
    """

    def force(position: np.ndarray) -> np.ndarray:
        g = gradient(position)
        return factor * g if factor.ndim == 1 else factor.T @ g

    position = q.copy()
    with np.errstate(all="ignore"):
        momentum = momentum + 0.5 * step_size * force(position)
        for step in range(n_steps):
            position = position + step_size * _times_factor(factor, momentum)
            last = step == n_steps - 1
            momentum = momentum + (0.5 if last else 1.0) * step_size * force(position)
            if not (np.all(np.isfinite(momentum)) and np.all(np.isfinite(position))):
                return position, momentum, step + 1
    return position, momentum, 0


def jittered_steps(
    rng: np.random.Generator, step_size: float, integration_time: float, max_steps: int
) -> int:
    """Leapfrog steps for an integration time jittered uniformly in [0.5, 1.5] times its value.

    A fixed trajectory length can fall on a period of the dynamics and stop moving in some
    direction; jittering it (Neal 2011, section 5.4.2.2) avoids that.
    """
    time = integration_time * rng.uniform(0.5, 1.5)
    return int(min(max_steps, max(1, math.ceil(time / step_size))))


class DualAveraging(NamedTuple):
    """State of the dual-averaging step-size adaptation (Hoffman and Gelman 2014, section 3.2).

    Attributes
    ----------
    iteration : int
        Adaptation steps taken (``t``).
    error_mean : float
        Running mean of ``target - acceptance`` (``H_bar``).
    log_step : float
        The log step size to use next (``log eps_t``).
    log_step_mean : float
        The weighted average of the log step sizes (``log eps_bar``): the step size after tuning.
    shrink_to : float
        ``mu = log(10 eps_0)``, where the iterates are shrunk towards.
    """

    iteration: int
    error_mean: float
    log_step: float
    log_step_mean: float
    shrink_to: float


def start_dual_averaging(step_size: float) -> DualAveraging:
    """Start an adaptation at ``step_size``."""
    log_step = math.log(step_size)
    return DualAveraging(0, 0.0, log_step, log_step, math.log(10.0 * step_size))


def dual_averaging_step(
    state: DualAveraging,
    acceptance: float,
    target: float = 0.8,
    gamma: float = 0.05,
    t0: float = 10.0,
    kappa: float = 0.75,
) -> DualAveraging:
    """One update of Hoffman and Gelman (2014), eq. 6, with their default constants.

    ``acceptance`` is the draw's acceptance probability, or its 0/1 decision where the test
    gives only that (an unbiased, noisier signal of the same quantity).
    """
    t = state.iteration + 1
    weight = 1.0 / (t + t0)
    error_mean = (1.0 - weight) * state.error_mean + weight * (target - acceptance)
    log_step = state.shrink_to - math.sqrt(t) / gamma * error_mean
    eta = t ** (-kappa)
    log_step_mean = eta * log_step + (1.0 - eta) * state.log_step_mean
    return DualAveraging(t, error_mean, log_step, log_step_mean, state.shrink_to)

"""SGFS's checks: the spread predicted at the end of tuning, and each chain's own ESS.

At the end of tuning (:func:`check_spread`) the step predicts its stationary covariance near the
mode from the Fisher average in use and the scores' covariance over the last half of tuning
(``kernels.sgfs.stationary_covariance``) and warns when it is off, or when tuning ended still far
from the mode. After tuning, :class:`ChainESS` estimates each chain's effective sample size
from its own draws and warns when it is too small for the draws' spread to be trusted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from pymc_subsample.kernels.control_variates import mahalanobis_limit
from pymc_subsample.kernels.sgfs import (
    largest_step_size_within,
    sgfs_gamma,
    stationary_covariance,
    stationary_sd_ratios,
)
from pymc_subsample.warnings import warn_user

__all__ = [
    "ESS_CHECK_EVERY",
    "MIN_ESS",
    "SPREAD_TOLERANCE",
    "ChainESS",
    "check_chain_ess",
    "check_preconditioner",
    "check_spread",
    "check_step_size",
    "warn_low_ess",
]

#: Warn when the predicted stationary sd is off by more than this factor in some direction.
SPREAD_TOLERANCE = 1.1
#: Warn when a chain's effective sample size after tuning is below this, in some coordinate.
#: PyMC's own convergence check asks 100 per chain. With 100 effective draws an sd is estimated
#: to about 7% (1 standard error, ``1 / sqrt(2 ESS)``) and a mean to 0.1 sd; with the 6 to 23 of
#: SGFS's former defaults per 5,000 draws the covariance error E2 was 0.56-0.99 (issue 37).
MIN_ESS = 100.0
#: Without a known number of draws (PyMC 5), check after every this many draws past tuning.
ESS_CHECK_EVERY = 1000


class ChainESS:
    """One chain's effective sample size after tuning, from O(d) running sums.

    Each coordinate is taken as a first-order autoregression, ``ESS = n (1 - r) / (1 + r)``
    with ``r`` its lag-1 autocorrelation. Near a Gaussian mode SGFS *is* one: eq. 11 is the
    linear recursion ``q' - q0 = (1 - A P)(q - q0) + noise`` (``kernels.sgfs``), and with the
    default preconditioner ``B`` proportional to ``I_hat`` its transition is a multiple of the
    identity, the same ``r`` in every direction. A chain still drifting gives ``r`` near 1.
    The sums are shifted by the first draw, so that a chain far from 0 loses no precision.
    """

    def __init__(self) -> None:
        self.reset(None)

    def reset(self, draws: int | None) -> None:
        """Start a chain that will make ``draws`` draws after tuning (None: unknown)."""
        self.draws = draws
        self.count = 0
        self.warned = False
        self._shift: np.ndarray | None = None
        self._sums: np.ndarray | None = None  # rows: x, x^2, x_t x_{t-1}, first x, last x

    def record(self, q: np.ndarray) -> bool:
        """Add a draw; return True when the chain should be checked now.

        That is at its last draw when the number of draws is known (PyMC 6), else after every
        :data:`ESS_CHECK_EVERY` draws.
        """
        if self._shift is None or self._sums is None:
            self._shift = q.copy()
            self._sums = np.zeros((5, q.size))
        x = q - self._shift
        sums = self._sums
        sums[0] += x
        sums[1] += x * x
        if self.count > 0:
            sums[2] += x * sums[4]
        else:
            sums[3] = x
        sums[4] = x
        self.count += 1
        if self.draws is not None:
            return self.count == self.draws
        return self.count % ESS_CHECK_EVERY == 0

    def ess(self) -> float:
        """Smallest AR(1) effective sample size over the coordinates (inf if all constant)."""
        n = self.count
        if n < 3 or self._sums is None:
            return float("inf")
        total, squares, lagged, first, last = self._sums
        mean = total / n
        variance = squares - n * mean**2
        # sum_{t>=2} (x_t - m)(x_{t-1} - m)
        cross = lagged - mean * (2.0 * total - first - last) + (n - 1) * mean**2
        varying = variance > 1e-300 * np.maximum(squares, 1e-300)
        if not np.any(varying):
            return float("inf")
        r = np.clip(cross[varying] / variance[varying], -0.999, 0.999)
        return float(min(n, float(np.min(n * (1.0 - r) / (1.0 + r)))))


def check_chain_ess(
    monitor: ChainESS,
    *,
    control: bool,
    n_rows: int,
    batch_size: int,
    others_in_rows: bool,
    reference_found: bool,
) -> None:
    """Warn once per chain when its own ESS is below :data:`MIN_ESS` (SGFS's Warns section).

    ``monitor`` is the chain's; ``control`` whether the step's gradient carries its control
    variate, ``others_in_rows`` whether the rows read variables the step does not sample, and
    ``reference_found`` whether it has a reference point (its advice depends on these).
    """
    ess = monitor.ess()
    if monitor.warned or ess >= MIN_ESS:
        return
    monitor.warned = True
    if control:
        advice = "a larger step_size (up to 4, where the mean jumps to the mode each step)"
    else:
        per_draw = f"about N/n = {n_rows / batch_size:.0f} steps per effective draw"
        fix = (
            "sample the variables the rows read with this step (vars=None) so that its "
            "control variate applies"
            if others_in_rows
            else "start='reference' (the default) with its control variate"
            if not reference_found
            else "control_variate='taylor1' at its default step size (about one effective "
            "draw per two steps)"
        )
        advice = f"{fix}; without one SGFS needs {per_draw}; or a larger batch_size"
    warn_low_ess(ess, monitor.count, advice)


def warn_low_ess(ess: float, draws: int, advice: str) -> None:
    """Warn that a chain's ESS of ``ess`` over ``draws`` draws is below :data:`MIN_ESS`."""
    needed = int(np.ceil(MIN_ESS / max(ess, 1e-3) * draws / 1000.0) * 1000)
    warn_user(
        f"SGFS's chain has an effective sample size of only {ess:.0f} over its {draws} draws "
        f"after tuning (lag-1 autocorrelation of its own draws, smallest over coordinates; "
        f"{MIN_ESS:.0f} is needed for sds within about 7% and means within 0.1 sd): its "
        f"spread and means cannot be trusted yet. Use about {needed} draws, or {advice}.",
        topic="sgfs-low-ess",
    )


def check_spread(
    score_blocks: list[np.ndarray],
    fisher: np.ndarray | None,
    step_size: float,
    posterior_precision: Callable[[np.ndarray], np.ndarray],
    *,
    control: bool,
    noise: np.ndarray | None,
    n_rows: int,
    batch_size: int,
    preconditioner: np.ndarray | None,
    reference_found: bool,
    diagonal: bool,
) -> tuple[float, float] | None:
    """Run the end-of-tuning checks of :class:`~pymc_subsample.SGFS` (its Warns section).

    Read from the step: its tuning's ``score_blocks``, the Fisher average in use, the step
    size at the end of tuning, its posterior curvature given the scores' covariance, whether
    its gradient carries the control variate (and that variate's noise average), N, the batch,
    its preconditioner, whether it has a reference point and whether its Fisher is diagonal.
    Return the predicted stationary sds' smallest and largest ratio to the posterior's (None
    where they were not predicted).
    """
    blocks = score_blocks[len(score_blocks) // 2 :]
    if fisher is None or not blocks:
        return None
    total = np.sum(blocks, axis=0)
    count = float(total[-1, 0])
    d = total.shape[1]
    scores, force = total[:d] / count, total[-2] / count
    differences = total[d : 2 * d] / count if control else None
    precision = posterior_precision(scores)
    noise = noise if control else None
    try:
        predicted = stationary_covariance(
            fisher,
            scores,
            n_rows,
            batch_size,
            step_size,
            preconditioner,
            precision,
            noise,
            differences,
        )
        ratios = stationary_sd_ratios(predicted, precision)
    except np.linalg.LinAlgError:
        return None  # a singular score covariance: the Fisher check of the factors says so
    noisy = scores if differences is None else differences
    far = _warn_if_far(
        force,
        precision,
        count,
        noisy,
        step_size,
        n_rows=n_rows,
        batch=batch_size,
        control=control,
        reference_found=reference_found,
    )
    if far:
        return ratios
    if 1.0 / SPREAD_TOLERANCE <= ratios[0] and ratios[1] <= SPREAD_TOLERANCE:
        return ratios
    advice = "lower step_size"
    within = largest_step_size_within(
        SPREAD_TOLERANCE,
        step_size,
        fisher,
        scores,
        n_rows,
        batch_size,
        preconditioner,
        precision,
        noise,
        differences,
    )
    if within is not None:
        slower = (1.0 + 4.0 / within) / (1.0 + 4.0 / step_size)
        advice = (
            f"step_size={within:.3g} brings it within {SPREAD_TOLERANCE - 1:.0%} "
            f"(mixing about {slower:.2g}x slower)"
        )
    start = (
        "start='reference' (the default) so that the average begins near the mode"
        if not reference_found
        else "fisher='full'"
        if diagonal
        else "more tuning draws"
    )
    warn_user(
        "SGFS's stationary sds are predicted to be "
        f"{ratios[0]:.2f}x to {ratios[1]:.2f}x the posterior's (Gaussian at the mode) over "
        "directions: its noise correction (Ahn et al. 2012, eq. 8) assumes "
        "the Fisher average I_hat equals the covariance of the scores and the posterior's "
        f"curvature over N, and over the last half of tuning it did not. Use {start}, or {advice}."
    )
    return ratios


def _warn_if_far(
    force: np.ndarray,
    precision: np.ndarray,
    count: float,
    noisy: np.ndarray,
    step_size: float,
    *,
    n_rows: int,
    batch: int,
    control: bool,
    reference_found: bool,
) -> bool:
    """Warn (and return True) if the last half of tuning was still far from the mode.

    Near the mode the force of eq. 11 (without its noise) is ``-P (q - q0) + phi`` with
    ``P`` the posterior precision (the reference's curvature, else ``N J``) and ``phi`` the
    minibatch noise, of covariance ``N^2 V / n`` (eq. 6; ``V = J`` the scores' covariance, or
    the control variate's differences'). Its mean over the ``T`` steps of the window, ``f``,
    estimates ``-P (q_bar - q0)``: ``f^T P^-1 f / (1 + N / (n T))`` is then at most about
    chi-square(d) for a stationary chain (``q_bar`` is no farther from the mode than a draw,
    and the noise's mean adds at most ``N / (n T)`` per dimension), far more for a chain still
    approaching the mode, whose draws are then spread along its path (``start="initial"`` on a
    linear regression: sds up to 15x too wide) or stuck (a tiny step size).
    """
    excess = float(np.linalg.eigvals(np.linalg.solve(precision, n_rows * noisy)).real.max())
    noise_share = 1.0 + n_rows / (batch * count) * max(excess, 1.0)
    distance_sq = float(force @ np.linalg.solve(precision, force)) / noise_share
    if distance_sq <= mahalanobis_limit(force.size):
        return False
    # Steps per effective sample, (2 - c) / c, for the contraction c = 2 / (s (1 + 4 / eps)) of
    # the default B, with s = gamma (eq. 8) or about 1 with the control variate.
    scale = 1.0 if control else sgfs_gamma(n_rows, batch)
    contraction = min(2.0 / (scale * (1.0 + 4.0 / step_size)), 1.0)
    per_sample = (2.0 - contraction) / contraction
    warn_user(
        "SGFS had not reached its stationary distribution when tuning ended: over the last "
        f"half of tuning the chain was about {np.sqrt(distance_sq):.3g} posterior sds from "
        "the mode (by its mean gradient and the posterior's curvature), where a stationary "
        "chain is a few; its draws will still be approaching the mode. "
        + ("Use start='reference' (the default), or " if not reference_found else "Use ")
        + f"more tuning draws (near the mode it needs about {per_sample:.3g} steps per "
        "effective sample; a larger step_size needs fewer)."
    )
    return True


def check_step_size(step_size: float | None, schedule: Callable[[int], float] | None) -> float:
    """Return the given step size (1 if None; NaN with a schedule), or raise if invalid."""
    if schedule is not None:
        if step_size is not None:
            raise ValueError("Give step_size or step_size_schedule, not both.")
        if not callable(schedule):
            raise TypeError("step_size_schedule must be a callable t -> step size.")
        return math.nan
    value = 1.0 if step_size is None else float(step_size)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"step_size must be a positive finite number, got {step_size!r}.")
    return value


def check_preconditioner(
    preconditioner: ArrayLike | None, n_params: int, diagonal: bool
) -> np.ndarray | None:
    """Return B as a float array of the expected shape (None if not given), or raise."""
    if preconditioner is None:
        return None
    matrix = np.asarray(preconditioner, dtype=float)
    expected = (n_params,) if diagonal else (n_params, n_params)
    if matrix.shape != expected:
        raise ValueError(
            f"preconditioner must have shape {expected} for fisher="
            f"{'diagonal' if diagonal else 'full'} and {n_params} parameters, got {matrix.shape}."
        )
    if diagonal:
        if not np.all(matrix > 0):
            raise ValueError("preconditioner must hold positive values for fisher='diagonal'.")
        return matrix
    if not np.allclose(matrix, matrix.T) or np.any(np.linalg.eigvalsh(matrix) <= 0):
        raise ValueError("preconditioner must be symmetric positive definite (SPD).")
    return matrix

"""SGFS: stochastic gradient Fisher scoring (Ahn, Korattikara and Welling 2012) as a PyMC step."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.blocking import RaveledVars
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.control_variates import mahalanobis_limit
from pymc_subsample.kernels.sgfs import (
    SGFSFactors,
    empirical_fisher,
    largest_step_size_within,
    sgfs_factors,
    sgfs_step,
    stationary_covariance,
    stationary_sd_ratios,
    update_fisher_average,
)
from pymc_subsample.reference import automatic_reference
from pymc_subsample.step_methods.base import SubsampleStepBase, _check_choice
from pymc_subsample.step_methods.control import reference_vector
from pymc_subsample.step_methods.sgfs_start import ReferenceFisher, reference_fisher
from pymc_subsample.warnings import warn_user

__all__ = ["SGFS", "PolynomialStepSize"]

#: Default step size when the chains start at a reference point: the contraction per step near
#: the mode, ``2 / (gamma (1 + 4 / eps))``, is then 91% of its large-step limit ``2 / gamma``,
#: and the chain samples the Bernstein-von Mises Gaussian that the reference search checked
#: (docs/sgfs.md, "Defaults").
REFERENCE_STEP_SIZE = 40.0
#: Step size without a reference point (the chain may start far from the mode).
INITIAL_STEP_SIZE = 1.0
#: Warn when the predicted stationary sd is off by more than this factor in some direction.
SPREAD_TOLERANCE = 1.1
#: Tuning draws per block of score covariances; the check uses the last half of the blocks.
_SPREAD_BLOCK = 50


@dataclass(frozen=True)
class PolynomialStepSize:
    """Step-size schedule ``a (b + t)^(-c)`` for step t = 1, 2, ... (Welling and Teh 2011).

    Pass it as ``SGFS(step_size_schedule=PolynomialStepSize(a, b, c))``; nothing is annealed
    unless you ask for it.

    Examples
    --------
    >>> PolynomialStepSize(a=1.0, b=9.0, c=0.5)(1)
    0.31622776601683794
    """

    a: float
    b: float
    c: float

    def __call__(self, t: int) -> float:
        """Step size at step t."""
        return self.a * (self.b + t) ** (-self.c)


@dataclass_state
class SGFSState(StepMethodState):
    """Adaptive state restored before each sequential chain."""

    fisher: np.ndarray | None
    fisher_count: int
    step_count: int
    tune: bool


class SGFS(SubsampleStepBase):
    r"""Stochastic Gradient Fisher Scoring on a minibatch of rows per step.

    Algorithm 1 of Ahn, Korattikara and Welling (ICML 2012). Each step draws ``batch_size``
    rows uniformly with replacement (the i.i.d. minibatch that the paper's gamma assumes),
    computes their per-row gradients (vectorised, no Scan), updates
    the online average ``I_hat`` of their empirical covariance (``kappa_t = 1/t``) and moves

    ``q' = q + 2 (gamma N I_hat + 4 B / eps)^{-1} (grad log prior + N g_bar + eta)``

    with ``gamma = (N + n) / n`` and ``eta ~ N(0, 4 B / eps)``. There is no accept/reject step.

    Parameters
    ----------
    vars : list of variables, optional
        Continuous variables to sample; every one must enter the row likelihood (the Fisher
        information of a prior-only variable is zero). Sample others with another step.
    batch_size : int, default 500
        Rows per step (n), between 2 and N; the paper recommends more than 100 for the CLT.
    step_size : float, optional
        The paper's epsilon (``alpha = 2 / sqrt(eps)`` in its experiments). Large steps sample
        the Bernstein-von Mises Gaussian approximation of the posterior; small steps behave
        like preconditioned SGLD, whose bias vanishes only as the step goes to 0. Default
        :data:`REFERENCE_STEP_SIZE` (40) when the chains start at a reference point (the
        default ``start``; the automatic search checks that the posterior is close to that
        Gaussian there), where the contraction per step is within 10% of its large-step
        limit; else 1.
    fisher : {"full", "diagonal"}, default "full"
        SGFS-f or SGFS-d (diagonal ``I_hat``; exact only at small step sizes).
    preconditioner : array_like, optional
        B: a (d, d) SPD matrix ("full") or a vector of d positive values ("diagonal"). Default
        ``gamma N I_hat``, the paper's recommendation.
    step_size_schedule : callable, optional
        ``t -> eps_t`` for t = 1, 2, ..., for example :class:`PolynomialStepSize`. Replaces
        ``step_size``; none is applied unless given.
    adapt_fisher : {"tune", "always"}, default "tune"
        Average ``I_hat`` during tuning only (then frozen, the variant with a valid-chain
        argument) or at every step (the paper's Algorithm 1).
    start : {"reference", "initial"}, default "reference"
        ``"reference"``: find a point near the posterior mode (``reference_point``, or the
        automatic search of :func:`pymc_subsample.find_reference_point`, once per model and
        data), start each chain whose first point is beyond the chi-square(d) 1 - 1e-6
        Mahalanobis limit there at a draw from ``N(q*, (N I*)^-1)``, and start the Fisher
        average at the empirical Fisher information ``I*`` of up to 10,000 rows there,
        weighted as that many rows' worth of minibatches. If the search fails the step says
        why once and starts as with ``"initial"``: where ``pm.sample`` starts, the Fisher
        average from the first minibatch (far from the mode that average is wrong, and the
        stationary spread it gives with it: sds up to 4x too wide on a linear regression).
    reference_point : dict or ReferencePoint, optional
        As for :class:`~pymc_subsample.AusterityMH`.
    obs_dim, model, rng, compile_kwargs
        As for :class:`~pymc_subsample.AusterityMH`.

    Warns
    -----
    SubsampleWarning
        At the end of tuning, (1) when the last half of tuning was still far from the mode
        (its mean gradient, whitened by the posterior's curvature, beyond the chi-square(d)
        1 - 1e-6 limit): the draws would still be approaching it; or (2) when the stationary
        sds predicted from the Fisher average in use, the scores' covariance over the last
        half of tuning and the curvature (``kernels.sgfs.stationary_covariance``) differ from
        the posterior's Gaussian sds at the mode by more than 10% in some direction: the
        paper's bias at large step size when ``I_hat`` is not the scores' covariance. The
        message names the knob (the start, more tuning, ``fisher="full"``, the step size that
        brings it within 10%).

    Notes
    -----
    The Fisher average and the step counter are per-chain state: they restart for every chain.
    SGFS contracts towards the mode by about ``2 n / N`` per step at large step size, so it
    needs of the order of N/n steps per effective sample and a start near the mode, which
    ``start="reference"`` (the default) gives it.

    **Stats** recorded for every draw (in ``sample_stats``):

    n_data : int64
        Rows used (``batch_size``).
    step_size : float64
        The epsilon used for this draw.
    condition_number : float64
        Condition number of ``gamma N I_hat + 4 B / eps``, the preconditioner of the update.
    nonfinite_update : bool
        The update was not finite (for example a step size far too large); the point was kept.
    """

    name = "sgfs"
    stats_dtypes_shapes: ClassVar[dict[str, tuple[type, list[int]]]] = {
        "n_data": (np.int64, []),
        "step_size": (np.float64, []),
        "condition_number": (np.float64, []),
        "nonfinite_update": (bool, []),
    }
    _state_class = SGFSState

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None = None,
        *,
        batch_size: int = 500,
        step_size: float | None = None,
        fisher: str = "full",
        preconditioner: ArrayLike | None = None,
        step_size_schedule: Callable[[int], float] | None = None,
        adapt_fisher: str = "tune",
        start: str = "reference",
        reference_point: Any = None,
        obs_dim: str | None = None,
        model: pm.Model | None = None,
        rng: RandomGenerator = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
    ) -> None:
        self._given_step_size = _check_step_size(step_size, step_size_schedule)
        self.step_size_schedule = step_size_schedule
        self.diagonal = _check_choice("fisher", fisher, ("full", "diagonal")) == "diagonal"
        self.adapt_always = (
            _check_choice("adapt_fisher", adapt_fisher, ("tune", "always")) == "always"
        )
        self.start = _check_choice("start", start, ("reference", "initial"))
        if reference_point is not None and self.start != "reference":
            raise ValueError("reference_point is where chains start: pass start='reference'.")
        self._reference_point = reference_point
        super().__init__(
            vars,
            batch_size=batch_size,
            obs_dim=obs_dim,
            model=model,
            rng=rng,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
            with_gradients=True,
        )
        if self.batch_size > self.n_rows:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than the N={self.n_rows} rows; "
                "use at most N (and more than about 100 for the CLT behind SGFS)."
            )
        self.preconditioner = _check_preconditioner(
            preconditioner, self.oracles.n_params, self.diagonal
        )
        #: Why the chains do not start at the reference point by default ("" if they do).
        self.dropped_default = ""
        self._reference: ReferenceFisher | None = None
        if self.start == "reference":
            self._reference = self._find_reference()
        self.step_size = self._given_step_size
        if step_size is None and step_size_schedule is None:
            self.step_size = INITIAL_STEP_SIZE if self._reference is None else REFERENCE_STEP_SIZE
        # Score covariances of the tuning draws, summed in blocks: the spread check reads the
        # last half of them at the end of tuning.
        self._score_blocks: list[np.ndarray] = []
        self._tune_count = 0
        #: Smallest and largest predicted stationary sd over the Bernstein-von Mises sd, over
        #: directions, at the end of the last tuning (NaN before).
        self.predicted_sd_ratios = (float("nan"), float("nan"))
        self.tune = True
        self.fisher: np.ndarray | None = None
        self.fisher_count = 0
        self.step_count = 0
        self._start_near_reference = False
        # Factorisations of M and B for (the Fisher array object, step size): reused while
        # both stay the same (after tuning, at a fixed step size). Every Fisher update and
        # every state restore makes a new array, so identity is a safe key.
        self._factors: tuple[np.ndarray, float, SGFSFactors] | None = None

    def _find_reference(self) -> ReferenceFisher | None:
        """Find the reference point and the Fisher information there; None (and why) if not."""
        if self._reference_point is None:
            optimum = automatic_reference(self.oracles, self._funnel)
            if optimum.failure is not None:
                self.dropped_default = f"the search for a reference point failed: {optimum.failure}"
                warn_user(
                    "SGFS starts its chains where pm.sample does and averages the Fisher "
                    f"information from there, not at a reference point: {self.dropped_default}."
                )
                return None
            q_ref = optimum.q
            hessian_sum = None if optimum.row_sums is None else optimum.row_sums[1]
        else:
            q_ref = reference_vector(self._reference_point, self.vars, self._initial_point)
            hessian_sum = None  # measuring it would cost a data pass: N J stands in
        return reference_fisher(self.oracles, q_ref, self.batch_size, self.diagonal, hessian_sum)

    def _rebuild_for_data(self) -> None:
        # The cached factorisations hold N (pm.set_data to another number of rows), and the
        # reference point and its Fisher information are those of the old data.
        self._factors = None
        if self._reference is not None:
            self._reference = self._find_reference()

    def reset_tuning(self) -> None:
        """Restart the Fisher average (at the reference's, if any) and the step counter."""
        self.fisher, self.fisher_count, self.step_count = None, 0, 0
        if self._reference is not None:
            self.fisher = self._reference.fisher
            self.fisher_count = self._reference.weight
        self._start_near_reference = self._reference is not None
        self._factors = None
        self._score_blocks = []
        self._tune_count = 0

    def stop_tuning(self) -> None:
        """End tuning; warn if the stationary spread predicted from it is off (class docs)."""
        if self.tune:
            self._check_spread()
        super().stop_tuning()

    def _check_spread(self) -> None:
        blocks = self._score_blocks[len(self._score_blocks) // 2 :]
        if self.fisher is None or not blocks:
            return
        total = np.sum(blocks, axis=0)
        count = float(total[-1, 0])
        scores, force = total[:-2] / count, total[-2] / count
        step_size = self._step_size(max(self.step_count, 1))
        precision = self._posterior_precision(scores)
        try:
            predicted = stationary_covariance(
                self.fisher,
                scores,
                self.n_rows,
                self.batch_size,
                step_size,
                self.preconditioner,
                precision,
            )
            ratios = stationary_sd_ratios(predicted, precision)
        except np.linalg.LinAlgError:
            return  # a singular score covariance: the Fisher check of the factors says so
        self.predicted_sd_ratios = ratios
        if self._warn_if_far(force, precision, count, scores, step_size):
            return
        if 1.0 / SPREAD_TOLERANCE <= ratios[0] and ratios[1] <= SPREAD_TOLERANCE:
            return
        advice = "lower step_size"
        within = largest_step_size_within(
            SPREAD_TOLERANCE,
            step_size,
            self.fisher,
            scores,
            self.n_rows,
            self.batch_size,
            self.preconditioner,
            precision,
        )
        if within is not None:
            slower = (1.0 + 4.0 / within) / (1.0 + 4.0 / step_size)
            advice = (
                f"step_size={within:.3g} brings it within {SPREAD_TOLERANCE - 1:.0%} "
                f"(mixing about {slower:.2g}x slower)"
            )
        start = (
            "start='reference' (the default) so that the average begins near the mode"
            if self._reference is None
            else "fisher='full'"
            if self.diagonal
            else "more tuning draws"
        )
        warn_user(
            "SGFS's stationary sds are predicted to be "
            f"{ratios[0]:.2f}x to {ratios[1]:.2f}x the posterior's (Gaussian at the mode) over "
            "directions: its noise correction gamma N I_hat (Ahn et al. 2012, eq. 8) assumes "
            "the Fisher average I_hat equals the covariance of the scores, and over the last "
            f"half of tuning it did not. Use {start}, or {advice}."
        )

    def _warn_if_far(
        self,
        force: np.ndarray,
        precision: np.ndarray,
        count: float,
        scores: np.ndarray,
        step_size: float,
    ) -> bool:
        """Warn (and return True) if the last half of tuning was still far from the mode.

        Near the mode the force of eq. 11 (without its noise) is ``-P (q - q0) + phi`` with
        ``P`` the posterior precision (the reference's curvature, else ``N J``) and ``phi`` the
        minibatch noise, of covariance ``N^2 J / n`` (eq. 6). Its
        mean over the ``T`` steps of the window, ``f``, estimates ``-P (q_bar - q0)``:
        ``f^T P^-1 f / (1 + N / (n T))`` is then at most about chi-square(d) for a stationary
        chain (``q_bar`` is no farther from the mode than a draw, and the noise's mean adds
        ``N / (n T)`` per dimension), far more for a chain still approaching the mode, whose
        draws are then spread along its path (``start="initial"`` on a linear regression:
        sds up to 15x too wide) or stuck (a tiny step size).
        """
        # The noise's mean adds N / (n T) per dimension when P = N J, up to the largest
        # eigenvalue of P^-1 N J times that when the curvature was measured apart.
        excess = float(
            np.linalg.eigvals(np.linalg.solve(precision, self.n_rows * scores)).real.max()
        )
        noise_share = 1.0 + self.n_rows / (self.batch_size * count) * max(excess, 1.0)
        distance_sq = float(force @ np.linalg.solve(precision, force)) / noise_share
        if distance_sq <= mahalanobis_limit(force.size):
            return False
        per_sample = self.n_rows / self.batch_size * (1.0 + 4.0 / step_size)
        warn_user(
            "SGFS had not reached its stationary distribution when tuning ended: over the last "
            f"half of tuning the chain was about {np.sqrt(distance_sq):.3g} posterior sds from "
            "the mode (by its mean gradient and the posterior's curvature), where a stationary "
            "chain is a few; its draws will still be approaching the mode. "
            + ("Use start='reference' (the default), or " if self._reference is None else "Use ")
            + f"more tuning draws (near the mode it needs about {per_sample:.3g} steps per "
            "effective sample; a larger step_size needs fewer)."
        )
        return True

    def _posterior_precision(self, scores: np.ndarray) -> np.ndarray:
        """Return the log posterior's curvature at the reference if measured, else ``N J``."""
        reference = self._reference
        if reference is not None and reference.precision is not None:
            return reference.precision
        return self.n_rows * scores

    def _step_size(self, t: int) -> float:
        if self.step_size_schedule is not None:
            return float(self.step_size_schedule(t))
        return self.step_size

    def _current_factors(self, step_size: float) -> SGFSFactors:
        assert self.fisher is not None
        cached = self._factors
        if cached is None or cached[0] is not self.fisher or cached[1] != step_size:
            try:
                factors = sgfs_factors(
                    self.fisher, self.n_rows, self.batch_size, step_size, self.preconditioner
                )
            except np.linalg.LinAlgError as error:
                raise ValueError(
                    "SGFS: the empirical Fisher information is singular. Every sampled variable "
                    "must enter the row likelihood (sample prior-only variables with another "
                    "step) and batch_size must exceed the number of parameters; or use "
                    "fisher='diagonal'."
                ) from error
            cached = self._factors = (self.fisher, step_size, factors)
        return cached[2]

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """One SGFS update on a fresh minibatch."""
        self.step_count += 1
        step_size = self._step_size(self.step_count)
        q = q0.data
        if self._start_near_reference and self._reference is not None:
            self._start_near_reference = False  # set at a chain's start, only with a reference
            q = self._reference.chain_start(q, self.rng)
        # Rows with replacement: gamma = (N + n) / n assumes an i.i.d. minibatch; without
        # replacement the gradient noise is smaller by (1 - n/N) and gamma over-corrects (posterior
        # sds measured sqrt(1 - n/N) too small).
        rows = self.rng.integers(0, self.n_rows, size=self.batch_size)
        scores = self.oracles.score_rows(q, rows)
        # The full covariance of the scores: the spread check's during tuning, SGFS-f's Fisher.
        covariance = empirical_fisher(scores, diagonal=False) if self.tune else None
        if self.fisher is None or self.tune or self.adapt_always:
            self.fisher_count += 1
            batch_fisher = (
                covariance
                if covariance is not None and not self.diagonal
                else empirical_fisher(scores, self.diagonal)
            )
            self.fisher = update_fisher_average(self.fisher, batch_fisher, self.fisher_count)
        factors = self._current_factors(step_size)
        prior_grad = self.oracles.log_prior_grad(q)
        if covariance is not None:
            self._record_tuning(covariance, prior_grad + self.n_rows * scores.mean(axis=0))
        q_new = sgfs_step(self.rng, q, prior_grad, scores, self.n_rows, factors)
        finite = bool(np.all(np.isfinite(q_new)))
        stats = {
            "n_data": self.batch_size,
            "step_size": step_size,
            "condition_number": factors.condition_number,
            "nonfinite_update": not finite,
        }
        return RaveledVars(q_new if finite else q, q0.point_map_info), [stats]

    def _record_tuning(self, covariance: np.ndarray, force: np.ndarray) -> None:
        # Per block: the summed score covariances (d rows), the summed forces and the count.
        if self._tune_count % _SPREAD_BLOCK == 0:
            d = covariance.shape[0]
            self._score_blocks.append(np.zeros((d + 2, d)))
        block = self._score_blocks[-1]
        block[:-2] += covariance
        block[-2] += force
        block[-1] += 1.0
        self._tune_count += 1


def _check_step_size(step_size: float | None, schedule: Callable[[int], float] | None) -> float:
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


def _check_preconditioner(
    preconditioner: ArrayLike | None, n_params: int, diagonal: bool
) -> np.ndarray | None:
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

"""SGFS: stochastic gradient Fisher scoring (Ahn, Korattikara and Welling 2012) as a PyMC step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.blocking import RaveledVars
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.sgfs import (
    PolynomialStepSize,
    SGFSFactors,
    empirical_fisher,
    sgfs_factors,
    sgfs_step,
    update_fisher_average,
)
from pymc_subsample.reference import automatic_reference
from pymc_subsample.step_methods.arguments import check_choice
from pymc_subsample.step_methods.control import reference_vector
from pymc_subsample.step_methods.sgfs_checks import (
    SPREAD_TOLERANCE,
    ChainESS,
    check_chain_ess,
    check_preconditioner,
    check_spread,
    check_step_size,
)
from pymc_subsample.step_methods.sgfs_start import (
    ReferenceFisher,
    reference_fisher,
    reference_score_sum,
)
from pymc_subsample.step_methods.step_base import SubsampleStepBase
from pymc_subsample.warnings import warn_user

# PolynomialStepSize is defined with the other SGFS formulas (``kernels/sgfs.py``) and exported
# from here, beside the step that takes it.
__all__ = ["SGFS", "PolynomialStepSize", "SPREAD_TOLERANCE"]

#: Default step size with the control variate (the default when the chains start at a
#: reference point): ``M`` is then ``3 (N I_hat + (N^2 / n) V_hat)`` with ``B`` its
#: ``eps -> oo`` limit, so the mean moves ``2 / 3`` of the way to the mode per step (lag-1
#: autocorrelation about 1/3: about one effective draw per two steps, docs/sgfs.md, "Defaults").
CONTROL_STEP_SIZE = 2.0
#: Default step size at a reference point without the control variate: the contraction per
#: step near the mode, ``2 / (gamma (1 + 4 / eps))``, is then 91% of its large-step limit
#: ``2 / gamma``: about ``N / n`` steps per effective draw.
REFERENCE_STEP_SIZE = 40.0
#: Step size without a reference point (the chain may start far from the mode).
INITIAL_STEP_SIZE = 1.0
#: Tuning draws per block of score covariances; the check uses the last half of the blocks.
_SPREAD_BLOCK = 50


@dataclass_state
class SGFSState(StepMethodState):
    """Adaptive state restored before each sequential chain."""

    fisher: np.ndarray | None
    fisher_count: int
    noise: np.ndarray | None
    noise_count: int
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

    By default (a reference point ``q*`` found) the minibatch gradient carries the first-order
    control variate: ``N g_bar`` becomes ``sum_i g_i(q*) + (N / n) sum_batch (g_i(q) -
    g_i(q*))`` (the full sum at ``q*`` computed once), whose noise ``(N^2 / n) V`` is far
    smaller than the scores' ``(N^2 / n) I``; ``gamma N I_hat`` becomes ``N I_hat + (N^2 / n)
    V_hat`` (eq. 8's derivation with that noise; ``V_hat`` the online average of the
    differences' covariance). Without it SGFS makes at most ``n / N`` effective draws per step
    whatever B and eps (``kernels.sgfs``); with it, about one per two steps at the default
    step size.

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
        :data:`CONTROL_STEP_SIZE` (2) with the control variate (the mean moves 2/3 of the way
        to the mode per step), :data:`REFERENCE_STEP_SIZE` (40) at a reference point without
        it (the contraction per step within 10% of its large-step limit ``2 / gamma``), else 1.
    fisher : {"full", "diagonal"}, default "full"
        SGFS-f or SGFS-d (diagonal ``I_hat``; exact only at small step sizes).
    preconditioner : array_like, optional
        B: a (d, d) SPD matrix ("full") or a vector of d positive values ("diagonal"). Default
        ``gamma N I_hat`` (the paper's recommendation, ``B`` proportional to ``I_N``), with the
        control variate ``N I_hat + (N^2 / n) V_hat``: ``M`` at ``eps -> oo`` either way.
    control_variate : {"auto", None, "taylor1"}, default "auto"
        ``"taylor1"``: the gradient of the first-order Taylor control variate at the reference
        point, as above (needs ``start="reference"``; two per-row gradients per row). Its step
        size should stay at most about 4 (where the mean jumps to the mode each step); beyond,
        the chain over-relaxes and its spread grows sensitive to ``I_hat`` (the end-of-tuning
        check says so). None: the paper's plain minibatch gradient. ``"auto"``: ``"taylor1"``
        when the step has a reference point, ``fisher="full"``, none of ``step_size``,
        ``step_size_schedule`` and ``preconditioner`` is given (those choose the paper's
        parametrisation, where a large step size is the Bernstein-von Mises regime) and no
        other step samples variables the rows read; else None.
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
        After tuning, when a chain's effective sample size (lag-1 autocorrelation of its own
        draws, smallest over coordinates: ``sgfs_checks.ChainESS``) is below
        :data:`~pymc_subsample.step_methods.sgfs_checks.MIN_ESS` (100): at its last draw on
        PyMC 6, after every 1,000 draws on PyMC 5 (which does not tell a step the number of
        draws). The message says how many draws would reach it and the knob that mixes
        faster. From worker processes it reaches the user through the ``warning`` stat, once
        per run.
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
    Without the control variate SGFS contracts towards the mode by about ``2 n / N`` per step
    at large step size, so it needs of the order of N/n steps per effective sample and a start
    near the mode, which ``start="reference"`` (the default) gives it.

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
        control_variate: str | None = "auto",
        reference_point: Any = None,
        obs_dim: str | None = None,
        model: pm.Model | None = None,
        rng: RandomGenerator = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
    ) -> None:
        self._given_step_size = check_step_size(step_size, step_size_schedule)
        self.step_size_schedule = step_size_schedule
        self.diagonal = check_choice("fisher", fisher, ("full", "diagonal")) == "diagonal"
        self.adapt_always = (
            check_choice("adapt_fisher", adapt_fisher, ("tune", "always")) == "always"
        )
        self.start = check_choice("start", start, ("reference", "initial"))
        if reference_point is not None and self.start != "reference":
            raise ValueError("reference_point is where chains start: pass start='reference'.")
        self._reference_point = reference_point
        control = check_choice("control_variate", control_variate, ("auto", None, "taylor1"))
        if control == "taylor1" and self.start != "reference":
            raise ValueError(
                "control_variate='taylor1' expands at the reference point: pass "
                "start='reference' (the default)."
            )
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
        self.preconditioner = check_preconditioner(
            preconditioner, self.oracles.n_params, self.diagonal
        )
        #: Why the chains do not start at the reference point by default ("" if they do).
        self.dropped_default = ""
        self._reference: ReferenceFisher | None = None
        others = self.oracles.other_variables_in_rows
        if control == "taylor1" and others:
            raise ValueError(
                f"control_variate='taylor1': the likelihood also reads {', '.join(others)}, "
                "which another step samples, and the control variate's full sum at the "
                "reference holds them fixed. Give this step those that are continuous too "
                "(vars=None samples every continuous variable), or pass control_variate=None."
            )
        # "auto": the control variate with its own step size and full B, unless one is given
        # (the paper's parametrisation, where a large eps is the BvM regime), SGFS-d (a diagonal
        # M on correlated scores would over-step) or another step moves what the rows read.
        given = self.diagonal or not (step_size is None and step_size_schedule is None)
        given = given or preconditioner is not None
        if self.start == "reference":
            self._reference = self._find_reference()
        if self._reference is None and control == "taylor1":
            raise ValueError(
                "control_variate='taylor1' needs a reference point, and the search for one "
                f"failed: {self.dropped_default}. Pass reference_point=, or control_variate=None."
            )
        #: Whether the gradient carries the first-order control variate at the reference.
        self.control = self._reference is not None and (
            control == "taylor1" or (control == "auto" and not (given or others))
        )
        #: ``sum_i g_i(q*)`` over all N rows at the reference (the control variate's offset).
        self._score_sum = self._reference_score_sum() if self.control else None
        self.step_size = self._given_step_size
        if step_size is None and step_size_schedule is None:
            self.step_size = (
                INITIAL_STEP_SIZE
                if self._reference is None
                else CONTROL_STEP_SIZE
                if self.control
                else REFERENCE_STEP_SIZE
            )
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
        #: Online average of the control variate's differences' covariance (eq. 12's kappa).
        self.noise: np.ndarray | None = None
        self.noise_count = 0
        self.step_count = 0
        self._ess = ChainESS()
        self._start_near_reference = False
        # Factorisations of M and B for (the Fisher and noise array objects, step size): reused
        # while they stay the same (after tuning, at a fixed step size). Every update and
        # every state restore makes a new array, so identity is a safe key.
        self._factors: tuple[np.ndarray, np.ndarray | None, float, SGFSFactors] | None = None
        # Where no pass over every row checked the rows at the start, one does now.
        self.oracles.ensure_rows_finite()

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

    def _reference_score_sum(self) -> np.ndarray:
        assert self._reference is not None
        return reference_score_sum(self.oracles, self._reference.q)

    def _rebuild_for_data(self) -> None:
        # The cached factorisations hold N (pm.set_data to another number of rows), and the
        # reference point, its Fisher information and score sum are those of the old data.
        self._factors = None
        if self._reference is not None:
            self._reference = self._find_reference()
            if self.control and self._reference is not None:
                self._score_sum = self._reference_score_sum()
            self.control = self.control and self._reference is not None

    def reset_tuning(self) -> None:
        """Restart the Fisher and noise averages (at the reference's, if any) and counters."""
        self.fisher, self.fisher_count, self.step_count = None, 0, 0
        self.noise, self.noise_count = None, 0
        if self._reference is not None:
            self.fisher = self._reference.fisher
            self.fisher_count = self._reference.weight
        self._start_near_reference = self._reference is not None
        self._factors = None
        self._score_blocks = []
        self._tune_count = 0
        self._ess.reset(self._chain_draws)

    def stop_tuning(self) -> None:
        """End tuning; warn if the stationary spread predicted from it is off (class docs)."""
        if self.tune:
            ratios = check_spread(
                self._score_blocks,
                self.fisher,
                self._step_size(max(self.step_count, 1)),
                self._posterior_precision,
                control=self.control,
                noise=self.noise,
                n_rows=self.n_rows,
                batch_size=self.batch_size,
                preconditioner=self.preconditioner,
                reference_found=self._reference is not None,
                diagonal=self.diagonal,
            )
            if ratios is not None:
                self.predicted_sd_ratios = ratios
        super().stop_tuning()

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
        if (
            cached is None
            or cached[0] is not self.fisher
            or cached[1] is not self.noise
            or cached[2] != step_size
        ):
            try:
                factors = sgfs_factors(
                    self.fisher,
                    self.n_rows,
                    self.batch_size,
                    step_size,
                    self.preconditioner,
                    self._noise_in_m(),
                )
            except np.linalg.LinAlgError as error:
                raise ValueError(
                    "SGFS: the empirical Fisher information is singular. Every sampled variable "
                    "must enter the row likelihood (sample prior-only variables with another "
                    "step) and batch_size must exceed the number of parameters; or use "
                    "fisher='diagonal'."
                ) from error
            cached = self._factors = (self.fisher, self.noise, step_size, factors)
        return cached[3]

    def _noise_in_m(self) -> np.ndarray | None:
        """``V_hat`` in ``M`` with the control variate (zero before its first batch), else None."""
        if not self.control:
            return None
        if self.noise is None:
            assert self.fisher is not None
            return np.zeros_like(self.fisher)
        return self.noise

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
        adapt = self.fisher is None or self.tune or self.adapt_always
        if adapt:
            self.fisher_count += 1
            batch_fisher = (
                covariance
                if covariance is not None and not self.diagonal
                else empirical_fisher(scores, self.diagonal)
            )
            self.fisher = update_fisher_average(self.fisher, batch_fisher, self.fisher_count)
        offset, differences, noise_covariance = None, scores, None
        if self.control:
            # The first-order control variate: what the minibatch averages is g_i(q) - g_i(q*),
            # the full sum at q* is added back; its covariance V enters M (eq. 8 with this noise).
            assert self._reference is not None
            differences = scores - self.oracles.score_rows(self._reference.q, rows)
            offset = self._score_sum
            noise_covariance = empirical_fisher(differences, diagonal=False) if self.tune else None
            if adapt or self.noise is None:
                self.noise_count += 1
                batch_noise = (
                    noise_covariance
                    if noise_covariance is not None and not self.diagonal
                    else empirical_fisher(differences, self.diagonal)
                )
                self.noise = update_fisher_average(self.noise, batch_noise, self.noise_count)
        factors = self._current_factors(step_size)
        prior_grad = self.oracles.log_prior_grad(q)
        if covariance is not None:
            force = prior_grad + self.n_rows * differences.mean(axis=0)
            if offset is not None:
                force = force + offset
            self._record_tuning(covariance, noise_covariance, force)
        q_new = sgfs_step(self.rng, q, prior_grad, differences, self.n_rows, factors, offset)
        finite = bool(np.all(np.isfinite(q_new)))
        if not self.tune and self._ess.record(q_new if finite else q):
            check_chain_ess(
                self._ess,
                control=self.control,
                n_rows=self.n_rows,
                batch_size=self.batch_size,
                others_in_rows=bool(self.oracles.other_variables_in_rows),
                reference_found=self._reference is not None,
            )
        stats = {
            "n_data": self.batch_size,
            "step_size": step_size,
            "condition_number": factors.condition_number,
            "nonfinite_update": not finite,
        }
        return RaveledVars(q_new if finite else q, q0.point_map_info), [stats]

    def _record_tuning(
        self, covariance: np.ndarray, noise_covariance: np.ndarray | None, force: np.ndarray
    ) -> None:
        # Per block: the summed score covariances (d rows), the control variate's differences'
        # (d rows, zero without it), the summed forces and the count.
        d = covariance.shape[0]
        if self._tune_count % _SPREAD_BLOCK == 0:
            self._score_blocks.append(np.zeros((2 * d + 2, d)))
        block = self._score_blocks[-1]
        block[:d] += covariance
        if noise_covariance is not None:
            block[d : 2 * d] += noise_covariance
        block[-2] += force
        block[-1] += 1.0
        self._tune_count += 1

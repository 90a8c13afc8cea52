"""``proposal="hmc"``: Hamiltonian trajectories on a gradient fixed per draw.

The kernel is ``kernels/trajectory.py``'s; this part chooses the gradient estimate that drives
each trajectory, counts the rows it reads, and tunes the step size (the step's ``scaling``) by
dual averaging and, without a covariance, a diagonal mass (``docs/hmc.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from pymc_subsample.kernels.trajectory import (
    HamiltonianProposal,
    TrajectoryInfo,
    dual_averaging_step,
    jittered_steps,
    start_dual_averaging,
)
from pymc_subsample.step_methods.defaults import (
    TRAJECTORY_GRADIENT_NOISE,
    TRAJECTORY_GRADIENT_ROWS,
    TRAJECTORY_MAX_STEPS,
    TRAJECTORY_MIN_GRADIENT_ROWS,
    TRAJECTORY_TARGET_ACCEPTANCE,
    TRAJECTORY_TIME,
    gradient_obstacle,
)
from pymc_subsample.step_methods.proposal_parts import ProposalPart, register_proposal

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from pymc_subsample.kernels.stratified import Strata
    from pymc_subsample.step_methods.contracts import StepView, TestDecision

__all__ = ["MASS_WINDOW_ENDS", "HamiltonianPart"]

#: Draws after which the diagonal mass is re-estimated during tuning, without a Laplace
#: covariance (Stan's windows: a 75-draw buffer, then windows of 25, 50, 100, ...).
MASS_WINDOW_ENDS = (100, 150, 250, 450, 850, 1650, 3250, 6450)
#: Tuning draws after which the minibatch of the trajectories' gradient is resized (after the
#: mass's update there): the mass is an estimate of the posterior's scale from the first.
GRADIENT_CHECKPOINTS = MASS_WINDOW_ENDS[1:]
#: Independent estimates of the gradient, of ``TRAJECTORY_MIN_GRADIENT_ROWS`` rows each, whose
#: spread measures its noise at a checkpoint.
NOISE_ESTIMATES = 20


@register_proposal
class HamiltonianPart(ProposalPart):
    """A leapfrog trajectory with jittered length, accepted by the step's own test.

    Parameters
    ----------
    proposal_cov : array_like or None
        The mass's inverse (the Laplace covariance, or the user's); None adapts a diagonal
        one during tuning.
    """

    name = "hmc"
    needs_gradients = True
    scaling_rule = "part"

    def __init__(self, proposal_cov: ArrayLike | None) -> None:
        super().__init__(proposal_cov)
        self._trajectory = TrajectoryInfo(0, False)
        self._step_size = start_dual_averaging(1.0)
        self._mass_moments = np.zeros((0, 0))  # count, mean, sum of squared deviations
        self._tuning_draws = 0
        self._tuned = 0  # tuning draws of this chain, for the gradient's checkpoints
        #: Rows each of the last two checkpoints asked for (None before the first).
        self._rows_needed: list[int] = []

    @classmethod
    def obstacle(cls, step: StepView) -> str | None:
        """Refuse rows whose gradients are not finite where their log-likelihood is."""
        return gradient_obstacle(step.oracles)

    @staticmethod
    def default_scaling(n_params: int) -> float:
        """Return the leapfrog step in whitened coordinates, ``d^(-1/4)`` (Beskos et al. 2013)."""
        return 1.0 / n_params**0.25

    @property
    def adapts_mass(self) -> bool:
        """Whether tuning adapts a diagonal mass (no covariance was given or found)."""
        return self.proposal_cov is None

    @property
    def info(self) -> TrajectoryInfo:
        """The last trajectory's length and whether it diverged."""
        return self._trajectory

    def build_kernel(self, step: StepView) -> HamiltonianProposal:
        """Return the trajectory kernel with the mass's inverse :attr:`proposal_cov`."""
        return HamiltonianProposal(step.oracles.n_params, self.proposal_cov)

    def propose(self, step: StepView, q: np.ndarray) -> tuple[np.ndarray, float]:
        """Run one trajectory of jittered length on a gradient drawn for it."""
        if not (0.0 < step.scaling < math.inf):
            raise RuntimeError(
                f"The trajectories' step size shrank to {step.scaling:g} during tuning: "
                "every trajectory was rejected (non-finite gradients or log-densities "
                "along it). Sample with proposal='random_walk'."
            )
        n_steps = jittered_steps(step.rng, step.scaling, TRAJECTORY_TIME, TRAJECTORY_MAX_STEPS)
        q_new, log_ratio, self._trajectory = step.proposal(
            step.rng, q, step.scaling, n_steps, self.trajectory_gradient(step)
        )
        return q_new, log_ratio

    def trajectory_gradient(self, step: StepView) -> Callable[[np.ndarray], np.ndarray]:
        """Return the gradient estimate that drives one trajectory, fixed for its whole length.

        The exact gradient (all rows, read in place) or a minibatch drawn with replacement,
        independently of the state (``kernels/trajectory.py``: any gradient fixed during the
        trajectory gives a valid proposal); see :meth:`trajectory_gradient_rows`. With a
        control variate the minibatch estimates only what its Taylor proxies leave, whose exact
        sums are known: with ``taylor2``, ``(G* + H* (q - q*)) / T`` plus ``N / (n T)`` times
        the rows' remainders ``s_i(q) - s_i(q*) - H_i(q*) (q - q*)``
        (:meth:`~pymc_subsample.model.oracles.ModelOracles.remainder_gradient_on_rows`); with
        ``taylor1``, ``G* / T + N / (n T) sum (s_i(q) - s_i(q*))``. The second-order form
        matters on hierarchical models: the first-order one's noise, about ``sqrt(N / n)``
        times a group's posterior score, shrank the step size of a centred 85-group model with
        1e5 rows to 0.0008 (ESS 2); see ``docs/hmc.md``.
        """
        oracles = step.oracles
        if not oracles.rows_depend_on_q:
            return oracles.log_prior_grad
        n_rows, n_gradient = oracles.n_rows, self.trajectory_gradient_rows(step)
        if n_gradient == n_rows:
            return oracles.gradient_on_rows(None, step.temperature)
        return self._estimate(step, self._draw_rows(step, n_gradient))

    @staticmethod
    def _draw_rows(step: StepView, size: int) -> np.ndarray:
        """Draw a gradient's minibatch with replacement.

        Of all rows, or of a hierarchy's sampled strata, whose small groups the estimate
        reads whole (:func:`_by_group`).
        """
        strata = _by_group(step)
        if strata is None:
            return step.rng.integers(0, step.oracles.n_rows, size=size)
        return strata.sampled_rows[step.rng.integers(0, strata.sampled_rows.size, size=size)]

    def _estimate(self, step: StepView, rows: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """Return the gradient estimate from ``rows`` (drawn with replacement)."""
        oracles, temperature = step.oracles, step.temperature
        n_rows = oracles.n_rows
        control = step.control
        if control is None:
            return oracles.gradient_on_rows(rows, temperature)
        proxy = control.proxy
        if proxy.order == 2:
            strata = _by_group(step)
            remainders = (
                oracles.remainder_gradient_on_rows(rows, proxy.reference, temperature)
                if strata is None
                else _stratified(step, strata, rows)
            )
            point, pullback = oracles.expansion_point, oracles.expansion_pullback

            def second_order(q: np.ndarray) -> np.ndarray:
                # In the likelihood's parameters theta = phi(q) the expansion's gradient is
                # taken back to q by J_phi(q)^T (the identity where the proxies are in q).
                expansion = proxy.gradient_sum + proxy.hessian_sum @ (point(q) - proxy.reference)
                return remainders(q) + pullback(q, expansion) / temperature

            return second_order
        if oracles.expansion != "unconstrained":  # pragma: no cover - the step never makes it
            raise RuntimeError("first-order proxies in the likelihood's parameters")
        estimate = oracles.gradient_on_rows(rows, temperature)
        factor = n_rows / (rows.size * temperature)
        offset = proxy.gradient_sum / temperature - factor * oracles.score_rows(
            proxy.reference, rows
        ).sum(0)

        def first_order(q: np.ndarray) -> np.ndarray:
            return estimate(q) + offset

        return first_order

    def trajectory_gradient_rows(self, step: StepView) -> int:
        """Rows of each trajectory's gradient: N, or a minibatch sized during tuning.

        All N when N is at most ``TRAJECTORY_GRADIENT_ROWS``, and without a control variate at
        temperature 1, where a minibatch gradient's noise would swamp the posterior's (about
        ``sqrt(N / n)`` times its gradient one sd from the mode) and the test reads a share of
        N rows per draw anyway. Else ``TRAJECTORY_GRADIENT_ROWS`` until the first checkpoint
        of tuning, then the size the noise measured there asks for (:meth:`_resize`).
        """
        if _reads_every_row(step):
            return step.oracles.n_rows
        return max(self._rows_needed) if self._rows_needed else TRAJECTORY_GRADIENT_ROWS

    def _resize(self, step: StepView, q: np.ndarray) -> None:
        """Size the minibatch from the gradient's noise at ``q``, whitened by the mass.

        ``NOISE_ESTIMATES`` independent estimates of ``m = TRAJECTORY_MIN_GRADIENT_ROWS`` rows
        each give the noise's variance per coordinate whitened by the mass (``L^T g`` with
        ``M^-1 = L L^T``), ``s_j^2``; an estimate from ``n`` rows has ``s_j^2 m / n``. The size is
        the fewest rows with ``sum_j s_j^2 m / n <= TRAJECTORY_GRADIENT_NOISE``, at least
        ``m``, and all N once it reaches a quarter of them; the larger of the last two
        checkpoints' sizes is used, as the noise grows away from the reference point. With
        ``taylor2`` the noise is that of the rows' Taylor remainders, zero for a Gaussian
        likelihood in its location parameters.
        """
        oracles, size = step.oracles, TRAJECTORY_MIN_GRADIENT_ROWS
        if _reads_every_row(step):
            return
        with np.errstate(over="ignore", invalid="ignore"):
            estimates = np.array(
                [
                    self._estimate(step, self._draw_rows(step, size))(q)
                    for _ in range(NOISE_ESTIMATES)
                ]
            )
            noise = float(_whitened(step, estimates).var(axis=0, ddof=1).sum())
        if not np.isfinite(noise):
            return
        needed = max(size, math.ceil(size * noise / TRAJECTORY_GRADIENT_NOISE))
        strata = _by_group(step)
        population = oracles.n_rows if strata is None else strata.sampled_rows.size
        if 4 * needed >= population:
            needed = oracles.n_rows
        before = self.trajectory_gradient_rows(step)
        self._rows_needed = [*self._rows_needed[-1:], needed]
        if self.trajectory_gradient_rows(step) != before:
            # A new minibatch is a new gradient noise: the step size the old one forced is no
            # guide to this one (as a new mass is not in Stan's windows). Without this restart
            # the first draws' noisier 2,000-row gradients kept the averaged step small after
            # the minibatch grew: 0.009 and 100 leapfrog steps on a centred 100-group Poisson
            # model, where the same sized minibatch alone tunes to about 0.1.
            self._step_size = start_dual_averaging(step.scaling)

    def gradient_rows(self, step: StepView) -> int:
        """Rows read by the last trajectory's gradients: its rows times the points evaluated."""
        if not step.oracles.rows_depend_on_q:
            return 0
        n_gradient = self.trajectory_gradient_rows(step)
        strata = _by_group(step)
        if strata is not None and n_gradient < step.oracles.n_rows:
            n_gradient += strata.whole_rows.size  # the small groups, read whole
        n_points = self._trajectory.n_steps + 1
        if step.control is not None and n_gradient < step.oracles.n_rows:
            # taylor2: each point also reads the rows at q* (a Hessian-vector product);
            # taylor1: the rows' scores at q*, once.
            n_points = 2 * n_points if step.control.proxy.order == 2 else n_points + 1
        return n_gradient * n_points

    def after_decision(self, step: StepView, q_next: np.ndarray, decision: TestDecision) -> None:
        """Tune the step size by dual averaging and, without a covariance, a diagonal mass.

        The step size follows Hoffman and Gelman (2014, section 3.2) on each draw's acceptance
        statistic (``step.test.acceptance_statistic``: the decision, or for Barker the Metropolis
        acceptance probability of its estimate), towards ``TRAJECTORY_TARGET_ACCEPTANCE``. The
        mass is Stan's windowed adaptation: the regularised variances of the draws in each
        window of ``MASS_WINDOW_ENDS`` become the proposal covariance, and the step size
        adaptation restarts from there.
        """
        self._step_size = dual_averaging_step(
            self._step_size, step.test.acceptance_statistic(decision), TRAJECTORY_TARGET_ACCEPTANCE
        )
        step.scaling = float(np.exp(self._step_size.log_step))
        self._tuned += 1
        if not self.adapts_mass:
            if self._tuned in GRADIENT_CHECKPOINTS:
                self._resize(step, q_next)
            return
        self._tuning_draws += 1
        if self._tuning_draws <= MASS_WINDOW_ENDS[0] - 25:
            return  # Stan's initial buffer: the chain is still finding the typical set.
        count, mean, squares = self._mass_moments
        count += 1
        delta = q_next - mean
        mean += delta / count
        squares += delta * (q_next - mean)
        if self._tuning_draws in MASS_WINDOW_ENDS:
            n = count[0]
            # Stan's regularisation: shrink towards 1e-3 with weight 5 / (n + 5).
            variances = (n / (n + 5.0)) * squares / (n - 1.0) + 1e-3 * (5.0 / (n + 5.0))
            step.proposal = HamiltonianProposal(step.oracles.n_params, variances)
            self._mass_moments[:] = 0.0
            self._step_size = start_dual_averaging(step.scaling)
        if self._tuned in GRADIENT_CHECKPOINTS:
            self._resize(step, q_next)

    def reset(self, step: StepView) -> None:
        """Start the step size adaptation from the chain's first step size, the mass anew."""
        self._step_size = start_dual_averaging(step.scaling)
        self._mass_moments = np.zeros((3, step.oracles.n_params))
        self._tuning_draws = 0
        self._tuned = 0
        self._rows_needed = []
        if self.adapts_mass:
            step.proposal = self.build_kernel(step)

    def stop_tuning(self, step: StepView) -> None:
        """Keep the dual averaging's averaged step size from here on."""
        if self._step_size.iteration:
            step.scaling = float(np.exp(self._step_size.log_step_mean))


def _whitened(step: StepView, gradients: np.ndarray) -> np.ndarray:
    """Gradients (one per row) in the coordinates the mass whitens: ``L^T g``, ``M^-1 = L L^T``."""
    kernel = step.proposal
    assert isinstance(kernel, HamiltonianProposal)
    factor = np.asarray(kernel.chol_factor)
    return gradients * factor if factor.ndim == 1 else gradients @ factor


def _by_group(step: StepView) -> Strata | None:
    """Return the strata a second-order gradient estimate reads by (None: uniformly).

    On a hierarchy whose test reads the rows by group (``step.strata``) the remainders of
    small groups' rows are large, as their residuals are: drawn uniformly, those rare rows
    carried the noise (a 200-group logistic regression with 2e5 rows asked for 40,000 rows
    per gradient). The estimate reads the small groups whole, up to about 2,000 rows
    (``step.gradient_strata``: more than the test reads whole, as the gradient's noise is paid
    at every leapfrog step), and draws the rest uniformly among the other groups' rows
    (``docs/hmc.md``, "On a hierarchy").
    """
    control, strata = step.control, step.gradient_strata
    if strata is None or control is None or control.proxy.order != 2:
        return None
    return strata if strata.sampled_rows.size else None


def _stratified(
    step: StepView, strata: Strata, rows: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """Return the prior's gradient plus the rows' remainders estimated by group.

    The small groups' exact sum plus ``rows``' (drawn among the sampled strata's rows) scaled
    to those rows; each compiled function adds the prior's gradient, taken off once.
    """
    oracles, reference = step.oracles, step.control.proxy.reference  # type: ignore[union-attr]
    temperature = step.temperature
    scaled = oracles.remainder_gradient_on_rows(
        rows, reference, temperature, population=strata.sampled_rows.size
    )
    if not strata.whole_rows.size:
        return scaled
    whole = oracles.remainder_gradient_on_rows(
        strata.whole_rows, reference, temperature, population=strata.whole_rows.size
    )

    def by_group(q: np.ndarray) -> np.ndarray:
        return scaled(q) + whole(q) - oracles.log_prior_grad(q)

    return by_group


def _reads_every_row(step: StepView) -> bool:
    """Whether the trajectories' gradient reads all N rows, whatever its noise.

    Small data (N at most ``TRAJECTORY_GRADIENT_ROWS``), and no control variate at temperature
    1, where a minibatch's noise is about ``sqrt(N / n)`` times the posterior's gradient.
    """
    n_rows = step.oracles.n_rows
    return n_rows <= TRAJECTORY_GRADIENT_ROWS or (step.control is None and step.temperature == 1.0)

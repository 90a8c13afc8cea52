"""What the subsampling steps share: oracles, rows, RNG hooks; and the Metropolis-Hastings layer.

``SubsampleStepBase`` compiles the model's per-row terms and maps PyMC's points; ``SubsampleMH``
composes a proposal (``proposal_parts``), the control variate (``control.py``) and an
acceptance test (``acceptance_tests``) into a draw (``docs/architecture.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.blocking import RaveledVars
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.kernels.user_proposal import ProposalFunction, UserProposal
from pymc_subsample.kernels.warm_up import stop_kernel_warm_up
from pymc_subsample.model.checks import discrete_names
from pymc_subsample.step_methods.acceptance_tests import (
    AcceptanceTest,
    StatSpec,
)
from pymc_subsample.step_methods.arguments import (
    check_choice,
    check_discrete_request,
    check_int,
    check_proposal,
    check_scaling,
    check_temperature,
    step_value_vars,
)
from pymc_subsample.step_methods.constructor import build_test, give_constructor
from pymc_subsample.step_methods.contracts import ProposalKernel
from pymc_subsample.step_methods.control import (
    CONTROL_VARIATES,
    ControlVariate,
    reference_vector,
)
from pymc_subsample.step_methods.defaults import (
    AUTO,
    CONTROLLED_BATCH_SIZE,
    INDEPENDENT_SPREAD,
    control_variate_obstacle,
)
from pymc_subsample.step_methods.diagnostics import ChainDiagnostics
from pymc_subsample.step_methods.fused_path import FusedDraw, fused_obstacle, seed_fused_draws
from pymc_subsample.step_methods.group_route import AUTO_GROUPS, GROUP_ROUTE_MARK, group_route
from pymc_subsample.step_methods.progress import make_progressbar_updaters, progressbar_config
from pymc_subsample.step_methods.proposal_choice import ProposalChoice
from pymc_subsample.step_methods.proposal_parts import PROPOSAL_PARTS
from pymc_subsample.step_methods.proposal_parts.hamiltonian import HamiltonianPart
from pymc_subsample.step_methods.proposal_parts.user import USER_PROPOSAL
from pymc_subsample.step_methods.step_base import SubsampleStepBase
from pymc_subsample.step_methods.stratification import make_strata
from pymc_subsample.warnings import warn_user

__all__ = ["STEP_STATS", "SubsampleMH", "SubsampleMHState"]


@dataclass_state
class SubsampleMHState(StepMethodState):
    """Every adaptive attribute, so that PyMC restores it before each sequential chain."""

    scaling: float
    tune: bool
    steps_until_tune: int
    accepted_since_tune: int


#: The stats every Metropolis-Hastings step adds to its test's (``SubsampleMH._draw_stats``
#: and the control variate's distance; ``residual_kurtosis`` is a decision field).
STEP_STATS: dict[str, StatSpec] = {
    "batch_size": (np.int64, []),
    "n_grad_rows": (np.int64, []),
    "n_steps": (np.int64, []),
    "diverging": (bool, []),
    "energy_error": (np.float64, []),
    "scaling": (np.float64, []),
    "temperature": (np.float64, []),
    "reference_distance": (np.float64, []),
}


class SubsampleMH(SubsampleStepBase, ProposalChoice):
    """Metropolis-Hastings whose accept test looks at a subset of the rows.

    A step is this class with a test: ``class MyMH(SubsampleMH, test=MyTest)`` (an
    :class:`~pymc_subsample.AcceptanceTest` subclass) is a PyMC step whose constructor takes
    the test's settings next to the ones below; its stats are the test's decision fields plus
    :data:`STEP_STATS`. :class:`~pymc_subsample.AusterityMH` and
    :class:`~pymc_subsample.MinibatchBarkerMH` are made this way; ``docs/architecture.md``
    ("Tests") works an example. The parameters are those of
    :class:`~pymc_subsample.AusterityMH`, whose docstring describes them.
    """

    _state_class = SubsampleMHState
    _progressbar_config = staticmethod(progressbar_config)
    _make_progressbar_update_functions = staticmethod(make_progressbar_updaters)
    name = "subsample_mh"
    #: The package kernels its fused draw calls, compiled ahead (``kernels/warm_up.py``),
    #: in the background: the fused draw is compiled at the end of the build.
    warm_kernels: ClassVar[tuple[str, ...]] = ("fused",)
    warm_kernels_late = True
    #: The test part this step class decides with (set by the class statement's ``test=``).
    test_class: ClassVar[type[AcceptanceTest] | None] = None
    #: The test (``kernels/group_tests.py``) of the group step this very class builds for a
    #: hierarchy when left at its defaults (``group_route.py``); None: no such route. Not
    #: inherited: a subclass is always the one-block step.
    group_test: ClassVar[str | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Build the group step for a hierarchy (``group_route.py``), else this step."""
        if "group_test" in cls.__dict__ and cls.group_test is not None:
            step = group_route(cls.__name__, cls.group_test, args, kwargs)
            if step is not None:
                return step  # not an instance of cls: Python does not call __init__ again
            kwargs[GROUP_ROUTE_MARK] = True  # kept for unpickling in worker processes
        return super().__new__(cls, *args, **kwargs)

    def __init_subclass__(cls, test: type[AcceptanceTest] | None = None, **kwargs: Any) -> None:
        if test is not None:
            if not (isinstance(test, type) and issubclass(test, AcceptanceTest)):
                raise TypeError(f"test= must be an AcceptanceTest subclass, got {test!r}.")
            cls.test_class = test
            cls.stats_dtypes_shapes = {**test.stats, **test.setting_stats, **STEP_STATS}
            if "__init__" not in cls.__dict__:
                give_constructor(cls, test, SubsampleMH.__init__)
        super().__init_subclass__(**kwargs)

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None = None,
        *,
        batch_size: int | None = None,
        temperature: float = 1.0,
        proposal: str | ProposalFunction = "auto",
        scaling: float | None = None,
        proposal_cov: ArrayLike | None = None,
        tune_interval: int = 100,
        obs_dim: str | None = None,
        model: pm.Model | None = None,
        rng: RandomGenerator = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
        control_variate: str | None = AUTO,
        reference_point: Any = None,
        recenter: str | None = None,
        fused: bool = True,
        group_effects: bool | str = AUTO_GROUPS,
        **test_settings: Any,
    ) -> None:
        # group_effects chose the route in __new__ (group_route.py); here it is only checked.
        if group_effects is True and type(self).__dict__.get("group_test") is None:
            raise ValueError(
                f"{type(self).__name__} has no group route: sample a hierarchy group by group "
                "with pms.GroupEffectsMH, pms.AusterityMH or pms.MinibatchBarkerMH."
            )
        #: The test part, built from the test's settings first (they are checked before the
        #: model is compiled).
        self.test: AcceptanceTest = build_test(type(self), test_settings)
        self.temperature = check_temperature(temperature)
        self.tune_interval = check_int("tune_interval", tune_interval, minimum=1)
        requested_proposal = check_proposal(proposal, proposal_cov)
        requested = check_choice("control_variate", control_variate, (AUTO, *CONTROL_VARIATES))
        self.recenter = check_choice("recenter", recenter, (None, "tune"))
        if requested is None and (reference_point is not None or recenter):
            raise ValueError(
                "reference_point and recenter apply to control variates: pass "
                "control_variate='taylor1' or 'taylor2' as well (or leave the default, 'auto')."
            )
        #: The step's discrete variables: sampled only by a proposal function that keeps them
        #: on their support (a reversible-jump proposal), without a control variate.
        vars = step_value_vars(model, vars, discrete=requested_proposal == USER_PROPOSAL)
        self.discrete_vars = discrete_names(vars)
        if self.discrete_vars:
            check_discrete_request(self.discrete_vars, requested_proposal, requested)
            requested = None
        super().__init__(
            vars,
            batch_size=batch_size,
            obs_dim=obs_dim,
            model=model,
            rng=rng,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
            with_gradients=requested_proposal in PROPOSAL_PARTS
            and PROPOSAL_PARTS[requested_proposal].needs_gradients,
            proxy_order=0 if requested == AUTO else CONTROL_VARIATES[requested],
            discrete=bool(self.discrete_vars),
        )
        n_params = self.oracles.n_params
        self.control: ControlVariate | None = None
        self.reference_rows = 0
        #: Sd of the log importance weights of the Laplace approximation at the automatic
        #: reference (NaN without one): what ``proposal="auto"`` decides on.
        self.laplace_spread = float("nan")
        self._reference_point = reference_point
        #: Whether control_variate was left at "auto" (the reference is then found again after
        #: pm.set_data, and a failed search drops the control variate instead of raising).
        self._automatic = requested == AUTO
        #: Why the default control variate was dropped ("" if it was not, or not asked for).
        self.dropped_default = ""
        self.control_variate = self._resolve_control_variate(requested, reference_point)
        #: Whether the proposal's covariance is the step's to choose (none given, no proposal
        #: function): the Laplace one where the control variate is in q, else none (adapted).
        self._own_covariance = proposal_cov is None and requested_proposal != USER_PROPOSAL
        if self.control_variate is not None:
            self.oracles = self.oracles.with_proxy_order(CONTROL_VARIATES[self.control_variate])
        if fused is True and self.oracles.rows_depend_on_q and self._first_build:
            # A machine's first build: the fused draw's functions compile in a helper during
            # the search. Elsewhere compiling them here is quicker than waiting for a helper
            # that first imports PyTensor (model/compile_helper.py).
            self.oracles.prefetch_numba_kernels()
        if self.control_variate is not None:
            self.control = self._make_control_variate(reference_point)
            if self.control is None:
                self.control_variate = None
            elif self._laplace_proposal:
                proposal_cov = self.control.covariance
        # 8 bytes per row, allocated once: after the control variate's reference search, so
        # that the search's passes and this array are not held together.
        self.row_sampler = RowSampler(self.oracles.n_rows, self.oracles.row_proposals())
        #: The proposal in use: a registered part's name (``proposal_parts``) or "user".
        self.proposal_kind = self._resolve_proposal(requested_proposal, proposal_cov)
        self._user_proposal = (
            None if isinstance(proposal, str) else UserProposal(proposal, n_params)
        )
        if batch_size is None:
            default = (
                self.test.uncontrolled_batch_size if self.control is None else CONTROLLED_BATCH_SIZE
            )
            # At most N: with fewer rows than a default batch the test is exact, as it should be.
            self.batch_size = min(default, self.oracles.n_rows)
        self.test.prepare(self)
        #: The rows by group where the test reads them so (``stratification.py``), else None,
        #: and those the trajectories' gradient reads by.
        self.strata, self.gradient_strata = make_strata(self)
        #: The proposal's part: how it is built, run and tuned (``proposal_parts``); its
        #: ``proposal_cov`` is the covariance in use (given, the Laplace one, or None).
        self.proposal_part = self._make_part(proposal_cov)
        self.proposal: ProposalKernel = self.proposal_part.build_kernel(self)
        self.diagnostics = self._make_diagnostics()
        self._pending_rows = 0
        self._tune_blocks: list[np.ndarray] = []
        self._tune_steps = 0
        #: Set at each chain's start (reset_tuning): move a far first point near the reference.
        self._start_near_reference = False
        self._initial_scaling = check_scaling(scaling, n_params, self.proposal_part)
        if self._user_proposal is not None:
            initial = reference_vector(self._initial_point, self.vars, self._initial_point)
            self._user_proposal.check(np.random.default_rng(0), initial, self._initial_scaling)
        self.scaling = self._initial_scaling
        self.tune = True
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0
        self._fused: FusedDraw | None = None
        self._seed_fused = True
        # Where no pass over every row checked the rows at the start, one does now.
        self.oracles.ensure_rows_finite()
        #: "fused" where each draw is one compiled call, else "python: " and why.
        self.draw_path = self._choose_draw_path(fused)
        if batch_size is not None and self.batch_size >= self.oracles.n_rows:
            warn_user(
                f"batch_size={self.batch_size} >= N={self.oracles.n_rows} rows: every test uses "
                "all rows and is the exact test, without subsampling. Use a smaller batch_size "
                "to subsample.",
            )

    def _choose_draw_path(self, fused: bool) -> str:
        """Build the fused draw where it applies, and run it once (its compilation)."""
        if not isinstance(fused, bool):
            raise ValueError(f"fused must be True or False, got {fused!r}.")
        if not fused:
            return "python: fused=False"
        obstacle = fused_obstacle(self)
        if obstacle is not None:
            return f"python: {obstacle}"
        start = self.oracles.initial_q if self.control is None else self.control.reference
        try:
            self._fused = FusedDraw(self)
            self._fused.draw(np.array(start, dtype=float), self.scaling)
        except Exception as error:
            self._fused = None
            return f"python: PyTensor's Numba backend could not compile the draw ({error})"
        finally:
            # The draw compiled its driver beside the kernels' warm-up, and has the kernels.
            stop_kernel_warm_up(self.warm_kernels)
        return "fused"

    def _fused_draw(self) -> FusedDraw | None:
        """Return the fused draw when the step uses it (built again in a worker process).

        At a chain's first draw Numba's generator, which the fused draw uses, is seeded from
        the chain's generator, so that a chain is reproducible from its seed.
        """
        if self.draw_path != "fused":
            return None
        if self._fused is None:
            self._fused = FusedDraw(self)
        if self._seed_fused:
            seed_fused_draws(self.rng)
            self._seed_fused = False
        return self._fused

    def __repr__(self) -> str:
        """Describe the step as its defaults resolved: proposal, estimator, batch, draw path."""
        names = ", ".join(str(var.name) for var in self.vars)
        return (
            f"{type(self).__name__}(vars=[{names}], proposal={self.proposal_kind!r}, "
            f"control_variate={self.control_variate!r}, batch_size={self.batch_size}, "
            f"temperature={self.temperature:g}, draw_path={self.draw_path!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the fused draw's compiled code, which a worker loads from its cache."""
        state = self.__dict__.copy()
        state["_fused"] = None
        return state

    def _start_chain(self, tune: bool) -> None:
        super()._start_chain(tune)
        self.test.start_chain(self, tune)
        self._seed_fused = True

    @property
    def _adapt_mass(self) -> bool:
        """Whether the proposal adapts a diagonal mass during tuning (HMC, no covariance)."""
        return isinstance(self.proposal_part, HamiltonianPart) and self.proposal_part.adapts_mass

    def _rebuild_for_data(self) -> None:
        # New data (pm.set_data): new N for the row sampler and the diagnostics, and new
        # gradient and Hessian sums for the control variate, found again when it was automatic.
        self.row_sampler = RowSampler(self.oracles.n_rows, self.oracles.row_proposals())
        self.test.prepare(self)
        if self.control is not None:
            self.control = self._make_control_variate(self._reference_point)
            if self.control is None:  # the automatic search failed on the new data
                self.control_variate = None
                if self.proposal_kind == "independent":
                    self.proposal_kind = "hmc" if self.oracles.rows_depend_on_q else "random_walk"
            proposal_cov = self.proposal_part.proposal_cov  # a proposal_cov the user gave stays
            if self._own_covariance:
                # Without the Laplace covariance an HMC proposal adapts a diagonal mass.
                proposal_cov = (
                    self.control.covariance
                    if self.control is not None and self._laplace_proposal
                    else None
                )
            self.proposal_part = self._make_part(proposal_cov)
            self.proposal = self.proposal_part.build_kernel(self)
        # After the proposal, which they depend on.
        self.strata, self.gradient_strata = make_strata(self)
        self.diagnostics = self._make_diagnostics()
        if self.draw_path == "fused" and (obstacle := fused_obstacle(self)) is not None:
            self._fused, self.draw_path = None, f"python: {obstacle}"

    def _make_diagnostics(self) -> ChainDiagnostics:
        return ChainDiagnostics(
            self.batch_size,
            self.oracles.n_rows,
            warn_fallback=not self.test.exact(self),
            control_variate=self.control is not None,
            can_control=not self.discrete_vars
            and not control_variate_obstacle(self.oracles, self.temperature),
            skewed_posterior=self.laplace_spread > INDEPENDENT_SPREAD,
        )

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """Propose and accept with the subclass's subsampled test."""
        if self.tune and self.steps_until_tune == 0:
            self._adapt_scaling()
        q_old = q0.data
        if self._start_near_reference:
            q_old = self._chain_start(q_old)
        scaling = self.scaling  # the scale this draw uses (HMC tuning updates it per draw)
        fused_draw = self._fused_draw()
        if fused_draw is not None:
            q, stats = fused_draw.draw(q_old, scaling)
            distance_sq = stats.pop("distance_sq")
            # The Python path's reads are counted where it gathers them (model/oracles.py).
            self.oracles.pages.rows_read(stats["n_data"])
        else:
            q, stats = self._python_draw(q_old)
            distance_sq = None
        control = self.control
        accepted = stats["accepted"]
        self.steps_until_tune -= 1
        self.accepted_since_tune += int(accepted)
        stats.update(self._draw_stats())
        stats.update(self.test.setting_values(self))
        stats["scaling"] = scaling
        stats["accepted"] = float(accepted)
        # PyMC's energy_error, H(q', p') - H(q, p): minus the estimated log acceptance ratio,
        # whose proposal part is the kinetic energies' difference (kernels/trajectory.py).
        stats["energy_error"] = (
            -stats["delta_star"] if isinstance(self.proposal_part, HamiltonianPart) else math.nan
        )
        # Rows read outside the draw (re-centring, a test's design) count in its cost, not in
        # the test's own data use that the diagnostics judge.
        test_rows = stats["n_data"]
        stats["n_data"] += self._pending_rows
        self._pending_rows = 0
        if control is None:
            stats["residual_kurtosis"] = stats["reference_distance"] = math.nan
        else:
            if distance_sq is None:
                distance_sq = control.distance_sq(q)
            stats["reference_distance"] = math.sqrt(distance_sq)
            if self.tune and self.recenter:
                self._record_tuning_draw(q)
            far = self._far_limit(control.limit)
            if not self.tune and far is not None and distance_sq > far:
                self.diagnostics.warn_far(distance_sq, far)
        if self.tune:
            self.test.record_tuning_state(self, q)
        else:
            self.diagnostics.record(stats["full_data"], stats["residual_kurtosis"], test_rows)
        return RaveledVars(q, q0.point_map_info), [stats]

    def _python_draw(self, q_old: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Make a draw in Python: the proposal, the estimator and the subclass's test."""
        q_new, log_proposal_ratio = self.proposal_part.propose(self, q_old)
        log_prior_proposal_ratio = self.oracles.log_prior_ratio(q_new, q_old) + log_proposal_ratio
        log_ratio_rows: Callable[[np.ndarray], np.ndarray]
        control = self.control
        if control is None:
            log_ratio_rows = partial(self.oracles.loglik_ratio_rows, q_new, q_old)
        else:
            # Difference estimator: the test sees the residuals l_i - r_i and its threshold
            # moves by the proxies' exact sum R / T (kernels/control_variates.py).
            log_ratio_rows = control.residual_rows(q_new, q_old)
            log_prior_proposal_ratio += control.log_threshold_shift(q_new, q_old)
        decision = self.test.decide(self, log_ratio_rows, log_prior_proposal_ratio)
        if self.tune and self.proposal_part.scaling_rule == "part":
            self.proposal_part.after_decision(self, q_new if decision.accepted else q_old, decision)
        return (q_new if decision.accepted else q_old), decision._asdict()

    def _record_tuning_draw(self, q: np.ndarray) -> None:
        if self._tune_steps % self.tune_interval == 0:
            self._tune_blocks.append(np.zeros(q.size + 1))
        self._tune_blocks[-1][:-1] += q
        self._tune_blocks[-1][-1] += 1
        self._tune_steps += 1

    def stop_tuning(self) -> None:
        """End tuning; with ``recenter="tune"``, re-expand at the mean of the last half of it.

        An HMC proposal keeps the dual averaging's averaged step size from here on.
        """
        super().stop_tuning()
        self.proposal_part.stop_tuning(self)
        self.test.stop_tuning(self)
        if self.control is None or not self.recenter or not self._tune_blocks:
            return
        last_half = np.sum(self._tune_blocks[len(self._tune_blocks) // 2 :], axis=0)
        self._pending_rows += self.control.recenter(last_half[:-1] / last_half[-1])
        if self._laplace_proposal:
            self._reshape_proposal(self.control.covariance)
        self._tune_blocks = []

    def charge_rows(self, n_rows: int) -> None:
        """Count rows read outside a draw (a test's design) in the next draw's ``n_data``."""
        self._pending_rows += n_rows

    def _draw_stats(self) -> dict[str, float]:
        """Stats of the step itself, added to the kernel's."""
        part = self.proposal_part
        trajectory = part.info
        return {
            "batch_size": self.batch_size,
            "n_grad_rows": part.gradient_rows(self),
            "n_steps": trajectory.n_steps,
            "diverging": trajectory.diverging,
            "scaling": float(self.scaling),
            "temperature": self.temperature,
        }

    def _adapt_scaling(self) -> None:
        acceptance = self.accepted_since_tune / self.tune_interval
        if self.proposal_part.scaling_rule == "acceptance":
            self.scaling = self.test.tune(self.scaling, acceptance)
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0

    def reset_tuning(self) -> None:
        """Start a chain: initial proposal scale, counters, reference point and diagnostics."""
        self.scaling = self._initial_scaling
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0
        self.proposal_part.reset(self)
        if self.control is not None and self.control.reset() and self._laplace_proposal:
            self._reshape_proposal(self.control.covariance)
        self._tune_blocks = []
        self._tune_steps = 0
        self._pending_rows = 0
        # Not for a user's proposal, which may keep the chain on a set a Laplace draw leaves.
        self._start_near_reference = self.control is not None and self._user_proposal is None
        self.diagnostics.reset(self._chain_draws)

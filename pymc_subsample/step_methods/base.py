"""What the subsampling steps share: oracles, rows, RNG hooks; and the Metropolis-Hastings layer.

``SubsampleStepBase`` compiles the model's per-row terms and maps PyMC's points; ``SubsampleMH``
composes a proposal (``proposal_parts``), the control variate (``control.py``) and an
acceptance test (``acceptance_tests``) into a draw (``docs/architecture.md``).
"""

from __future__ import annotations

import inspect
import math
import os
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.blocking import DictToArrayBijection, PointType, RaveledVars, StatsType
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator, get_random_generator, get_value_vars_from_user_vars
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.kernels.user_proposal import ProposalFunction, UserProposal
from pymc_subsample.model.checks import discrete_names
from pymc_subsample.model.imputation import imputed_value_vars
from pymc_subsample.model.oracles import ModelOracles, build_oracles
from pymc_subsample.reference import automatic_reference, funnel_explanation
from pymc_subsample.reference_search import Optimum
from pymc_subsample.step_methods.acceptance_tests import (
    AcceptanceTest,
    StatSpec,
    setting_parameters,
)
from pymc_subsample.step_methods.contracts import ProposalKernel
from pymc_subsample.step_methods.control import (
    CONTROL_VARIATES,
    ControlVariate,
    ProxyTermsError,
    reference_vector,
)
from pymc_subsample.step_methods.defaults import (
    AUTO,
    CONTROLLED_BATCH_SIZE,
    DEFAULT_CONTROL_VARIATE,
    INDEPENDENT_SPREAD,
    TRAJECTORY_GRADIENT_ROWS,
    control_variate_obstacle,
    dropped_default_message,
    gradient_obstacle,
)
from pymc_subsample.step_methods.diagnostics import ChainDiagnostics
from pymc_subsample.step_methods.fused_path import FusedDraw, fused_obstacle, seed_fused_draws
from pymc_subsample.step_methods.progress import make_progressbar_updaters, progressbar_config
from pymc_subsample.step_methods.proposal_parts import PROPOSAL_PARTS, ProposalPart, proposal_names
from pymc_subsample.step_methods.proposal_parts.hamiltonian import HamiltonianPart
from pymc_subsample.step_methods.proposal_parts.user import USER_PROPOSAL, user_part
from pymc_subsample.step_methods.warning_relay import (
    WARNING_STAT,
    relay_if_worker,
    relayed_warnings,
)
from pymc_subsample.warnings import warn_user

__all__ = ["STEP_STATS", "SubsampleMH", "SubsampleMHState", "SubsampleStepBase"]

#: With a proposal function, the far-from-reference warning's distance limit is this many times
#: the Gaussian one (``SubsampleMH._far_limit``).
USER_PROPOSAL_FAR_FACTOR = 10.0


@dataclass_state
class SubsampleMHState(StepMethodState):
    """Every adaptive attribute, so that PyMC restores it before each sequential chain."""

    scaling: float
    tune: bool
    steps_until_tune: int
    accepted_since_tune: int


class SubsampleStepBase(ArrayStepShared):
    """A step on the raveled unconstrained vector that reads rows through compiled oracles.

    Every subclass's ``stats_dtypes_shapes`` gains the ``warning`` stat, which carries the
    warnings of a chain run in a worker process to the parent (``warning_relay``).
    """

    default_blocked = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "stats_dtypes_shapes" in cls.__dict__:
            cls.stats_dtypes_shapes = {**cls.stats_dtypes_shapes, **WARNING_STAT}

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None,
        *,
        batch_size: int | None,
        obs_dim: str | None,
        model: pm.Model | None,
        rng: RandomGenerator,
        compile_kwargs: dict[str, Any] | None,
        blocked: bool,
        with_gradients: bool = False,
        proxy_order: int = 0,
        discrete: bool = False,
    ) -> None:
        model = pm.modelcontext(model)
        vars = _step_value_vars(model, vars)
        # None: the subclass chooses once it knows whether a control variate applies.
        self.batch_size = (
            0 if batch_size is None else _check_int("batch_size", batch_size, minimum=2)
        )
        if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
            raise TypeError(
                "compile_kwargs must be a dict such as {'mode': 'NUMBA'}, "
                f"got {compile_kwargs!r}."
            )
        initial_point = model.initial_point()
        self.oracles: ModelOracles = build_oracles(
            model,
            vars,
            initial_point=initial_point,
            obs_dim=obs_dim,
            compile_kwargs=compile_kwargs,
            with_gradients=with_gradients,
            proxy_order=proxy_order,
            discrete=discrete,
        )
        self._initial_point = initial_point
        #: Why the model has no mode in these variables (a centred hierarchy), or "".
        self._funnel = funnel_explanation(model, vars)
        #: Draws after tuning of the current chain, when PyMC says (PyMC 6's setup_chain).
        self._chain_draws: int | None = None
        #: The process that built the step; chains elsewhere relay their warnings to it.
        self._home_pid = os.getpid()
        _warn_row_length_deterministics(model, initial_point, self.oracles.n_rows)
        super().__init__(vars, self.oracles.shared, blocked=blocked, rng=rng)

    @property
    def n_rows(self) -> int:
        """Number of rows N on the row axis."""
        return self.oracles.n_rows

    # PyMC 6 calls setup_chain, PyMC 5 calls set_rng, at the start of every chain (in the worker
    # process too): both seed the chain's generator and re-read data changed by pm.set_data.
    def setup_chain(self, rng: RandomGenerator, tune: int, draws: int) -> None:
        """Use the chain's random generator and the model's current data (PyMC 6 hook)."""
        relay_if_worker(self._home_pid)
        self.rng = get_random_generator(rng, copy=False)
        self._chain_draws = draws
        self._sync_data()
        self._start_chain(tune=tune > 0)

    def set_rng(self, rng: RandomGenerator) -> None:
        """Use the chain's random generator and the model's current data (PyMC 5 hook)."""
        relay_if_worker(self._home_pid)
        self.rng = get_random_generator(rng, copy=False)
        self._sync_data()
        # PyMC 5 does not say whether the chain tunes; its loops call stop_tuning() at draw
        # ``tune``, at once when tune=0, and the sequential loop sets ``tune`` after this call.
        self._start_chain(tune=True)

    def step(self, point: PointType) -> tuple[PointType, StatsType]:
        """Take a step; the ``warning`` stat carries a worker process's warnings to the parent.

        The same mapping as PyMC's ``ArrayStepShared.step`` (``DictToArrayBijection``), made
        cheaper for the draw it wraps (about 3 us of a 30 us draw): a single variable is
        raveled without a copy and the new point's arrays are views of the step's result
        (cast only where the variable's dtype differs). Nothing here or in ``astep`` writes
        into the arrays it is given.
        """
        own = point
        if self.shared:
            for name, shared_var in self.shared.items():
                shared_var.set_value(point[name], borrow=True)
            own = {name: point[name] for name in self.var_names}
        if len(own) == 1:
            ((name, value),) = own.items()
            value = np.asarray(value)
            q = RaveledVars(value.ravel(), ((name, value.shape, value.size, value.dtype),))
        else:
            q = DictToArrayBijection.map(own)
        moved, stats = self.astep(q)
        new_point = point.copy() if self.shared else {}
        data, start = moved.data, 0
        for name, shape, size, dtype in moved.point_map_info:
            value = data[start : start + size].reshape(shape)
            new_point[name] = value if value.dtype == dtype else value.astype(dtype)
            start += size
        stats[0]["warning"] = relayed_warnings()
        return new_point, stats

    def _sync_data(self) -> None:
        if self.oracles.refresh_data():
            self._rebuild_for_data()

    def _rebuild_for_data(self) -> None:
        """Rebuild what depends on the data after ``pm.set_data`` (a subclass extends this)."""

    def _start_chain(self, tune: bool) -> None:
        """Start a chain from the step's initial tuning state, as a fresh step would.

        PyMC's sequential loop calls ``reset_tuning`` after ``setup_chain``, but its parallel
        path does not: a step reused after an earlier ``pm.sample`` (``tune`` off, scale
        adapted, warnings given) would otherwise be pickled into the workers in that state and
        sample a new chain without tuning.
        """
        self.tune = tune
        self.reset_tuning()

    @abstractmethod
    def reset_tuning(self) -> None:
        """Return to the step's state before any tuning, for a new chain."""

    @staticmethod
    def competence(var: Variable, has_grad: bool) -> Competence:
        """Never assigned automatically: the step is approximate and must be chosen knowingly."""
        return Competence.INCOMPATIBLE


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


class SubsampleMH(SubsampleStepBase):
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
    #: The test part this step class decides with (set by the class statement's ``test=``).
    test_class: ClassVar[type[AcceptanceTest] | None] = None

    def __init_subclass__(cls, test: type[AcceptanceTest] | None = None, **kwargs: Any) -> None:
        if test is not None:
            if not (isinstance(test, type) and issubclass(test, AcceptanceTest)):
                raise TypeError(f"test= must be an AcceptanceTest subclass, got {test!r}.")
            cls.test_class = test
            cls.stats_dtypes_shapes = {**test.stats, **test.setting_stats, **STEP_STATS}
            if "__init__" not in cls.__dict__:
                _give_constructor(cls, test)
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
        **test_settings: Any,
    ) -> None:
        #: The test part, built from the test's settings first (they are checked before the
        #: model is compiled).
        self.test: AcceptanceTest = _build_test(type(self), test_settings)
        self.temperature = _check_temperature(temperature)
        self.tune_interval = _check_int("tune_interval", tune_interval, minimum=1)
        requested_proposal = _check_proposal(proposal, proposal_cov)
        requested = _check_choice("control_variate", control_variate, (AUTO, *CONTROL_VARIATES))
        self.recenter = _check_choice("recenter", recenter, (None, "tune"))
        if requested is None and (reference_point is not None or recenter):
            raise ValueError(
                "reference_point and recenter apply to control variates: pass "
                "control_variate='taylor1' or 'taylor2' as well (or leave the default, 'auto')."
            )
        #: The step's discrete variables: sampled only by a proposal function that keeps them
        #: on their support (a reversible-jump proposal), without a control variate.
        self.discrete_vars = discrete_names(_step_value_vars(model, vars))
        if self.discrete_vars:
            _check_discrete_request(self.discrete_vars, requested_proposal, requested)
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
        self.row_sampler = RowSampler(self.oracles.n_rows)  # 8 bytes per row, allocated once
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
            self.control = self._make_control_variate(reference_point)
            if self.control is None:
                self.control_variate = None
            elif self._laplace_proposal:
                proposal_cov = self.control.covariance
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
        self._initial_scaling = _check_scaling(scaling, n_params, self.proposal_part)
        if self._user_proposal is not None:
            initial = reference_vector(self._initial_point, self.vars, self._initial_point)
            self._user_proposal.check(np.random.default_rng(0), initial, self._initial_scaling)
        self.scaling = self._initial_scaling
        self.tune = True
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0
        self._fused: FusedDraw | None = None
        self._seed_fused = True
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

    @property
    def _laplace_proposal(self) -> bool:
        """Whether the proposal uses the control variate's Laplace covariance.

        Where the step chose the covariance and its control variate is expanded in ``q``; in
        the likelihood's parameters the Laplace covariance at the mode describes the posterior
        badly, and an HMC proposal adapts a diagonal mass instead.
        """
        return (
            self._own_covariance
            and self.control is not None
            and self.oracles.expansion == "unconstrained"
        )

    def _far_limit(self, limit: float) -> float | None:
        """Return the squared distance from the reference beyond which to warn (None: never).

        The Gaussian limit where the Laplace approximation describes the posterior; with a
        proposal function, which may keep the chain on a set (a manifold) that approximation
        does not describe, ``USER_PROPOSAL_FAR_FACTOR`` times farther: a reference point on
        another copy of the mode than the chain's (``examples/ica_stiefel.py``) is hundreds of
        sds away. None where the search measured the posterior skewed.
        """
        if self.laplace_spread > INDEPENDENT_SPREAD:
            return None
        if self._user_proposal is not None:
            return USER_PROPOSAL_FAR_FACTOR**2 * limit
        return limit

    def _rebuild_for_data(self) -> None:
        # New data (pm.set_data): new N for the row sampler and the diagnostics, and new
        # gradient and Hessian sums for the control variate, found again when it was automatic.
        self.row_sampler = RowSampler(self.oracles.n_rows)
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
        )

    def _resolve_control_variate(self, requested: str | None, reference_point: Any) -> str | None:
        """Choose the control variate: ``requested``, or for "auto" taylor2 where it applies.

        Where the default cannot apply the step runs without and says why, once
        (``step_methods/defaults.py``); a ``reference_point`` given with it is an error then.
        """
        if requested != AUTO:
            return requested
        obstacle = control_variate_obstacle(self.oracles, self.temperature)
        if obstacle is None:
            return DEFAULT_CONTROL_VARIATE
        if reference_point is not None:
            raise ValueError(
                f"reference_point was given but no control variate can be used: {obstacle}."
                if obstacle
                else "reference_point was given for a tempered posterior (temperature != 1), "
                "where control_variate='auto' uses none: pass control_variate='taylor2'."
            )
        self._drop_default(obstacle)
        return None

    def _drop_default(self, reason: str) -> None:
        if reason:
            self.dropped_default = reason
            warn_user(dropped_default_message(type(self).__name__, reason))

    def _make_control_variate(self, reference_point: Any) -> ControlVariate | None:
        """Expand at ``reference_point``, or at the automatic reference when it is None.

        With ``control_variate="auto"`` a failed automatic search drops the control variate
        (returns None, with a warning), or expands it in the likelihood's parameters at a mode
        that fails only the Laplace check; an explicit control variate refuses it. Called
        again after ``pm.set_data``, it decides afresh for the new data.
        """
        self.oracles = self.oracles.in_unconstrained()
        optimum = (
            automatic_reference(self.oracles, self._funnel)
            if reference_point is None
            else self._measured_reference(reference_point)
        )
        if optimum is not None:
            if optimum.failure is not None:
                if self._automatic and optimum.at_mode:
                    control = self._likelihood_control_variate(optimum)
                    if control is not None:
                        return control
                if reference_point is not None:  # the user's point: refused with its failure
                    reference_vector(reference_point, self.vars, self._initial_point)
                if self._automatic:
                    self._drop_default(
                        f"the search for a reference point failed: {optimum.failure}"
                    )
                    return None
                raise ValueError(
                    f"The step's search for a reference point failed: {optimum.failure}. "
                    "pms.find_reference_point() names the cause in hierarchical models."
                )
            self.reference_rows = optimum.n_row_evaluations if reference_point is None else 0
            self.laplace_spread = optimum.laplace_log_weight_sd
            reference, row_sums = optimum.q, optimum.row_sums  # the search's own pass
        else:
            reference = reference_vector(reference_point, self.vars, self._initial_point)
            row_sums = None  # the point may come from other data: one pass here
        try:
            control = ControlVariate(self.oracles, reference, self.temperature, row_sums)
        except ProxyTermsError as error:
            if self._automatic:
                self._drop_default(str(error))
                return None
            raise ValueError(
                f"control_variate={self.control_variate!r} cannot be used on this model: {error}. "
                "Pass control_variate=None."
            ) from error
        if control.n_clipped:
            warn_user(
                f"The log posterior's Hessian at the reference point has {control.n_clipped} "
                "non-negative eigenvalue(s): the point is not near a mode, so the Laplace "
                "proposal covariance was clipped and the Taylor proxies will be poor. Use "
                "pms.find_reference_point or pass proposal_cov.",
            )
        return control

    def _measured_reference(self, reference_point: Any) -> Optimum | None:
        """Return a passed search result as the step's own search would have, or None.

        A :class:`~pymc_subsample.ReferencePoint` over exactly the step's variables carries
        what the search measured there (the Laplace check, whether it is a mode): the step
        then chooses its control variate and proposal as it would from its own search
        (issue 37, item 4). Its row sums are not reused (the point may come from other
        data: one pass here). None for a plain dict, or a result over other variables,
        whose Laplace check described another posterior.
        """
        point = getattr(reference_point, "point", None)
        names = [str(var.name) for var in self.vars]
        if not isinstance(reference_point, Optimum) or point is None or set(point) != set(names):
            return None
        ordered = {name: point[name] for name in names}
        q = reference_vector(ordered, self.vars, self._initial_point)
        return replace(reference_point, q=q, row_sums=None)

    def _likelihood_control_variate(self, optimum: Optimum) -> ControlVariate | None:
        """Expand in the likelihood's parameters at a mode whose Laplace check failed.

        A non-centred hierarchy's posterior in ``q`` is a curved ridge, which a Taylor proxy in
        ``q`` cannot follow; its likelihood reads only the group effects ``a = mu + sd * z``
        (and the other parameters the rows see), on which the data put a close-to-Gaussian
        posterior. Expanded in those (``model/likelihood_parameters.py``), around ``phi`` of
        the mode, the second-order proxies hold where the chain goes. None where the model has
        no such parameters (no more of them than ``q``), or their proxies fail the check of
        :class:`ControlVariate`. The proposal does not use the (poor) Laplace covariance.
        """
        oracles = self.oracles.in_likelihood_parameters()
        if oracles is None:
            return None
        try:
            control = ControlVariate(oracles, optimum.q, self.temperature, optimum.row_sums)
        except ProxyTermsError:
            return None
        self.oracles = oracles
        self.reference_rows = optimum.n_row_evaluations
        self.laplace_spread = optimum.laplace_log_weight_sd
        return control

    def _resolve_proposal(self, requested: str, proposal_cov: ArrayLike | None) -> str:
        """Choose the proposal: ``requested``, or for "auto" the independent or random walk.

        "auto" is the independent proposal from the Laplace approximation where the automatic
        reference search found that approximation close (``INDEPENDENT_SPREAD``), no
        ``proposal_cov`` was given and the step samples every free variable of the model; else
        Hamiltonian trajectories, or the random walk for a step over variables no row reads
        (whose target is their prior given the rest, cheap to explore) and for a tempered
        posterior without a control variate on more than ``TRAJECTORY_GRADIENT_ROWS`` rows
        (whose tests read few rows, where the trajectory's gradient would read many). In a
        compound step the others move, and with them the conditional posterior: a proposal
        fixed at its Laplace approximation for their first values would stay valid but could
        stop being accepted.
        """
        if requested in PROPOSAL_PARTS:
            obstacle = PROPOSAL_PARTS[requested].obstacle(self)
            if obstacle is not None:
                raise ValueError(f"proposal={requested!r} cannot be used here: {obstacle}.")
        if requested != "auto":
            return requested
        close = self.laplace_spread <= INDEPENDENT_SPREAD  # False for NaN (no search)
        alone = not self.oracles.shared  # no other model variable in the step's density
        if self.control is not None and self._laplace_proposal and close and alone:
            return "independent"
        minibatch_gradient_only = self.control is None and self.temperature != 1.0
        if self.oracles.rows_depend_on_q and not (
            minibatch_gradient_only and self.oracles.n_rows > TRAJECTORY_GRADIENT_ROWS
        ):
            obstacle = gradient_obstacle(self.oracles)
            if obstacle is None:
                return "hmc"
            warn_user(
                f"{type(self).__name__} uses the random-walk proposal instead of its default "
                f"Hamiltonian trajectories: {obstacle}."
            )
        return "random_walk"

    def _make_part(self, proposal_cov: ArrayLike | None) -> ProposalPart:
        """Return the part of ``proposal_kind`` (the user's function's, for a function)."""
        if self._user_proposal is not None:
            return user_part(self._user_proposal)
        return PROPOSAL_PARTS[self.proposal_kind](proposal_cov)

    def _reshape_proposal(self, proposal_cov: ArrayLike | None) -> None:
        """Rebuild the proposal's kernel with a new covariance (the Laplace one moved)."""
        self.proposal_part.proposal_cov = proposal_cov
        self.proposal = self.proposal_part.build_kernel(self)

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

    def _chain_start(self, q: np.ndarray) -> np.ndarray:
        """Where a chain with a control variate starts: near the reference point.

        A start beyond the reference's chi-square(d) 1 - 1e-6 Mahalanobis limit (the model's
        initial point, typically) makes every draw's test read most rows until the chain
        arrives: Barker with a control variate read ~182,000 of 1e6 rows per draw for its first
        500 draws. Such a start, where the Laplace approximation puts probability below 1e-6,
        is replaced by a draw from the Laplace approximation at the reference (each chain its
        own, from its own generator); a nearer start, such as ``initvals=ref.initvals``, is
        kept. Only at a chain's first draw, with or without tuning (``tune=0`` would otherwise
        keep the whole approach to the posterior among its draws).
        """
        self._start_near_reference = False
        control = self.control
        if control is None or control.distance_sq(q) <= control.limit:
            return q
        start = control.laplace_draw(self.rng)
        return start if np.isfinite(self.oracles.log_prior(start)) else control.reference

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


def _step_value_vars(
    model: pm.Model | None, vars: Sequence[TensorVariable] | None
) -> list[TensorVariable]:
    """Return the value variables a step samples: ``vars``, else all the model's.

    Imputed missing values (``y_unobserved``) are left to PyMC's own step by default.
    """
    model = pm.modelcontext(model)
    if vars is None:
        imputed = imputed_value_vars(model)
        return [value for value in model.value_vars if value not in imputed]
    return list(get_value_vars_from_user_vars(vars, model))


def _check_discrete_request(names: list[str], proposal: str, control_variate: str | None) -> None:
    """Refuse discrete variables unless a proposal function moves them, without control variate."""
    if proposal != USER_PROPOSAL:
        raise ValueError(
            f"Discrete variables {names} cannot be moved by proposal={proposal!r}, which is "
            "continuous. Pass only continuous variables in `vars` and let pm.sample assign "
            "another step to the discrete ones (pms.AusterityGibbs for pm.Bernoulli, "
            "pm.CategoricalGibbsMetropolis, pm.Metropolis), or use pms.ReversibleJumpMH for "
            "variable selection, or give a proposal function that keeps them on their support."
        )
    if control_variate not in (AUTO, None):
        raise ValueError(
            f"control_variate={control_variate!r} needs gradients, and the step samples discrete "
            f"variables {names}: pass control_variate=None."
        )


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def _check_proposal(proposal: Any, proposal_cov: ArrayLike | None) -> str:
    """Return the requested proposal's name, ``USER_PROPOSAL`` for a function."""
    if isinstance(proposal, str) or not callable(proposal):
        if not isinstance(proposal, str):
            raise TypeError(
                f"proposal must be one of {proposal_names()} or a function (rng, q, scaling) -> "
                f"(q_new, log_proposal_ratio), got {proposal!r}."
            )
        return str(_check_choice("proposal", proposal, proposal_names()))
    if proposal_cov is not None:
        raise ValueError(
            "proposal_cov shapes the package's own proposals; a proposal function draws with "
            "its own spread: leave proposal_cov out (the function gets the tuned `scaling`)."
        )
    return USER_PROPOSAL


def _check_choice(name: str, value: Any, options: tuple[Any, ...]) -> Any:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}.")
    return value


def _check_temperature(temperature: float) -> float:
    value = float(temperature)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(
            f"temperature must be a positive finite number, got {temperature!r}. It divides "
            "the log-likelihood: 1 is the untempered posterior."
        )
    return value


def _check_scaling(scaling: float | None, n_params: int, part: ProposalPart) -> float:
    if scaling is None:
        return part.default_scaling(n_params)
    value = float(scaling)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"scaling must be a positive finite number, got {scaling!r}.")
    return value


def _warn_row_length_deterministics(
    model: pm.Model, initial_point: dict[str, np.ndarray], n_rows: int
) -> None:
    if not model.deterministics:
        return
    shape_graphs = model.replace_rvs_by_values([det.shape for det in model.deterministics])
    shapes = model.compile_fn(
        shape_graphs, inputs=model.value_vars, point_fn=True, on_unused_input="ignore"
    )(initial_point)
    long = [
        det.name
        for det, shape in zip(model.deterministics, shapes, strict=True)
        if len(shape) > 0 and shape[0] == n_rows
    ]
    if long:
        warn_user(
            f"Deterministics {long} have one entry per row; PyMC evaluates them in full at every "
            "recorded draw, which costs O(N) whatever the step does. Leave them out with "
            "pm.sample(var_names=[...]) and compute them afterwards if needed.",
        )


def _build_test(step_class: type[SubsampleMH], settings: dict[str, Any]) -> AcceptanceTest:
    """Build the step class's test from the constructor's remaining keyword arguments."""
    test = step_class.test_class
    if test is None:
        raise TypeError(
            f"{step_class.__name__} has no acceptance test: use pms.AusterityMH or "
            "pms.MinibatchBarkerMH, or make a step with class MyMH(pms.SubsampleMH, test=MyTest)."
        )
    known = {parameter.name for parameter in setting_parameters(test)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(
            f"{step_class.__name__} got unexpected keyword argument(s) {unknown}; its test "
            f"{test.__name__} takes {sorted(known) or 'none'}."
        )
    return test(**settings)


def _give_constructor(step_class: type[SubsampleMH], test: type[AcceptanceTest]) -> None:
    """Give ``step_class`` a constructor whose signature names the test's settings too.

    The constructor is ``SubsampleMH.__init__``; only its signature (what ``help``, IDEs and
    the API docs show) gains the test's keyword arguments after ``vars``.
    """

    def __init__(self: SubsampleMH, vars: Any = None, **settings: Any) -> None:
        SubsampleMH.__init__(self, vars, **settings)

    base = list(inspect.signature(SubsampleMH.__init__).parameters.values())
    own = [p for p in base if p.kind is not inspect.Parameter.VAR_KEYWORD]
    signature = inspect.Signature([*own[:2], *setting_parameters(test), *own[2:]])
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{step_class.__qualname__}.__init__"
    __init__.__doc__ = f"Build the step; see :class:`{step_class.__name__}` for the arguments."
    setattr(step_class, "__init__", __init__)  # noqa: B010

"""What the subsampling steps share: oracles, rows, RNG hooks; and the Metropolis-Hastings layer.

A subclass supplies ``_decide(log_ratio_rows, log_prior_proposal_ratio)``, which runs its test
kernel and returns a NamedTuple whose fields are stat names, and declares those stats (plus
those of ``_draw_stats``: ``n_grad_rows``, ``scaling``, ``temperature``) in
``stats_dtypes_shapes``.
"""

from __future__ import annotations

import warnings
from abc import abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.blocking import RaveledVars
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence, StepMethodState
from pymc.step_methods.metropolis import tune as tune_scaling
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator, get_random_generator, get_value_vars_from_user_vars
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.proposals import LangevinProposal, RandomWalkProposal
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.model.oracles import ModelOracles, build_oracles
from pymc_subsample.step_methods.progress import make_progressbar_updaters, progressbar_config
from pymc_subsample.warnings import SubsampleWarning

__all__ = ["PROPOSALS", "SubsampleMHState", "SubsampleMetropolisBase", "SubsampleStepBase"]

#: Proposal kinds of the Metropolis-Hastings steps.
PROPOSALS = ("random_walk", "langevin")


class TestDecision(Protocol):
    """What a test kernel returns: a NamedTuple of stats with at least ``accepted``."""

    @property
    def accepted(self) -> bool:
        """Whether the proposal was accepted."""

    def _asdict(self) -> dict[str, Any]: ...


@dataclass_state
class SubsampleMHState(StepMethodState):
    """Every adaptive attribute, so that PyMC restores it before each sequential chain."""

    scaling: float
    tune: bool
    steps_until_tune: int
    accepted_since_tune: int


class SubsampleStepBase(ArrayStepShared):
    """A step on the raveled unconstrained vector that reads rows through compiled oracles."""

    default_blocked = True

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None,
        *,
        batch_size: int,
        obs_dim: str | None,
        model: pm.Model | None,
        rng: RandomGenerator,
        compile_kwargs: dict[str, Any] | None,
        blocked: bool,
        with_gradients: bool = False,
    ) -> None:
        model = pm.modelcontext(model)
        vars = model.value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
        self.batch_size = _check_int("batch_size", batch_size, minimum=2)
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
        )
        _warn_row_length_deterministics(model, initial_point, self.oracles.n_rows)
        super().__init__(vars, self.oracles.shared, blocked=blocked, rng=rng)

    @property
    def n_rows(self) -> int:
        """Number of rows N on the row axis."""
        return self.oracles.n_rows

    # PyMC 6 calls setup_chain, PyMC 5 calls set_rng: both seed the chain's generator.
    def setup_chain(self, rng: RandomGenerator, tune: int, draws: int) -> None:
        """Use the chain's random generator (PyMC 6 hook)."""
        self.rng = get_random_generator(rng, copy=False)

    def set_rng(self, rng: RandomGenerator) -> None:
        """Use the chain's random generator (PyMC 5 hook)."""
        self.rng = get_random_generator(rng, copy=False)

    @staticmethod
    def competence(var: Variable, has_grad: bool) -> Competence:
        """Never assigned automatically: the step is approximate and must be chosen knowingly."""
        return Competence.INCOMPATIBLE


class SubsampleMetropolisBase(SubsampleStepBase):
    """Metropolis-Hastings whose accept test looks at a subset of the rows.

    The proposal is a random walk or a Langevin step on a minibatch gradient (``proposal``).
    """

    _state_class = SubsampleMHState
    _progressbar_config = staticmethod(progressbar_config)
    _make_progressbar_update_functions = staticmethod(make_progressbar_updaters)
    #: Maps (scaling, acceptance over the last interval) to the new scaling during tuning.
    _tune_rule: Callable[[float, float], float] = staticmethod(tune_scaling)

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None = None,
        *,
        batch_size: int,
        temperature: float,
        proposal: str,
        scaling: float | None,
        proposal_cov: ArrayLike | None,
        tune_interval: int,
        obs_dim: str | None,
        model: pm.Model | None,
        rng: RandomGenerator,
        compile_kwargs: dict[str, Any] | None,
        blocked: bool = True,
    ) -> None:
        self.temperature = _check_temperature(temperature)
        self.tune_interval = _check_int("tune_interval", tune_interval, minimum=1)
        self.langevin = _check_choice("proposal", proposal, PROPOSALS) == "langevin"
        super().__init__(
            vars,
            batch_size=batch_size,
            obs_dim=obs_dim,
            model=model,
            rng=rng,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
            with_gradients=self.langevin,
        )
        self.row_sampler = RowSampler(self.oracles.n_rows)  # 8 bytes per row, allocated once
        n_params = self.oracles.n_params
        self.proposal: RandomWalkProposal | LangevinProposal
        if self.langevin:
            self.proposal = LangevinProposal(n_params, proposal_cov)
        else:
            self.proposal = RandomWalkProposal(n_params, proposal_cov)
        self._initial_scaling = _check_scaling(scaling, n_params, langevin=self.langevin)
        self.scaling = self._initial_scaling
        self.tune = True
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0
        if self.batch_size >= self.oracles.n_rows:
            warnings.warn(
                f"batch_size={self.batch_size} >= N={self.oracles.n_rows} rows: every test uses "
                "all rows and is the exact test, without subsampling. Use a smaller batch_size "
                "to subsample.",
                SubsampleWarning,
                stacklevel=3,
            )

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """Propose and accept with the subclass's subsampled test."""
        if self.tune and self.steps_until_tune == 0:
            self._adapt_scaling()
        q_old = q0.data
        q_new, log_proposal_ratio = self._propose(q_old)
        log_prior_proposal_ratio = self.oracles.log_prior_ratio(q_new, q_old) + log_proposal_ratio
        decision = self._decide(
            partial(self.oracles.loglik_ratio_rows, q_new, q_old), log_prior_proposal_ratio
        )
        self.steps_until_tune -= 1
        self.accepted_since_tune += int(decision.accepted)
        stats = {**decision._asdict(), **self._draw_stats()}
        q = q_new if decision.accepted else q_old
        return RaveledVars(q, q0.point_map_info), [stats]

    def _propose(self, q_old: np.ndarray) -> tuple[np.ndarray, float]:
        if isinstance(self.proposal, RandomWalkProposal):
            return self.proposal(self.rng, q_old, self.scaling)
        # Eq. 21 of Korattikara et al. (2016): one minibatch X_n, drawn with replacement
        # (an unbiased gradient estimate at O(n)), independent of the rows the test draws,
        # and used for the gradient at both q and q'.
        rows = self.rng.integers(0, self.n_rows, size=self.batch_size)
        gradient = partial(self.oracles.minibatch_gradient, rows=rows, temperature=self.temperature)
        return self.proposal(self.rng, q_old, self.scaling, gradient)

    @abstractmethod
    def _decide(
        self, log_ratio_rows: Callable[[np.ndarray], np.ndarray], log_prior_proposal_ratio: float
    ) -> TestDecision:
        """Run the subclass's test kernel; the result's fields are stat names."""

    def _draw_stats(self) -> dict[str, float]:
        """Stats of the step itself, added to the kernel's."""
        return {
            "n_grad_rows": 2 * self.batch_size if self.langevin else 0,
            "scaling": float(self.scaling),
            "temperature": self.temperature,
        }

    def _adapt_scaling(self) -> None:
        acceptance = self.accepted_since_tune / self.tune_interval
        self.scaling = float(self._tune_rule(self.scaling, acceptance))
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0

    def reset_tuning(self) -> None:
        """Return the adaptive proposal scale and counters to their initial values."""
        self.scaling = self._initial_scaling
        self.steps_until_tune = self.tune_interval
        self.accepted_since_tune = 0


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def _check_choice(name: str, value: str, options: tuple[str, ...]) -> str:
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


def _check_scaling(scaling: float | None, n_params: int, *, langevin: bool) -> float:
    if scaling is None:
        if langevin:
            # Roberts and Rosenthal (1998): 1.65 / d^(1/6) for Langevin on the posterior scale.
            return 1.65 / n_params ** (1 / 6)
        # Roberts, Gelman and Gilks (1997): 2.38 / sqrt(d) for a proposal on the posterior scale.
        return 2.38 / np.sqrt(n_params)
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
        warnings.warn(
            f"Deterministics {long} have one entry per row; PyMC evaluates them in full at every "
            "recorded draw, which costs O(N) whatever the step does. Leave them out with "
            "pm.sample(var_names=[...]) and compute them afterwards if needed.",
            SubsampleWarning,
            stacklevel=4,
        )

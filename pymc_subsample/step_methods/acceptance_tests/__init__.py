"""The acceptance test of a subsampled Metropolis-Hastings step, as a part.

A step is a proposal (``proposal_parts``), an estimator of the log-likelihood ratio (the
minibatch mean of the ``l_i``, or of a control variate's residuals, ``step_methods/control.py``)
and a test, which decides from rows it draws whether to accept. A test is an
:class:`AcceptanceTest` subclass: its settings are its constructor's arguments, it returns a
NamedTuple whose fields are the step's stat names, and one class statement makes a PyMC step
of it::

    class PenaltyMH(pms.SubsampleMH, test=PenaltyTest):
        name = "penalty_mh"

whose constructor takes the test's settings next to every setting of
:class:`~pymc_subsample.SubsampleMH` (``docs/architecture.md``, "Tests", works this example).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pymc.step_methods.metropolis import tune as tune_scaling

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import FusedTest, StepView, TestDecision

__all__ = ["REQUIRED_FIELDS", "AcceptanceTest"]

#: Fields every decision has: the step reads them to tune, report cost and warn.
REQUIRED_FIELDS = ("accepted", "n_data", "full_data", "delta_star", "residual_kurtosis")

#: dtype and shape of one stat, as PyMC's ``stats_dtypes_shapes`` has them.
StatSpec = tuple[type, list[int]]


class AcceptanceTest(ABC):
    """How a subsampled Metropolis-Hastings step decides: draw rows, estimate, accept or not.

    A subclass sets :attr:`decision` and :attr:`stats` and implements :meth:`decide`; the other
    methods have defaults for a test that tunes the proposal scale by PyMC's Metropolis rule.
    The constructor's keyword arguments are the test's settings (validate them there): a step
    made with ``class MyMH(SubsampleMH, test=MyTest)`` takes them as its own.
    """

    #: The NamedTuple type :meth:`decide` returns; its fields are stat names and include
    #: :data:`REQUIRED_FIELDS`.
    decision: ClassVar[type]
    #: dtype and shape of every field of :attr:`decision` (PyMC's ``stats_dtypes_shapes``).
    stats: ClassVar[dict[str, StatSpec]]
    #: The decision's field names, in order (set from :attr:`decision`).
    fields: ClassVar[tuple[str, ...]] = ()
    #: The step's ``batch_size`` default without a control variate (with one it is 100).
    uncontrolled_batch_size: ClassVar[int] = 100
    #: Stats of the test's settings, the same at every draw of a chain's phase (a designed
    #: test's chosen tolerance); :meth:`setting_values` gives them.
    setting_stats: ClassVar[dict[str, StatSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "decision" not in cls.__dict__:
            return
        fields = tuple(getattr(cls.decision, "_fields", ()))
        missing = [field for field in REQUIRED_FIELDS if field not in fields]
        if missing:
            raise TypeError(
                f"{cls.__name__}.decision must be a NamedTuple with the fields {REQUIRED_FIELDS}; "
                f"it lacks {missing}."
            )
        if set(cls.stats) != set(fields):
            raise TypeError(
                f"{cls.__name__}.stats must give a (dtype, shape) for each field of its decision "
                f"{fields}, got {tuple(cls.stats)}."
            )
        cls.fields = fields

    @abstractmethod
    def decide(
        self,
        step: StepView,
        log_ratio_rows: Callable[[np.ndarray], np.ndarray],
        log_prior_proposal_ratio: float,
    ) -> TestDecision:
        """Decide one proposal.

        Parameters
        ----------
        step : StepView
            The step: its ``rng``, ``row_sampler`` (rows without replacement within a test;
            call ``start_test()`` first), ``batch_size``, ``temperature`` and ``n_rows``.
        log_ratio_rows : callable
            ``log_ratio_rows(rows)``: the estimator's values for the int64 ``rows`` (the
            ``l_i``, or a control variate's residuals), untempered.
        log_prior_proposal_ratio : float
            Everything the rows do not give: ``log rho(q') - log rho(q)`` plus the log
            proposal ratio plus the control variate's exact sum over T. The log acceptance
            ratio is ``(N / T) mean(l_i over all rows) + log_prior_proposal_ratio``. Not finite
            means a non-finite proposal: reject it.

        Returns
        -------
        TestDecision
            A :attr:`decision`; ``n_data`` counts the rows read, and ``full_data`` is True
            exactly when they were all N.
        """

    #: Whether the test samples the rows by group where the step has strata (``step.strata``,
    #: ``kernels/stratified.py``); a test that does reads them in :meth:`decide`.
    reads_strata: ClassVar[bool] = False

    def exact(self, step: StepView) -> bool:
        """Whether every decision reads all rows by request (no fallback warning then)."""
        return False

    def prepare(self, step: StepView) -> None:  # noqa: B027 (a hook: nothing by default)
        """Fit the test to the step's rows, once its batch is resolved and after new data."""

    def start_chain(self, step: StepView, tune: bool) -> None:  # noqa: B027 (a hook: nothing by default)
        """Start a chain (``tune``: whether it tunes first)."""

    def record_tuning_state(self, step: StepView, q: np.ndarray) -> None:  # noqa: B027 (a hook: nothing by default)
        """See the chain's point after a tuning draw."""

    def stop_tuning(self, step: StepView) -> None:  # noqa: B027 (a hook: nothing by default)
        """Tuning has ended: fix what the test adapts."""

    def setting_values(self, step: StepView) -> dict[str, Any]:
        """Return the values of :attr:`setting_stats` for this draw."""
        return {}

    def fused(self, step: StepView) -> FusedTest | None:
        """Return the test as the fused draw runs it, or None to run it in Python."""
        return None

    def tune(self, scaling: float, acceptance: float) -> float:
        """Return the proposal scale after a tuning interval with this acceptance rate."""
        return float(tune_scaling(scaling, acceptance))

    def acceptance_statistic(self, decision: TestDecision) -> float:
        """Return what the HMC step size's dual averaging aims at 0.8: the decision itself."""
        return float(decision.accepted)


def setting_parameters(test: type[AcceptanceTest]) -> list[inspect.Parameter]:
    """Return the keyword settings of ``test``'s constructor, as a step takes them."""
    parameters = list(inspect.signature(test.__init__).parameters.values())[1:]
    for parameter in parameters:
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{test.__name__}.__init__ must name its settings, without *args.")
        if parameter.default is inspect.Parameter.empty:
            raise TypeError(
                f"{test.__name__}.__init__'s setting {parameter.name!r} needs a default: a step "
                "built with no arguments uses the defaults."
            )
    return [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY) for parameter in parameters]

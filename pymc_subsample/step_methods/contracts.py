"""What a step's parts read and write of the step (``docs/architecture.md``, "Contracts").

A Metropolis-Hastings step (:class:`~pymc_subsample.SubsampleMH` and the steps made of it)
is assembled from parts: a proposal (``proposal_parts``), an acceptance test
(``acceptance_tests``) and the fused draw (``fused_path``). The step calls each part with
itself, and the part reads the step through :class:`StepView`: the members named here and
nothing else. So the parts import no step module (not even for type hints), a step module
imports its parts without an import circle, and a new part can be written against this page
alone. ``tests/test_import_graph.py`` keeps it so.

The module also holds the two values the parts pass each other through the step: a test's
decision (:class:`TestDecision`, which a proposal tunes from) and a test as the fused draw
runs it (:class:`FusedTest`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from pymc_subsample.kernels.correction import CorrectionDistribution
    from pymc_subsample.kernels.row_sampler import RowSampler
    from pymc_subsample.kernels.stratified import Strata
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.control import ControlVariate

__all__ = ["FusedTest", "ProposalKernel", "StepProposal", "StepTest", "StepView", "TestDecision"]

#: A proposal's numerics, ``(rng, q, scaling, ...) -> (q_new, log_proposal_ratio, ...)``: the
#: classes of ``kernels/proposals.py`` and ``kernels/trajectory.py``, or the user's function.
ProposalKernel = Callable[..., Any]


class TestDecision(Protocol):
    """What a test returns: a NamedTuple of stats, with at least the fields the step reads.

    ``acceptance_tests.REQUIRED_FIELDS`` lists them: ``accepted``, ``n_data``, ``full_data``,
    ``delta_star`` and ``residual_kurtosis``.
    """

    @property
    def accepted(self) -> bool:
        """Whether the proposal was accepted."""

    @property
    def delta_star(self) -> float:
        """The estimate of the log acceptance ratio the decision was made on."""

    @property
    def full_data(self) -> bool:
        """Whether the test read every row (then it was exact)."""

    def _asdict(self) -> dict[str, Any]: ...


class FusedTest(NamedTuple):
    """A test as the fused draw runs it (``kernels/fused.py``): only the package's own tests."""

    #: ``kernels.fused.AUSTERITY`` or ``kernels.fused.BARKER``.
    kind: int
    #: The t-test's error tolerance, or one per stage (unused by Barker).
    error_tolerance: float | np.ndarray
    #: Barker's correction distribution (None for the t-test).
    correction: CorrectionDistribution | None


@runtime_checkable
class StepTest(Protocol):
    """The step's acceptance test as the other parts read it (the fused draw, a proposal).

    Every :class:`~pymc_subsample.AcceptanceTest` is one; the step itself calls the rest of
    the test's methods (``acceptance_tests/__init__.py``).
    """

    @property
    def fields(self) -> tuple[str, ...]:
        """The decision's field names, in order: the stats the fused draw fills."""

    @property
    def reads_strata(self) -> bool:
        """Whether the test samples the rows by group where the step has ``strata``."""

    def exact(self, step: StepView) -> bool:
        """Whether every decision reads all rows by request.

        Parameters
        ----------
        step : StepView
            The step the test decides for.

        Returns
        -------
        bool
        """

    def fused(self, step: StepView) -> FusedTest | None:
        """Return the test as the fused draw runs it, or None to run it in Python.

        Parameters
        ----------
        step : StepView
            The step the test decides for.

        Returns
        -------
        FusedTest or None
            The test's kind and settings for ``kernels/fused.py``.
        """

    def acceptance_statistic(self, decision: TestDecision) -> float:
        """Return what the HMC step size's dual averaging aims at 0.8 for ``decision``.

        Parameters
        ----------
        decision : TestDecision
            A tuning draw's decision.

        Returns
        -------
        float
            The decision itself, or for Barker the Metropolis acceptance probability of its
            estimate.
        """


@runtime_checkable
class StepProposal(Protocol):
    """The step's proposal part as the acceptance tests read it (a designed test proposes).

    Every :class:`~pymc_subsample.ProposalPart` is one.
    """

    def propose(self, step: StepView, q: np.ndarray) -> tuple[np.ndarray, float]:
        """Propose from ``q``.

        Parameters
        ----------
        step : StepView
            The step whose kernel, generator and scale the proposal uses.
        q : numpy.ndarray
            The chain's point, the raveled unconstrained vector.

        Returns
        -------
        tuple of numpy.ndarray and float
            ``q'`` and ``log q(q | q') - log q(q' | q)``.
        """


@runtime_checkable
class StepView(Protocol):
    """A Metropolis-Hastings step, as its parts read and write it.

    The proposal parts, the acceptance tests and the fused draw are called with the step and
    use exactly these members; :class:`~pymc_subsample.SubsampleMH` has them all. Three are
    written by parts: :attr:`scaling` (a proposal that tunes itself), :attr:`proposal` (a
    proposal that adapts its mass) and :attr:`batch_size` (a designed test); the rest are
    read. Everything else a part adapts lives in the part (``docs/architecture.md``).
    """

    @property
    def oracles(self) -> ModelOracles:
        """The compiled functions of the raveled vector ``q`` (``model/oracles.py``).

        Per-row log-likelihood ratios and gradients, the prior ratio, N and d
        (``n_rows``, ``n_params``).
        """

    @property
    def control(self) -> ControlVariate | None:
        """The control variate (``step_methods/control.py``), or None without one."""

    @property
    def rng(self) -> np.random.Generator:
        """The chain's random generator: every random number of a Python-path draw."""

    @property
    def n_rows(self) -> int:
        """Number of rows N on the row axis (``oracles.n_rows``)."""

    @property
    def row_sampler(self) -> RowSampler:
        """The rows a test reads, without replacement within a test (``kernels/row_sampler.py``).

        Call its ``start_test()`` before a test's first batch.
        """

    @property
    def strata(self) -> Strata | None:
        """The rows by group for a stratified test (``step_methods/stratification.py``).

        None where the test samples the rows uniformly from ``row_sampler``.
        """

    @property
    def gradient_strata(self) -> Strata | None:
        """The rows by group the trajectories' gradient reads by (``stratification.py``).

        More small groups read whole than ``strata``'s; None where ``strata`` is.
        """

    @property
    def temperature(self) -> float:
        """The likelihood's temperature T: the posterior is ``prior x likelihood^(1/T)``."""

    @property
    def test(self) -> StepTest:
        """The step's acceptance test part."""

    @property
    def proposal_part(self) -> StepProposal:
        """The step's proposal part (its class also picks the fused draw's proposal)."""

    @property
    def proposal_kind(self) -> str:
        """The proposal's name: a registered part's ``proposal=`` name, or ``"user"``."""

    @property
    def dropped_default(self) -> str:
        """Why the default control variate was dropped, or ``""`` if it was not."""

    @property
    def scaling(self) -> float:
        """The proposal's scale or step size: the step's, as PyMC restores it per chain.

        Tuned by the test's Metropolis rule, or written by a part that tunes itself
        (``scaling_rule = "part"``).
        """

    @scaling.setter
    def scaling(self, value: float) -> None: ...

    @property
    def batch_size(self) -> int:
        """Rows of a test's first batch; a designed test writes its design's first batch."""

    @batch_size.setter
    def batch_size(self, value: int) -> None: ...

    @property
    def proposal(self) -> ProposalKernel:
        """The proposal part's kernel (``ProposalPart.build_kernel``).

        A part that adapts its mass during tuning replaces it.
        """

    @proposal.setter
    def proposal(self, value: ProposalKernel) -> None: ...

    def charge_rows(self, n_rows: int) -> None:
        """Count rows read outside a draw (a test's design) in the next draw's ``n_data``.

        Parameters
        ----------
        n_rows : int
            The rows read.
        """

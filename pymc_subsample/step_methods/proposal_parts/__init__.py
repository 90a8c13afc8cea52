"""The proposal of a Metropolis-Hastings step, as a part registered by name.

A step (:class:`~pymc_subsample.SubsampleMH`) looks its
``proposal=`` argument up in :data:`PROPOSAL_PARTS` and keeps one instance of the part for its
life: the part says what the proposal needs from the model (per-row gradients, a control
variate), builds the kernel (``kernels/proposals.py``, ``kernels/trajectory.py``), proposes,
and tunes whatever it tunes. Everything a part adapts is held by the part; the step's
``scaling`` (the proposal's scale or step size) is the step's, because PyMC restores it
before each sequential chain. See ``docs/architecture.md`` ("Proposals") for a worked
example of adding one: a module with a :class:`ProposalPart` subclass and one
:func:`register_proposal` line.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
from numpy.typing import ArrayLike

from pymc_subsample.kernels.trajectory import TrajectoryInfo

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import ProposalKernel, StepView, TestDecision

__all__ = [
    "PROPOSAL_PARTS",
    "ProposalPart",
    "proposal_names",
    "register_proposal",
]


class ProposalPart:
    """How a step builds, runs and tunes one kind of proposal.

    Subclasses set :attr:`name` and implement :meth:`build_kernel`; the defaults describe a
    gradient-free proposal whose scale the Metropolis acceptance-rate rule tunes (a random
    walk). The step calls, in this order: :meth:`obstacle` (before anything is built),
    :meth:`default_scaling`, :meth:`build_kernel` (again whenever the covariance changes),
    then per draw :meth:`propose` and :meth:`after_decision`, and per chain :meth:`reset`
    and :meth:`stop_tuning`.

    Parameters
    ----------
    proposal_cov : array_like or None
        The covariance the proposal is shaped by: the user's, the Laplace covariance at the
        control variate's reference point, or None (the part's own default).
    """

    #: The ``proposal=`` name the part is registered under.
    name: ClassVar[str] = ""
    #: Whether the proposal reads per-row gradients (the step compiles them).
    needs_gradients: ClassVar[bool] = False
    #: How the step's ``scaling`` is tuned: by the acceptance rate every ``tune_interval``
    #: draws (PyMC's Metropolis rule), by the part itself per draw, or not at all.
    scaling_rule: ClassVar[Literal["acceptance", "part", "none"]] = "acceptance"

    def __init__(self, proposal_cov: ArrayLike | None) -> None:
        self.proposal_cov = proposal_cov

    @classmethod
    def obstacle(cls, step: StepView) -> str | None:
        """Why this proposal cannot run on ``step`` (its model, its control variate); or None.

        Called once the step's control variate is settled; a step asked for this proposal by
        name raises a ``ValueError`` with the reason.
        """
        return None

    @staticmethod
    def default_scaling(n_params: int) -> float:
        """Return the scale a chain starts from when ``scaling`` is not given.

        Roberts, Gelman and Gilks (1997): ``2.38 / sqrt(d)`` on the posterior's scale.
        """
        return 2.38 / math.sqrt(n_params)

    def build_kernel(self, step: StepView) -> ProposalKernel:
        """Return the proposal's kernel for ``step`` with :attr:`proposal_cov`."""
        raise NotImplementedError

    def propose(self, step: StepView, q: np.ndarray) -> tuple[np.ndarray, float]:
        """Return ``q'`` and ``log q(q | q') - log q(q' | q)``; the default calls the kernel."""
        return step.proposal(step.rng, q, step.scaling)

    def after_decision(self, step: StepView, q_next: np.ndarray, decision: TestDecision) -> None:
        """Tune from a tuning draw's decision (a part with ``scaling_rule = "part"``)."""

    def reset(self, step: StepView) -> None:
        """Return to the state before any tuning, at a chain's start."""

    def stop_tuning(self, step: StepView) -> None:
        """Fix what tuning adapted, at the end of tuning."""

    def gradient_rows(self, step: StepView) -> int:
        """Rows whose gradients the last proposal read (stat ``n_grad_rows``)."""
        return 0

    @property
    def info(self) -> TrajectoryInfo:
        """What the last proposal did (stats ``n_steps`` and ``diverging``)."""
        return _NO_TRAJECTORY


_NO_TRAJECTORY = TrajectoryInfo(0, False)

#: The proposals a step accepts by name, ``proposal=`` name to part class.
PROPOSAL_PARTS: dict[str, type[ProposalPart]] = {}


def register_proposal(part: type[ProposalPart]) -> type[ProposalPart]:
    """Make ``part`` a ``proposal=`` choice of the Metropolis-Hastings steps under its name.

    Parameters
    ----------
    part : type
        A :class:`ProposalPart` subclass with a new :attr:`~ProposalPart.name`.

    Returns
    -------
    type
        ``part``, so that the function can decorate the class.

    Raises
    ------
    ValueError
        If the name is empty, ``"auto"``, or already registered.
    """
    name = part.name
    if not name or name == "auto" or name in PROPOSAL_PARTS:
        raise ValueError(
            f"A proposal part needs a new name (not empty, not 'auto', not one of "
            f"{tuple(PROPOSAL_PARTS)}); {part.__name__} has {name!r}."
        )
    PROPOSAL_PARTS[name] = part
    return part


def proposal_names() -> tuple[str, ...]:
    """Return the ``proposal=`` choices: ``"auto"`` and every registered part's name."""
    return ("auto", *PROPOSAL_PARTS)


def _register_builtins() -> None:
    # Each module registers its part on import (imported here, not at the top: they subclass
    # ProposalPart from this module), in the order the error messages list them.
    # isort: off
    from pymc_subsample.step_methods.proposal_parts import random_walk  # noqa: F401
    from pymc_subsample.step_methods.proposal_parts import langevin  # noqa: F401
    from pymc_subsample.step_methods.proposal_parts import independent  # noqa: F401
    from pymc_subsample.step_methods.proposal_parts import hamiltonian  # noqa: F401
    # isort: on


_register_builtins()

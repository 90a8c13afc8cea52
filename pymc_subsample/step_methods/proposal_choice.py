"""How a Metropolis-Hastings step chooses and builds its proposal.

:class:`ProposalChoice` is a piece of ``SubsampleMH`` (a base class it inherits from, itself
built on ``control_choice.ControlVariateChoice``): ``proposal="auto"`` becomes the independent
proposal from the Laplace approximation where the automatic reference search found it close,
else Hamiltonian trajectories or the random walk (``docs/architecture.md``, "Proposal parts");
and the chosen part builds its kernel, again when the Laplace covariance moves.
"""

from __future__ import annotations

from typing import cast

from numpy.typing import ArrayLike

from pymc_subsample.kernels.user_proposal import UserProposal
from pymc_subsample.step_methods.contracts import ProposalKernel, StepView
from pymc_subsample.step_methods.control_choice import ControlVariateChoice
from pymc_subsample.step_methods.defaults import (
    INDEPENDENT_SPREAD,
    TRAJECTORY_GRADIENT_ROWS,
    gradient_obstacle,
)
from pymc_subsample.step_methods.proposal_parts import PROPOSAL_PARTS, ProposalPart
from pymc_subsample.step_methods.proposal_parts.user import user_part
from pymc_subsample.warnings import warn_user

__all__ = ["ProposalChoice"]


class ProposalChoice(ControlVariateChoice):
    """The proposal choice of ``SubsampleMH``, as methods of the step.

    It builds on the control-variate choice, which "auto" reads (the Laplace approximation's
    spread and covariance). The step's constructor calls ``_resolve_proposal`` once the
    control variate is chosen, then ``_make_part``; the attributes below are the step's, set
    there.
    """

    proposal_kind: str
    proposal_part: ProposalPart
    proposal: ProposalKernel
    _user_proposal: UserProposal | None

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
            obstacle = PROPOSAL_PARTS[requested].obstacle(cast(StepView, self))
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
        self.proposal = self.proposal_part.build_kernel(cast(StepView, self))

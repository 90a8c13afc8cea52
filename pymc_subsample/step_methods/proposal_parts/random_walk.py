"""``proposal="random_walk"``: ``q' = q + scaling L z`` (``kernels/proposals.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymc_subsample.kernels.proposals import RandomWalkProposal
from pymc_subsample.step_methods.proposal_parts import ProposalPart, register_proposal

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView

__all__ = ["RandomWalkPart"]


@register_proposal
class RandomWalkPart(ProposalPart):
    """Gaussian random walk with the proposal covariance (identity without one).

    Symmetric (log proposal ratio 0); its scale is tuned by the acceptance rate.
    """

    name = "random_walk"

    def build_kernel(self, step: StepView) -> RandomWalkProposal:
        """Return the random walk with :attr:`proposal_cov`."""
        return RandomWalkProposal(step.oracles.n_params, self.proposal_cov)

"""``proposal="langevin"``: a Langevin step on a minibatch gradient (Korattikara et al. 2016)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pymc_subsample.kernels.proposals import LangevinProposal
from pymc_subsample.step_methods.defaults import gradient_obstacle
from pymc_subsample.step_methods.proposal_parts import ProposalPart, register_proposal

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView

__all__ = ["LangevinPart"]


@register_proposal
class LangevinPart(ProposalPart):
    """Langevin proposal of eq. 21 on one minibatch gradient per draw."""

    name = "langevin"
    needs_gradients = True

    @classmethod
    def obstacle(cls, step: StepView) -> str | None:
        """Refuse rows whose gradients are not finite where their log-likelihood is."""
        return gradient_obstacle(step.oracles)

    @staticmethod
    def default_scaling(n_params: int) -> float:
        """Roberts and Rosenthal (1998): ``1.65 / d^(1/6)`` on the posterior's scale."""
        return 1.65 / n_params ** (1 / 6)

    def build_kernel(self, step: StepView) -> LangevinProposal:
        """Return the Langevin proposal preconditioned by :attr:`proposal_cov`."""
        return LangevinProposal(step.oracles.n_params, self.proposal_cov)

    def propose(self, step: StepView, q: np.ndarray) -> tuple[np.ndarray, float]:
        """Propose from the gradient of one minibatch drawn for this draw.

        Eq. 21 of Korattikara et al. (2016): one minibatch ``X_n``, drawn with replacement
        (an unbiased gradient estimate at O(n)), independent of the rows the test draws, and
        used for the gradient at both ``q`` and ``q'``.
        """
        rows = step.rng.integers(0, step.n_rows, size=step.batch_size)
        gradient = step.oracles.gradient_on_rows(rows, step.temperature)
        return step.proposal(step.rng, q, step.scaling, gradient)

    def gradient_rows(self, step: StepView) -> int:
        """Return the minibatch's rows times two (gradients at ``q`` and at ``q'``)."""
        return 2 * step.batch_size

"""``proposal="independent"``: draws from the Laplace approximation at the reference point."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymc_subsample.kernels.proposals import IndependentProposal
from pymc_subsample.step_methods.proposal_parts import ProposalPart, register_proposal

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView

__all__ = ["IndependentPart"]


@register_proposal
class IndependentPart(ProposalPart):
    """``q' ~ N(q*, Sigma)`` at the control variate's reference point ``q*``.

    ``Sigma`` is the proposal covariance (the Laplace covariance unless one was given). It
    needs a control variate, and has no scale to tune.
    """

    name = "independent"
    scaling_rule = "none"

    @classmethod
    def obstacle(cls, step: StepView) -> str | None:
        """Refuse a step without a control variate, whose reference point is the mean."""
        if step.control is not None:
            return None
        reason = f" ({step.dropped_default})" if step.dropped_default else ""
        return (
            "it draws from the Laplace approximation at the reference point of a control "
            f"variate, and this step has none{reason}: use proposal='random_walk', or "
            "control_variate='taylor2' with a reference point"
        )

    def build_kernel(self, step: StepView) -> IndependentProposal:
        """Return the Gaussian at the reference point with :attr:`proposal_cov`."""
        control = step.control
        assert control is not None  # obstacle() holds
        cov = control.covariance if self.proposal_cov is None else self.proposal_cov
        return IndependentProposal(control.reference, cov)

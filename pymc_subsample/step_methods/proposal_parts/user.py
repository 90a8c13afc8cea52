"""A user's proposal function (``proposal=callable``), as a part that is not registered."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymc_subsample.kernels.user_proposal import UserProposal
from pymc_subsample.step_methods.proposal_parts import ProposalPart

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView

__all__ = ["USER_PROPOSAL", "UntunedUserPart", "UserPart", "user_part"]

#: ``proposal_kind`` of a step given a proposal function (``kernels/user_proposal.py``).
USER_PROPOSAL = "user"


class UserPart(ProposalPart):
    """The user's function, checked once and wrapped by :class:`UserProposal`.

    Parameters
    ----------
    kernel : UserProposal
        The wrapped function; its spread is its own (``scaling`` starts at 1).
    """

    name = USER_PROPOSAL

    def __init__(self, kernel: UserProposal) -> None:
        super().__init__(None)
        self.kernel = kernel

    @staticmethod
    def default_scaling(n_params: int) -> float:
        """1: the function's own spread, as written."""
        return 1.0

    def build_kernel(self, step: StepView) -> UserProposal:
        """Return the wrapped function."""
        return self.kernel


class UntunedUserPart(UserPart):
    """A function that ignores ``scaling`` (``uses_scaling = False``): nothing is tuned."""

    scaling_rule = "none"


def user_part(kernel: UserProposal) -> UserPart:
    """Wrap the user's function; untuned where it declares ``uses_scaling = False``."""
    if getattr(kernel.function, "uses_scaling", True) is False:
        return UntunedUserPart(kernel)
    return UserPart(kernel)

"""A proposal the user writes: any function that draws ``q'`` from ``q`` and knows its ratio.

Korattikara et al. (2014), section 6.2, sample an ICA unmixing matrix with a random walk on
the Stiefel manifold: a proposal no covariance describes. The MH tests need only ``q'`` and the
log proposal ratio ``log q(q | q') - log q(q' | q)`` (their threshold ``mu_0``, eq. 2, holds it),
so any proposal with a known ratio keeps them right. ``UserProposal`` checks, once before
sampling, that the user's function returns what the tests need, and at each draw hands it a
copy of the state and copies what it returns (a function that writes into its argument or
reuses an output buffer cannot corrupt the chain).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

__all__ = ["ProposalFunction", "UserProposal"]


class ProposalFunction(Protocol):
    """What ``proposal=`` accepts besides a name: ``(rng, q, scaling) -> (q_new, log_ratio)``.

    ``q`` is the step's point in the unconstrained space: its variables' values (transformed,
    as PyMC samples them) raveled in C order and concatenated in the step's ``vars`` order.
    ``log_ratio`` is ``log q(q | q_new) - log q(q_new | q)``: 0 for a symmetric proposal.
    ``scaling`` is the step's scale, tuned during tuning to the acceptance rate as for the
    random walk; a proposal may ignore it, and says so with an attribute ``uses_scaling =
    False`` (the step then leaves ``scaling`` at 1 and tunes nothing).
    """

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float
    ) -> tuple[np.ndarray, float]:
        """Draw ``q_new`` given ``q``; return it and the log proposal ratio."""
        ...


class UserProposal:
    """Call a :class:`ProposalFunction`, check its results, and keep the chain's state intact.

    Parameters
    ----------
    function : ProposalFunction
        The user's proposal.
    n_params : int
        Length of ``q``.

    Examples
    --------
    >>> def uniform_walk(rng, q, scaling):
    ...     return q + scaling * rng.uniform(-1.0, 1.0, size=q.size), 0.0
    >>> proposal = UserProposal(uniform_walk, 2)
    >>> q_new, log_ratio = proposal(np.random.default_rng(0), np.zeros(2), 0.5)
    >>> q_new.shape, log_ratio
    ((2,), 0.0)
    """

    def __init__(self, function: ProposalFunction, n_params: int) -> None:
        if not callable(function):
            raise TypeError(f"proposal must be a name or a callable, got {function!r}.")
        self.function = function
        self.n_params = n_params

    def check(self, rng: np.random.Generator, q: np.ndarray, scaling: float) -> None:
        """Call the proposal once at ``q`` and raise if what it returns cannot be used.

        Raises
        ------
        TypeError
            If it does not return a pair ``(q_new, log_ratio)`` of an array and a number.
        ValueError
            If ``q_new`` does not have the shape of ``q`` or the ratio is NaN at the start.
        """
        name = getattr(self.function, "__name__", type(self.function).__name__)
        result = self.function(rng, q.copy(), scaling)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"The proposal {name} must return a pair (q_new, log_proposal_ratio), got "
                f"{type(result).__name__}: return `q_new, 0.0` for a symmetric proposal."
            )
        q_new, log_ratio = result
        shape = np.shape(q_new)
        if shape != (self.n_params,):
            raise ValueError(
                f"The proposal {name} returned q_new of shape {shape}; the step's point has "
                f"shape ({self.n_params},): its variables' unconstrained values raveled and "
                "concatenated in the order of `vars`."
            )
        try:
            ratio = float(log_ratio)
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"The proposal {name} returned a log proposal ratio that is not a number: "
                f"{log_ratio!r}."
            ) from error
        if math.isnan(ratio):
            raise ValueError(
                f"The proposal {name} returned a NaN log proposal ratio at the initial point: "
                "it must be log q(q | q_new) - log q(q_new | q), 0 for a symmetric proposal."
            )

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float
    ) -> tuple[np.ndarray, float]:
        """Return a copy of ``q'`` and the log proposal ratio (a NaN ratio: ``-inf``, rejected).

        ``q'`` is copied too: a proposal that reuses one output buffer would otherwise change
        the chain's state after the step accepted it.
        """
        q_new, log_ratio = self.function(rng, q.copy(), scaling)
        ratio = float(log_ratio)
        q_new = np.array(q_new, dtype=np.float64).reshape(self.n_params)
        return q_new, -math.inf if math.isnan(ratio) else ratio

"""Random-walk proposal in the unconstrained space."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["RandomWalkProposal"]


class RandomWalkProposal:
    """Gaussian random walk ``q' = q + scaling * L z`` with ``L L^T = proposal_cov``, z ~ N(0, I).

    The proposal is symmetric, so its log proposal ratio is 0.

    Parameters
    ----------
    n_params : int
        Length of ``q``.
    proposal_cov : array_like, optional
        Vector of variances (diagonal covariance) or a symmetric positive definite matrix.
        Defaults to the identity.

    """

    def __init__(self, n_params: int, proposal_cov: ArrayLike | None = None) -> None:
        self.n_params = n_params
        self.chol_factor = _cholesky_factor(n_params, proposal_cov)

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float
    ) -> tuple[np.ndarray, float]:
        """Return the proposal and its log proposal ratio ``log q(q|q') - log q(q'|q)`` (0)."""
        noise = rng.standard_normal(self.n_params)
        if self.chol_factor.ndim == 1:
            step = self.chol_factor * noise
        else:
            step = self.chol_factor @ noise
        return q + scaling * step, 0.0


def _cholesky_factor(n_params: int, proposal_cov: ArrayLike | None) -> np.ndarray:
    if proposal_cov is None:
        return np.ones(n_params)
    cov = np.asarray(proposal_cov, dtype=float)
    if cov.shape == (n_params,):
        if not (np.all(np.isfinite(cov)) and np.all(cov > 0)):
            raise ValueError(
                "proposal_cov given as a vector must hold positive finite variances, one per "
                f"unconstrained parameter; got {cov}."
            )
        return np.sqrt(cov)
    if cov.shape != (n_params, n_params):
        raise ValueError(
            f"proposal_cov must have shape ({n_params},) or ({n_params}, {n_params}) to match "
            f"the {n_params} unconstrained parameters of `vars`; got shape {cov.shape}."
        )
    if not np.allclose(cov, cov.T):
        raise ValueError("proposal_cov must be symmetric; pass (cov + cov.T) / 2 if rounding.")
    try:
        return np.linalg.cholesky(cov)
    except np.linalg.LinAlgError as error:
        raise ValueError(
            "proposal_cov must be positive definite (its Cholesky factorisation failed); add a "
            "small multiple of the identity or pass a vector of variances."
        ) from error

"""Proposals in the unconstrained space: random walk, stochastic-gradient Langevin, independent.

The random walk and Langevin use a proposal covariance ``M = L L^T`` (``proposal_cov``) and a
scale ``s`` (``scaling``) that tuning adapts; the independent proposal draws from a fixed
Gaussian (the Laplace approximation at the reference point). Each returns the proposal and its
log proposal ratio
``log q(q | q') - log q(q' | q)``, which the Metropolis-Hastings tests fold into their threshold
(Korattikara et al. 2016, eq. 22).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import solve_triangular

__all__ = ["IndependentProposal", "LangevinProposal", "RandomWalkProposal"]

#: ``gradient(q)``: an estimate of the gradient of the log target at ``q``.
Gradient = Callable[[np.ndarray], np.ndarray]


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
        return q + scaling * _times_factor(self.chol_factor, noise), 0.0


class LangevinProposal:
    r"""Langevin proposal with a minibatch gradient, Korattikara et al. (2016), eq. 21.

    With step ``alpha = scaling**2`` and preconditioner ``M = L L^T`` (``proposal_cov``),

    .. math:: q' \sim \mathcal{N}\left(q + \tfrac{\alpha}{2} M g(q),\ \alpha M\right),

    where ``g`` is the gradient estimate the caller passes: in eq. 21,
    ``grad log rho(q) + (N / n) sum_{x in X_n} grad log p(x | q)`` on one minibatch ``X_n``.
    The log proposal ratio uses the *same* ``g`` (the same minibatch) in both directions:
    each minibatch's kernel is then a proper proposal, and the MH test on eq. 22 keeps detailed
    balance for each of them, hence for their mixture. ``M = I`` gives the paper's eq. 21.

    Parameters
    ----------
    n_params : int
        Length of ``q``.
    proposal_cov : array_like, optional
        Vector of variances (diagonal ``M``) or a symmetric positive definite matrix.
        Defaults to the identity.

    """

    def __init__(self, n_params: int, proposal_cov: ArrayLike | None = None) -> None:
        self.n_params = n_params
        self.chol_factor = _cholesky_factor(n_params, proposal_cov)
        self.inverse_factor = _inverse_factor(self.chol_factor)

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float, gradient: Gradient
    ) -> tuple[np.ndarray, float]:
        """Return ``q'`` and ``log q(q | q', X_n) - log q(q' | q, X_n)``.

        The ratio is ``-inf`` (a certain rejection) when the gradient at ``q`` or ``q'`` is not
        finite.
        """
        alpha = scaling * scaling
        noise = rng.standard_normal(self.n_params)
        with np.errstate(all="ignore"):
            forward_drift = 0.5 * alpha * self._precondition(gradient(q))
            q_new = q + forward_drift + scaling * _times_factor(self.chol_factor, noise)
            if not np.all(np.isfinite(q_new)):
                return q_new, -np.inf
            backward_drift = 0.5 * alpha * self._precondition(gradient(q_new))
            # Standardised residual of q given q': L^{-1} (q - q' - drift(q')) / scaling.
            backward = _times_factor(self.inverse_factor, q - q_new - backward_drift) / scaling
            log_ratio = 0.5 * float(noise @ noise) - 0.5 * float(backward @ backward)
        return q_new, log_ratio if np.isfinite(log_ratio) else -np.inf

    def _precondition(self, gradient: np.ndarray) -> np.ndarray:
        # M g with M = L L^T.
        factor = self.chol_factor
        if factor.ndim == 1:
            return factor * factor * gradient
        return factor @ (factor.T @ gradient)


class IndependentProposal:
    """Independent proposal ``q' = mean + L z`` with ``L L^T = cov``, z ~ N(0, I), whatever ``q``.

    The Metropolis-Hastings independence sampler (Tierney 1994): its log proposal ratio is
    ``log N(q | mean, cov) - log N(q' | mean, cov) = (|z|^2 - |L^{-1} (q - mean)|^2) / 2``, and
    its acceptance is the ratio of the posterior's importance weights ``p / N`` at ``q'`` and
    ``q``. Drawn from the Laplace approximation at the reference point of a posterior that is
    close to it (the log importance weights' sd of the reference search small), nearly every
    draw is accepted and draws are nearly independent; ``scaling`` is not used.

    Parameters
    ----------
    mean : ndarray
        The centre, shape (d,).
    cov : array_like
        Vector of variances or a (d, d) symmetric positive definite matrix.

    Examples
    --------
    >>> proposal = IndependentProposal(np.zeros(1), np.array([4.0]))
    >>> q_new, log_ratio = proposal(np.random.default_rng(0), np.array([2.0]), 1.0)
    >>> bool(np.isclose(log_ratio, (q_new[0] ** 2 - 2.0**2) / 8.0))  # log N(2) - log N(q_new)
    True
    """

    def __init__(self, mean: np.ndarray, cov: ArrayLike) -> None:
        self.mean = np.array(mean, dtype=float)
        self.n_params = self.mean.size
        self.chol_factor = _cholesky_factor(self.n_params, cov)
        self.inverse_factor = _inverse_factor(self.chol_factor)

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float
    ) -> tuple[np.ndarray, float]:
        """Return ``q'`` and ``log q(q) - log q(q')``; ``scaling`` is ignored."""
        noise = rng.standard_normal(self.n_params)
        q_new = self.mean + _times_factor(self.chol_factor, noise)
        whitened = _times_factor(self.inverse_factor, q - self.mean)
        return q_new, 0.5 * (float(noise @ noise) - float(whitened @ whitened))


def _times_factor(factor: np.ndarray, noise: np.ndarray) -> np.ndarray:
    # L z for a diagonal (vector) or lower-triangular factor.
    if factor.ndim == 1:
        return factor * noise
    return factor @ noise


def _inverse_factor(factor: np.ndarray) -> np.ndarray:
    """``L^{-1}`` of a diagonal (vector) or lower-triangular factor, once per proposal.

    A draw then whitens with one matrix-vector product: SciPy's triangular solve costs about
    10 us per call at d = 10 through its argument checks (a quarter of a draw's Python time,
    ``docs/architecture.md``, "Per-draw cost"), the product about 1 us.
    """
    if factor.ndim == 1:
        return 1.0 / factor
    identity = np.eye(factor.shape[0])
    return np.asarray(solve_triangular(factor, identity, lower=True, check_finite=False))


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

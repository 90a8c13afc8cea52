"""The sequential test of Korattikara, Chen and Welling (2016, section 2) for Newton-type steps.

An iteration at ``q_t`` computes the update ``u_n = q_t + P^{-1} g`` from a minibatch of n rows
drawn without replacement, where ``g = grad log prior + (N / n) sum_i grad loglik_i`` and ``P``
is a curvature matrix (the negative Hessian, or the empirical Fisher information). Under
resampling of the minibatch, ``u_n`` is about ``N(u_N, Sigma)`` with the sandwich covariance
``Sigma = P^{-1} Cov(g) P^{-1}`` and ``Cov(g) = N^2 S / n (1 - (n - 1) / (N - 1))``, S the
sample covariance of the per-row gradients: eq. 3 of the paper, with the finite-population
correction, generalised from its IRLS form (where ``Sigma = A_n^{-1} e_n / n (...)``, eq. 7d)
to any model with per-row gradients. The paper's test (eq. 4 to 6) accepts the update when the
probability that it points more than 90 degrees away from the full-data update,
``Phi(-mu / sigma)`` with ``mu = |u_n - q_t|`` and ``sigma^2 = u^T Sigma u`` along the unit
update direction, is below ``epsilon``; otherwise the minibatch grows.

One change to the paper's plug-in estimates: ``|u_n - q_t|`` overestimates ``mu`` by the noise
in all d directions, ``E |u_n - q_t|^2 = mu^2 + tr(Sigma)``, so near the mode the plug-in test
passes on noise alone once d is more than a few (it passed at 200 rows on a 10-coefficient
logistic regression whose minibatch optimum sat 20 posterior sds away). We test the debiased
``mu^2 = max(|u_n - q_t|^2 - tr(Sigma), 0)`` instead, which equals the paper's in one dimension
up to the ``sigma^2`` term and makes the minibatch grow as the iterate nears the mode.

The angle test alone still lets through updates whose noise perpendicular to the direction is
as long as the update: with d = 50 and 2,000 of 10,000 rows the optimiser wandered in a ball of
about 16 posterior sds around the mode for 100 iterations. We therefore also require the norm
test of Byrd, Chin, Nocedal and Wu (2012, Math. Programming 134), with their theta = 1:
``tr(Sigma) <= mu^2``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, eigh
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh
from scipy.special import ndtr
from threadpoolctl import threadpool_limits

_Function = TypeVar("_Function", bound=Callable[..., Any])

__all__ = ["Curvature", "DirectionTest", "direction_test", "newton_curvature"]


class DirectionTest(NamedTuple):
    """Outcome of the test on one minibatch update."""

    step: np.ndarray
    mu: float
    sigma: float
    wrong_direction_probability: float
    newton_decrement_sq: float
    noise_sq: float

    def passes(self, z: float) -> bool:
        """Whether the update is accepted at ``z = Phi^{-1}(1 - epsilon)``.

        The paper's test ``mu > z sigma`` (eq. 6), and the norm test ``tr(Sigma) <= mu^2``: the
        update's expected squared noise, over all d directions, at most its squared length.
        """
        return self.mu > z * self.sigma and self.noise_sq <= self.mu**2


class Curvature(NamedTuple):
    """A Newton step's positive-definite precision and what it took to make it so."""

    precision: np.ndarray
    n_modified: int
    smallest_ratio: float


#: From this many parameters the search's linear algebra runs on one BLAS thread.
_ONE_THREAD_FROM = 128


def _one_blas_thread(function: _Function) -> _Function:
    """Run ``function`` with one BLAS/LAPACK thread when its first argument is large.

    OpenBLAS's threaded ``eigh`` of a 1,006 x 1,006 matrix took 16 s on 2 busy cores against
    0.9 s on one thread (its threads wait for each other while other processes hold the
    cores); one thread loses little on an idle machine at these sizes. Small matrices skip
    the limit, whose set-up (threadpoolctl reads the loaded libraries) costs milliseconds.
    """

    @functools.wraps(function)
    def limited(first: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        if np.shape(first)[0] < _ONE_THREAD_FROM:
            return function(first, *args, **kwargs)
        with threadpool_limits(limits=1, user_api="blas"):
            return function(first, *args, **kwargs)

    return cast(_Function, limited)


@_one_blas_thread
def newton_curvature(matrix: np.ndarray, relative_floor: float = 1e-8) -> Curvature:
    """Make a symmetric curvature positive definite: eigenvalues to ``max(|lambda|, floor)``.

    Where the log posterior curves upwards (a saddle, or the neck of a funnel) the Newton step
    ``P^{-1} g`` would point downhill; with ``|lambda|`` it still climbs the gradient, scaled by
    the curvature's magnitude: the saddle-free Newton step of Dauphin et al. (2014, NeurIPS,
    eq. 7). Raising such eigenvalues to a small floor instead, as plain clipping does, makes
    the step ``g_k / floor`` along them: on a non-centred hierarchical model that sent a group
    scale to 1e133. The floor (``relative_floor`` times the largest ``|lambda|``) only guards
    directions of (numerically) zero curvature.

    A positive-definite matrix of more than ``_LANCZOS_FROM`` rows (a hierarchy's thousand
    groups) is recognised by its Cholesky factor and left as it is, its extreme eigenvalues
    found by Lanczos iterations (to 1e-6 relative): ``eigh`` costs about 10 times a Cholesky
    factorisation and was 90% of a reference search with 1,000 groups.

    The eigenvalues are those of the correlation form ``S = D^{-1/2} M D^{-1/2}``,
    ``D = |diag M|`` (the result is ``D^{1/2} S' D^{1/2}``): the parameters' units do not
    count. A regression on years near 4000 has a condition number of 1e12, which a floor on
    raw eigenvalues would take for a flat direction; in correlation form its smallest
    eigenvalue is about 1e-5. The scaling keeps the signs (Sylvester's law of inertia).

    Returns
    -------
    Curvature
        The precision, how many eigenvalues of ``S`` were not above the floor (0: the matrix
        was used as is), and the smallest eigenvalue of ``S`` over its largest absolute one
        (negative at a saddle, about 0 where the posterior is flat in some direction).

    Examples
    --------
    >>> out = newton_curvature(np.diag([2.0, -1.0]), relative_floor=0.25)
    >>> out.precision.diagonal().tolist(), out.n_modified, out.smallest_ratio
    ([2.0, 1.0], 1, -1.0)
    """
    symmetric = 0.5 * (matrix + matrix.T)
    if symmetric.size == 0:
        return Curvature(symmetric, 0, 1.0)
    diagonal = np.abs(np.diag(symmetric))
    # A parameter with no curvature at all is measured in the units of the largest one.
    diagonal = np.where(diagonal > 0, diagonal, max(float(diagonal.max()), 1.0))
    root = np.sqrt(diagonal)
    scaled = symmetric / np.outer(root, root)
    spectrum = _definite_spectrum(scaled)
    if spectrum is not None and spectrum[0] > relative_floor * spectrum[1]:
        return Curvature(symmetric, 0, spectrum[0] / spectrum[1])
    values, vectors = eigh(scaled)
    largest = max(float(np.abs(values).max()), 1e-300)
    floor = relative_floor * largest
    n_modified = int(np.count_nonzero(values <= floor))
    ratio = float(values.min()) / largest
    if n_modified == 0:
        return Curvature(symmetric, 0, ratio)
    modified = np.maximum(np.abs(values), floor)
    return Curvature(np.outer(root, root) * ((vectors * modified) @ vectors.T), n_modified, ratio)


#: From this many parameters a positive-definite curvature is checked by its Cholesky factor
#: and Lanczos iterations instead of a full eigendecomposition.
_LANCZOS_FROM = 256


def _definite_spectrum(scaled: np.ndarray) -> tuple[float, float] | None:
    """``(smallest, largest)`` eigenvalues of a large positive-definite matrix, else None.

    None where the matrix is small (a full ``eigh`` is cheap), not positive definite (its
    Cholesky factorisation fails), or the Lanczos iterations do not converge.
    """
    size = scaled.shape[0]
    if size < _LANCZOS_FROM:
        return None
    try:
        factor = cho_factor(scaled, check_finite=False)
    except LinAlgError:
        return None
    start = np.full(size, 1.0 / np.sqrt(size))  # a fixed start: the same result every run
    inverse = LinearOperator(
        (size, size), matvec=lambda vector: cho_solve(factor, vector), dtype="float64"
    )
    try:
        largest = eigsh(scaled, k=1, which="LA", tol=1e-6, v0=start, return_eigenvectors=False)
        inverse_largest = eigsh(
            inverse, k=1, which="LA", tol=1e-6, v0=start, return_eigenvectors=False
        )
    except ArpackNoConvergence:
        return None
    return 1.0 / float(inverse_largest[0]), float(largest[0])


@_one_blas_thread
def direction_test(
    gradient: np.ndarray,
    precision: np.ndarray,
    score_covariance: np.ndarray,
    n_used: int,
    n_rows: int,
) -> DirectionTest:
    """Newton step ``P^{-1} g`` and the probability that it points the wrong way (eq. 4-6).

    Parameters
    ----------
    gradient : ndarray
        Minibatch estimate ``g`` of the full-data log-posterior gradient, shape (d,).
    precision : ndarray
        Positive-definite curvature ``P``, shape (d, d).
    score_covariance : ndarray
        Sample covariance S of the per-row gradients of the minibatch, shape (d, d).
    n_used, n_rows : int
        Minibatch size n and number of rows N.

    Returns
    -------
    DirectionTest
        The step, the debiased ``mu``, ``sigma``, ``Phi(-mu / sigma)`` (0 when ``sigma = 0``:
        with all rows the update is the full-data one), the Newton decrement
        ``g^T P^{-1} g``, and ``tr(Sigma)``.

    Examples
    --------
    >>> out = direction_test(np.array([1.0]), np.array([[1.0]]), np.array([[0.0]]), 5, 10)
    >>> float(out.step[0]), out.wrong_direction_probability
    (1.0, 0.0)
    """
    factor = cho_factor(precision)
    step = cho_solve(factor, gradient)
    length = float(np.linalg.norm(step))
    decrement = float(gradient @ step)
    fpc = max(1.0 - (n_used - 1) / (n_rows - 1), 0.0) if n_rows > 1 else 0.0
    if length == 0.0 or fpc == 0.0:
        return DirectionTest(step, length, 0.0, 0.0, decrement, 0.0)
    # Sigma = P^{-1} Cov(g) P^{-1}, Cov(g) = N^2 S / n * fpc (P symmetric).
    inverse = cho_solve(factor, np.eye(step.size))
    sigma_matrix = inverse @ score_covariance @ inverse * (n_rows**2 / n_used * fpc)
    direction = step / length
    sigma = float(np.sqrt(max(float(direction @ sigma_matrix @ direction), 0.0)))
    noise_sq = float(np.trace(sigma_matrix))
    mu = float(np.sqrt(max(length**2 - noise_sq, 0.0)))
    probability = float(ndtr(-mu / sigma)) if sigma > 0 else 0.0
    return DirectionTest(step, mu, sigma, probability, decrement, noise_sq)

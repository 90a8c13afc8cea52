"""Bayesian ICA on the orthogonal group with a user proposal (Korattikara et al. 2014, 6.2).

Section 6.2 of Korattikara, Chen and Welling (2014) samples the unmixing matrix ``W`` of
independent component analysis on prewhitened data. With whitened data ``W`` is orthonormal
(the Stiefel manifold of D x D matrices, here the orthogonal group O(D)); the prior is uniform
on it and zero elsewhere, and each row ``x`` has the likelihood

    p(x | W) = |det W| prod_j [4 cosh^2(w_j^T x / 2)]^-1,

``w_j`` the rows of ``W``: each source is standard logistic, since
``1 / (4 cosh^2(s / 2))`` is the logistic density. Their proposal is a random walk on the
manifold (Ouyang 2008), symmetric, so it leaves the threshold ``mu_0 = log(u) / N`` of the
test (eq. 2) unchanged. This module builds that experiment from the package's public API:

- :func:`make_data`: D independent sources (non-Gaussian ones, and optionally Gaussian ones
  as in the paper), mixed by a random matrix and prewhitened; the true unmixing matrix of the
  whitened rows.
- :func:`ica_model`: the PyMC model: ``W`` a ``pm.Flat`` started on O(D) with ``initval``,
  and the per-row likelihood above as a ``pm.CustomDist`` with ``observed=`` rows, so that
  the package compiles one term per row.
- :func:`orthogonal_walk`: ``W' = W expm(scaling * S)`` with ``S`` a random skew-symmetric
  matrix, passed as ``proposal=`` to ``pms.AusterityMH``; its log proposal ratio is 0.
- :func:`amari_distance`: the test function of the paper's figure 3 (Amari et al. 1996).
- :class:`AnglePosterior`: for D = 2, the exact posterior by quadrature over the angle.

**The ambiguity.** The likelihood is unchanged when the rows of ``W`` are permuted or change
sign (``cosh`` is even and the product runs over all rows): the posterior on O(D) has
``2^D D!`` copies of each mode, one for each signed permutation. A random walk built from
``expm`` of a skew-symmetric matrix never leaves the connected component of its start
(``det W`` keeps its sign), and at the sizes of the paper's experiment (N in the millions) the
modes within a component are separated by likelihood barriers a local walk does not cross.
The chain therefore samples one copy. That is enough for any test function that is invariant
under signed row permutations, such as the Amari distance: each signed permutation maps one
copy onto another, preserving the uniform (Haar) prior and the likelihood, so the expectation
of an invariant function is the same under each copy as under the whole posterior (up to the
posterior mass between copies, negligible once they are well separated). This is why the
paper measures ``d_A(W, W0)`` and not ``W`` itself. For D = 2 the tests check it against the
exact posterior: the copies are ``theta -> theta + pi/2`` of one angle, and a chain started
on a reflection (``det W = -1``) gives the same expectations.

**Control variates.** ``control_variate="taylor2"`` expands each row's log-likelihood around
one reference point. With this proposal give ``reference_point={"W": ...}`` on the manifold
and in the copy of the mode the chain samples (for example the mean of an exact run, made
orthogonal by its polar decomposition): around another copy, with the same likelihood but far
from the chain, the residuals the test reads are large and heavy-tailed, and its decisions go
wrong (``docs/gallery/ica_stiefel.md`` measures both); the step warns after tuning that the
chain is far from its reference point.

    python examples/ica_stiefel.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt

__all__ = [
    "AnglePosterior",
    "ICAData",
    "amari_distance",
    "angle_of",
    "ica_model",
    "make_data",
    "orthogonal_walk",
    "orthonormality_error",
    "rotation",
    "row_log_likelihood",
    "skew_expm",
    "source_log_density",
]

#: The source kinds :func:`make_data` draws, each scaled to unit variance.
SOURCE_KINDS = ("logistic", "laplace", "gaussian")


@dataclass(frozen=True)
class ICAData:
    """Prewhitened mixtures and the truth they were made from.

    Attributes
    ----------
    x : numpy.ndarray
        Whitened rows, shape (N, D): zero mean, identity sample covariance.
    unmixing : numpy.ndarray
        The true unmixing matrix ``W0`` of the whitened rows (D x D): ``x @ W0.T`` gives the
        sources back. It is orthogonal up to the sources' sample correlations (order
        ``1 / sqrt(N)``), since whitening makes the whitened mixing matrix orthogonal only in
        expectation.
    sources : tuple of str
        The kind of each source, in order.
    """

    x: np.ndarray
    unmixing: np.ndarray
    sources: tuple[str, ...]


def make_data(
    n_rows: int,
    n_sources: int = 4,
    *,
    n_gaussian: int = 0,
    seed: int = 0,
) -> ICAData:
    """Draw independent sources, mix them with a random matrix, and prewhiten the mixtures.

    The non-Gaussian sources alternate between logistic and Laplace (both super-Gaussian, as
    the model's logistic source density assumes); the last ``n_gaussian`` sources are
    standard normal, as sources (c) and (d) of the paper's experiment. Every source has mean
    0 and variance 1. The mixing matrix has standard normal entries; the mixtures are
    centred and whitened with the inverse symmetric square root of their sample covariance.

    Parameters
    ----------
    n_rows : int
        Rows N.
    n_sources : int, default 4
        Sources D, which is also the number of mixtures.
    n_gaussian : int, default 0
        How many of the sources are Gaussian (their unmixing is not identified: any rotation
        within their span fits equally well in expectation).
    seed : int, default 0
        Seed of the generator.

    Returns
    -------
    ICAData
        The whitened rows and the true unmixing matrix.

    Examples
    --------
    >>> data = make_data(2_000, 2, seed=1)
    >>> data.x.shape, data.sources
    ((2000, 2), ('logistic', 'laplace'))
    >>> bool(np.allclose(data.x.T @ data.x / 2_000, np.eye(2)))
    True
    """
    if not 0 <= n_gaussian <= n_sources:
        raise ValueError(f"n_gaussian must be in [0, {n_sources}], got {n_gaussian}.")
    rng = np.random.default_rng(seed)
    kinds = tuple(
        "gaussian" if j >= n_sources - n_gaussian else SOURCE_KINDS[j % 2] for j in range(n_sources)
    )
    sources = np.empty((n_rows, n_sources))
    for j, kind in enumerate(kinds):
        if kind == "logistic":  # variance pi^2 / 3 at unit scale
            sources[:, j] = rng.logistic(size=n_rows) * math.sqrt(3.0) / math.pi
        elif kind == "laplace":  # variance 2 at unit scale
            sources[:, j] = rng.laplace(size=n_rows) / math.sqrt(2.0)
        else:
            sources[:, j] = rng.standard_normal(n_rows)
    mixing = rng.standard_normal((n_sources, n_sources))
    mixtures = sources @ mixing.T
    mixtures -= mixtures.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(mixtures.T @ mixtures / n_rows)
    whitening = eigenvectors @ np.diag(eigenvalues**-0.5) @ eigenvectors.T
    x = mixtures @ whitening.T
    # x = sources_centred @ (whitening @ mixing).T: the true unmixing inverts whitening @ mixing.
    unmixing = np.linalg.inv(whitening @ mixing)
    return ICAData(x=x, unmixing=unmixing, sources=kinds)


def source_log_density(s: Any) -> Any:
    """``log [4 cosh^2(s / 2)]^-1``, the standard logistic log-density, without overflow.

    ``log(4 cosh^2(s / 2)) = |s| + 2 log(1 + exp(-|s|))``. Works on NumPy arrays and PyTensor
    tensors alike.
    """
    module = pt if isinstance(s, pt.TensorVariable) else np
    magnitude = module.abs(s)
    return -(magnitude + 2.0 * module.log1p(module.exp(-magnitude)))


def row_log_likelihood(value: Any, W: Any) -> Any:
    """``log p(x | W)`` of each row (section 6.2): ``log|det W| + sum_j log f(w_j^T x)``.

    ``value`` has shape (..., D) and ``W`` shape (..., D, D) (PyMC may add batch dimensions);
    the result has the shape of ``value`` without its last axis. Written with elementwise
    products rather than ``@`` so that batch dimensions broadcast.
    """
    projections = (W * value[..., None, :]).sum(axis=-1)  # [..., j] = w_j^T x
    # log|det W| as log(det(W)^2) / 2: PyTensor 2 (PyMC 5) rewrites log(abs(det(W))) into a
    # log-determinant op that refuses the batched W PyMC passes in here.
    log_abs_det = 0.5 * pt.log(pt.sqr(pt.linalg.det(W)))
    return source_log_density(projections).sum(axis=-1) + log_abs_det


def ica_model(x: np.ndarray, initval: np.ndarray | None = None) -> pm.Model:
    """The posterior of section 6.2: ``W`` uniform on O(D), logistic sources.

    ``W`` is a ``pm.Flat`` of shape (D, D): a flat density on all matrices, which the
    proposal :func:`orthogonal_walk` restricts to the manifold by never leaving it, so the
    sampled posterior is the likelihood times the uniform (Haar) measure on O(D), and
    ``|det W| = 1`` along the chain (the term is kept so the likelihood is the paper's at any
    ``W``). The likelihood is a ``pm.CustomDist`` with signature ``(d,d)->(d)`` observed on
    the rows, so the package evaluates it one row at a time.

    Parameters
    ----------
    x : numpy.ndarray
        Whitened rows, shape (N, D).
    initval : numpy.ndarray, optional
        Start of ``W``, on O(D); the identity if not given.

    Returns
    -------
    pymc.Model
        The model, with free variable ``"W"`` and observed variable ``"x"``.
    """
    n_sources = x.shape[1]
    start = np.eye(n_sources) if initval is None else np.asarray(initval, dtype=float)
    if orthonormality_error(start) > 1e-10:
        raise ValueError("initval must be orthonormal: the proposal keeps W where it starts.")
    with pm.Model() as model:
        W = pm.Flat("W", shape=(n_sources, n_sources), initval=start)
        pm.CustomDist("x", W, logp=row_log_likelihood, observed=x, signature="(d,d)->(d)")
    return model


def skew_expm(A: np.ndarray) -> np.ndarray:
    """Matrix exponential of a small skew-symmetric matrix: a rotation.

    Scaling and squaring with a Taylor series (Moler and Van Loan 2003): ``A`` is halved
    ``k`` times until its 1-norm is at most 1/4, the series is summed until its terms fall
    below ``1e-18`` (at most 13 terms: ``0.25^13 / 13! < 3e-18``), and the result is squared
    ``k`` times. Written with NumPy products rather than ``scipy.linalg.expm``, whose calls
    into a second BLAS thread pool next to NumPy's cost milliseconds per call when the cores
    are shared (measured: 3.3 against 0.44 ms per draw of the whole step, D = 4, N = 2,000).
    """
    norm = float(np.abs(A).sum(axis=0).max())
    halvings = max(0, math.ceil(math.log2(norm / 0.25))) if norm > 0.25 else 0
    B = A / 2.0**halvings
    result = np.eye(A.shape[0])
    term = result
    for order in range(1, 14):
        term = term @ B / order
        result = result + term
        if np.abs(term).max() < 1e-18:
            break
    for _ in range(halvings):
        result = result @ result
    return result


def orthogonal_walk(
    rng: np.random.Generator, q: np.ndarray, scaling: float
) -> tuple[np.ndarray, float]:
    """Random walk on O(D): ``W' = W expm(scaling * S)``, log proposal ratio 0.

    ``S = (A - A^T) / sqrt(2)`` with ``A`` standard normal, so ``S`` is skew-symmetric with
    independent N(0, 1) entries above the diagonal, and ``R = expm(scaling * S)`` is a rotation
    (orthogonal, determinant 1): ``W'`` stays on the manifold and in the component of ``W``.
    The move is symmetric with respect to the uniform (Haar) measure, which is the reference
    measure of the prior: its density is a function of the increment, ``f(W^T W')``, and
    ``S`` and ``-S`` have the same distribution, so the increment ``R`` and the increment
    back, ``R^T = R^-1``, have the same distribution and ``q(W' | W) = q(W | W')``. The ratio
    is therefore 0 (the paper's ``mu_0 = log(u) / N``, section 6.2, with a random walk on the
    manifold after Ouyang 2008).

    Rounding would let ``W`` drift off the manifold over a long chain (by about ``1e-16`` per
    draw); one Newton-Schulz step of the polar decomposition, ``W' (3 I - W'^T W') / 2``,
    squares that error away at each draw. It moves ``W'`` by the order of the rounding error
    and keeps ``|W W^T - I|`` near ``1e-15`` however long the chain.

    Parameters
    ----------
    rng : numpy.random.Generator
        The step's generator.
    q : numpy.ndarray
        ``W`` raveled in C order (the step's point: ``W`` is the model's only free variable
        and ``pm.Flat`` has no transform).
    scaling : float
        Standard deviation of each rotation angle ``S_jk`` (radians); tuned by the step during
        tuning.

    Returns
    -------
    q_new : numpy.ndarray
        ``W'`` raveled.
    log_proposal_ratio : float
        0.0.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, log_ratio = orthogonal_walk(rng, np.eye(3).ravel(), 0.1)
    >>> orthonormality_error(q.reshape(3, 3)) < 1e-14, log_ratio
    (True, 0.0)
    """
    n_sources = math.isqrt(q.size)
    noise = rng.standard_normal((n_sources, n_sources))
    skew = (noise - noise.T) / math.sqrt(2.0)
    W = q.reshape(n_sources, n_sources) @ skew_expm(scaling * skew)
    W = W @ (3.0 * np.eye(n_sources) - W.T @ W) / 2.0
    return W.ravel(), 0.0


def orthonormality_error(W: np.ndarray) -> float:
    """``max |W W^T - I|`` over the entries (over the last two axes of a stack of matrices)."""
    W = np.asarray(W, dtype=float)
    gram = W @ np.swapaxes(W, -1, -2)
    return float(np.abs(gram - np.eye(W.shape[-1])).max())


def amari_distance(W: np.ndarray, W0: np.ndarray) -> np.ndarray:
    """Amari distance between an estimated and the true unmixing matrix (Amari et al. 1996).

    With ``P = W W0^-1`` (the identity up to a signed permutation when ``W`` unmixes exactly),

        d_A = [sum_i (sum_j |p_ij| / max_k |p_ik| - 1)
               + sum_j (sum_i |p_ij| / max_k |p_kj| - 1)] / (2 D (D - 1)),

    normalised to [0, 1]. It is 0 exactly when ``W`` equals ``W0`` up to permuting and scaling
    its rows, and is unchanged by permutations and sign flips of the rows of ``W``: the
    ambiguity of the ICA posterior.

    Parameters
    ----------
    W : numpy.ndarray
        Estimates, shape (..., D, D).
    W0 : numpy.ndarray
        True unmixing matrix, shape (D, D).

    Returns
    -------
    numpy.ndarray
        One distance per matrix in ``W`` (a 0-d array for one matrix).

    Examples
    --------
    >>> W0 = np.array([[0.6, 0.8], [-0.8, 0.6]])
    >>> round(float(amari_distance(-W0[::-1], W0)), 12)  # rows swapped and flipped
    0.0
    >>> round(float(amari_distance(np.eye(2), W0)), 4)  # |P| = [[0.6, 0.8], [0.8, 0.6]]
    0.75
    """
    P = np.abs(np.asarray(W, dtype=float) @ np.linalg.inv(W0))
    n_sources = P.shape[-1]
    rows = (P.sum(axis=-1) / P.max(axis=-1) - 1.0).sum(axis=-1)
    columns = (P.sum(axis=-2) / P.max(axis=-2) - 1.0).sum(axis=-1)
    return (rows + columns) / (2.0 * n_sources * (n_sources - 1))


def angle_of(W: np.ndarray) -> np.ndarray:
    """Angle ``theta`` of 2 x 2 orthogonal matrices, whose first row is ``(cos, sin)(theta)``.

    A rotation is ``[[cos, sin], [-sin, cos]]`` and a reflection ``[[cos, sin], [sin, -cos]]``
    (its second row flipped in sign), so one formula serves both components of O(2).
    """
    W = np.asarray(W, dtype=float)
    return np.arctan2(W[..., 0, 1], W[..., 0, 0])


def rotation(theta: np.ndarray | float) -> np.ndarray:
    """``[[cos, sin], [-sin, cos]](theta)``, stacked over the shape of ``theta``."""
    c, s = np.cos(theta), np.sin(theta)
    return np.stack([np.stack([c, s], axis=-1), np.stack([-s, c], axis=-1)], axis=-2)


class AnglePosterior:
    """Exact posterior of the D = 2 model by quadrature over the angle.

    O(2) is two circles: rotations ``W(theta)`` (:func:`rotation`) and reflections
    ``diag(1, -1) W(theta)``, and the uniform prior is ``d theta / 2 pi`` on each. The
    reflection of ``W(theta)`` has the same likelihood (its second row changes sign), and so
    does ``W(theta + pi / 2)`` (the rows swap, one with a sign), so the posterior of any
    function invariant under signed row permutations is its average over one period,
    ``theta`` in ``[0, pi / 2)``, weighted by the likelihood. The log-likelihood is
    evaluated on a coarse grid over the period to find the mode, then on a fine grid over
    the angles whose log-likelihood is within ``window`` of the maximum (the rest of the
    period, ``exp(-window)`` of the mass or less, is left out), with the trapezoidal rule.

    Parameters
    ----------
    x : numpy.ndarray
        Whitened rows, shape (N, 2).
    n_coarse, n_fine : int
        Points of the two grids.
    window : float, default 40
        Log-likelihood below the maximum at which the fine grid stops.
    block : int, default 4_000_000
        Angle-row pairs evaluated at once (bounds memory at about 100 bytes each).
    """

    def __init__(
        self,
        x: np.ndarray,
        *,
        n_coarse: int = 512,
        n_fine: int = 2001,
        window: float = 40.0,
        block: int = 4_000_000,
    ) -> None:
        self.x, self.block = np.asarray(x, dtype=float), block
        period = math.pi / 2.0
        spacing = period / n_coarse
        coarse_log = self.log_likelihood(np.arange(n_coarse) * spacing)
        peak = int(np.argmax(coarse_log))
        self.mode = peak * spacing
        # The log-likelihood has period pi / 2: roll the coarse grid to centre it on the mode,
        # so that the window does not wrap around the period.
        offsets = np.arange(-(n_coarse // 2), n_coarse - n_coarse // 2)
        around = coarse_log[(peak + offsets) % n_coarse]
        inside = offsets[around > around.max() - window] * spacing
        low, high = inside.min() - 2 * spacing, inside.max() + 2 * spacing
        self.theta = self.mode + np.linspace(low, high, n_fine)
        log_weight = self.log_likelihood(self.theta)
        weight = np.exp(log_weight - log_weight.max())
        trapezoid = np.full(n_fine, self.theta[1] - self.theta[0])
        trapezoid[[0, -1]] *= 0.5
        self.weight = weight * trapezoid / float(weight @ trapezoid)

    def log_likelihood(self, theta: np.ndarray) -> np.ndarray:
        """Sum over rows of ``log p(x_i | W(theta))`` (``log|det W| = 0``), one per angle."""
        theta = np.asarray(theta, dtype=float)
        total = np.zeros(theta.size)
        rows = min(self.x.shape[0], self.block)
        angles = max(1, self.block // rows)
        for start in range(0, self.x.shape[0], rows):
            block = self.x[start : start + rows]
            for first in range(0, theta.size, angles):
                W = rotation(theta[first : first + angles])
                projections = np.einsum("tjk,nk->tnj", W, block)
                total[first : first + angles] += source_log_density(projections).sum(axis=(1, 2))
        return total

    def expectation(self, function: Any) -> float:
        """Posterior mean of ``function(W)``, ``W`` of shape (n, 2, 2) on the fine grid."""
        return float(self.weight @ function(rotation(self.theta)))

    def wrapped(self, theta: np.ndarray) -> np.ndarray:
        """Angle relative to the mode, wrapped to ``[-pi/4, pi/4)`` (one copy of the mode)."""
        period = math.pi / 2.0
        return (np.asarray(theta) - self.mode + period / 2.0) % period - period / 2.0


def main() -> None:
    """Two sources, 50,000 rows: exact MH and the paper's test against quadrature."""
    import pymc_subsample as pms

    n_rows = 50_000
    data = make_data(n_rows, 2, seed=0)
    exact = AnglePosterior(data.x)
    truth = exact.expectation(lambda W: amari_distance(W, data.unmixing))
    u, _, vt = np.linalg.svd(data.unmixing)  # start at the nearest orthogonal matrix
    model = ica_model(data.x, initval=u @ vt)
    for tolerance in (0.0, 0.05):
        with model:
            step = pms.AusterityMH(
                proposal=orthogonal_walk,
                error_tolerance=tolerance,
                control_variate=None,
                scaling=2.38 / math.sqrt(n_rows),
                tune_interval=50,
            )
            idata = pm.sample(step=step, tune=300, draws=1_000, chains=2, random_seed=1)
        draws = idata.posterior["W"].values.reshape(-1, 2, 2)
        rows = float(idata.sample_stats["n_data"].mean())
        print(
            f"error_tolerance={tolerance}: E[d_A(W, W0)] = "
            f"{amari_distance(draws, data.unmixing).mean():.5f} (quadrature: {truth:.5f}), "
            f"{rows:,.0f} of {n_rows:,} rows per draw, "
            f"max |W W^T - I| = {orthonormality_error(draws):.1e}"
        )


if __name__ == "__main__":
    main()

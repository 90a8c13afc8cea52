"""Find a point near the posterior mode with minibatches: the reference point of control variates.

``find_reference_point`` runs Newton (or Fisher-scoring) iterations whose minibatch grows only
as much as the sequential test of Korattikara, Chen and Welling (2016, section 2, Algorithm 1)
requires for the update to point the right way (:mod:`pymc_subsample.kernels.optimizer`). Far
from the mode a few hundred rows give a good direction; near it the test asks for more, and the
last iterations use all rows, where Newton converges quadratically. The minibatch doubles
between tests ("testing at increasingly larger intervals", as the paper suggests), so an
iteration makes O(log N) calls. Each accepted update takes a backtracking (Armijo) step on the
minibatch's own objective, which guards Newton against overshooting far from the mode. Unlike
the paper, which restarts every iteration at N_0 rows, the next iteration starts at the rows the
last one needed, so the minibatch never shrinks: near the mode a chance pass of the test on
fewer rows otherwise moves the iterate away again by the noise of those rows (restarting at
N_0 never converged on logistic regression with d = 10; restarting at half the last batch
still failed within 100 iterations at d = 50, N = 10^4).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pymc as pm
from pymc.util import RandomGenerator, get_random_generator, get_value_vars_from_user_vars
from pytensor.tensor.variable import TensorVariable
from scipy.special import ndtri

from pymc_subsample.kernels.optimizer import DirectionTest, direction_test, positive_definite
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.model.oracles import ModelOracles, build_oracles
from pymc_subsample.warnings import SubsampleWarning

__all__ = ["ReferencePoint", "find_reference_point"]

#: Armijo's sufficient-increase constant and the most halvings of a step.
_ARMIJO = 1e-4
_MAX_HALVINGS = 40


@dataclass(frozen=True)
class Optimum:
    """Where :func:`optimise_reference` stopped, and the rows it read (see ReferencePoint)."""

    q: np.ndarray
    converged: bool
    n_iterations: int
    n_gradient_rows: int
    n_loglik_rows: int
    newton_decrement_sq: float
    batch_sizes: list[int]

    @property
    def n_row_evaluations(self) -> int:
        """Rows touched in all: gradient rows plus log-likelihood rows."""
        return self.n_gradient_rows + self.n_loglik_rows


@dataclass(frozen=True)
class ReferencePoint(Optimum):
    """Result of :func:`find_reference_point`.

    Attributes
    ----------
    point : dict
        Unconstrained values of the optimised value variables, keyed by their names (as in
        ``model.value_vars``, e.g. ``"sigma_log__"``); pass it as ``reference_point=``.
    initvals : dict
        The same point on the constrained scale, keyed by random-variable names; pass it as
        ``pm.sample(initvals=...)`` to start the chains there.
    q : ndarray
        The raveled unconstrained vector.
    converged : bool
        The last iteration used all rows and its squared Newton decrement was below ``tol``.
    n_iterations : int
        Newton iterations made.
    n_gradient_rows : int
        Row gradients evaluated (each with its Hessian for ``method="newton"``).
    n_loglik_rows : int
        Row log-likelihoods evaluated by the line searches.
    newton_decrement_sq : float
        ``g^T P^{-1} g`` of the last iteration: about the squared Mahalanobis distance to the
        mode in posterior standard deviations (when all rows were used).
    batch_sizes : list of int
        Rows the sequential test used at each iteration.
    """

    point: dict[str, np.ndarray] = field(default_factory=dict)
    initvals: dict[str, np.ndarray] = field(default_factory=dict)


def find_reference_point(
    vars: Sequence[TensorVariable] | None = None,
    *,
    model: pm.Model | None = None,
    start: dict[str, Any] | None = None,
    method: str = "newton",
    error_tolerance: float = 0.01,
    batch_size: int | None = None,
    tol: float = 1e-4,
    max_iter: int = 100,
    obs_dim: str | None = None,
    random_seed: RandomGenerator = None,
    compile_kwargs: dict[str, Any] | None = None,
) -> ReferencePoint:
    r"""Find a point near the posterior mode, touching as few rows as the sequential test allows.

    Parameters
    ----------
    vars : list of variables, optional
        Continuous variables to optimise (default: all free variables); the others stay at
        their initial values.
    model : pymc.Model, optional
        Defaults to the model in context.
    start : dict, optional
        Starting values keyed by value-variable names (default ``model.initial_point()``).
    method : {"newton", "fisher"}, default "newton"
        Curvature of the steps: ``"newton"`` uses the minibatch Hessian (one Hessian per row,
        summed, never stored per row); ``"fisher"`` the empirical Fisher information
        ``sum_i g_i g_i^T`` (BHHH), which needs only gradients and is positive semi-definite.
        Either is corrected by the prior's Hessian and clipped to be positive definite.
    error_tolerance : float, default 0.01
        The paper's epsilon: the largest probability, under resampling of the minibatch, that
        an update points more than 90 degrees away from the full-data update. In (0, 0.5).
    batch_size : int, optional
        Rows of the first test of each iteration (the paper's N_0); the minibatch doubles
        until the test passes. Default ``max(200, 20 d)``.
    tol : float, default 1e-4
        Stop when an iteration on all rows has a squared Newton decrement below ``tol``
        (about ``sqrt(tol)`` posterior standard deviations from the mode).
    max_iter : int, default 100
        Most iterations; a ``SubsampleWarning`` says if it stopped there.
    obs_dim : str, optional
        Name of the row dimension (see :class:`pymc_subsample.AusterityMH`).
    random_seed : int or numpy.random.Generator, optional
        Seeds the minibatches.
    compile_kwargs : dict, optional
        Passed to PyTensor, e.g. ``{"mode": "NUMBA"}``.

    Returns
    -------
    ReferencePoint

    Notes
    -----
    The test of an update ``u_n - q_t = P^{-1} g`` (Korattikara et al. 2016, eq. 3-6) uses the
    sandwich covariance ``P^{-1} Cov(g) P^{-1}`` with the finite-population correction; it
    treats ``P`` as fixed, which is the first-order (delta-method) approximation.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> y = np.random.default_rng(0).normal(3.0, 1.0, size=10_000)
    >>> with pm.Model():
    ...     mu = pm.Normal("mu", 0.0, 10.0)
    ...     _ = pm.Normal("y", mu, 1.0, observed=y)
    ...     ref = find_reference_point(random_seed=1)
    >>> bool(abs(ref.point["mu"] - y.mean()) < 1e-3), ref.converged
    (True, True)
    """
    model = pm.modelcontext(model)
    value_vars = model.value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
    initial_point = model.initial_point()
    if start is not None:
        initial_point = {**initial_point, **{k: np.asarray(v) for k, v in start.items()}}
    oracles = build_oracles(
        model,
        value_vars,
        initial_point=initial_point,
        obs_dim=obs_dim,
        compile_kwargs=compile_kwargs,
        proxy_order=1,
    )
    result = optimise_reference(
        oracles,
        oracles.initial_q,
        rng=get_random_generator(random_seed),
        method=method,
        error_tolerance=error_tolerance,
        batch_size=batch_size,
        tol=tol,
        max_iter=max_iter,
    )
    point, initvals = _points(model, value_vars, initial_point, result.q)
    return ReferencePoint(**result.__dict__, point=point, initvals=initvals)


def optimise_reference(
    oracles: ModelOracles,
    q0: np.ndarray,
    *,
    rng: np.random.Generator,
    method: str = "newton",
    error_tolerance: float = 0.01,
    batch_size: int | None = None,
    tol: float = 1e-4,
    max_iter: int = 100,
) -> Optimum:
    """Run the iterations of :func:`find_reference_point` on compiled oracles."""
    if method not in ("newton", "fisher"):
        raise ValueError(f"method must be 'newton' or 'fisher', got {method!r}.")
    if not 0.0 < float(error_tolerance) < 0.5:
        raise ValueError(
            f"error_tolerance must be in (0, 0.5), got {error_tolerance!r}: it is the allowed "
            "probability that an update points more than 90 degrees the wrong way."
        )
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}.")
    n_rows, d = oracles.n_rows, oracles.n_params
    first = max(200, 20 * d) if batch_size is None else int(batch_size)
    if first < 2:
        raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}.")
    z = float(ndtri(1.0 - float(error_tolerance)))
    sampler = RowSampler(n_rows)
    q = np.array(q0, dtype="float64")
    counts = {"gradient": 0, "loglik": 0}
    batch_sizes: list[int] = []
    converged, decrement = False, float("inf")
    size = first
    for _ in range(max_iter):
        rows, test = _tested_update(oracles, q, sampler, rng, size, z, method, counts)
        batch_sizes.append(rows.size)
        # Start the next test at this batch size: the precision needed grows near the mode,
        # and starting smaller lets a chance pass on few rows throw the iterate away again.
        size = max(size, rows.size)
        decrement = test.newton_decrement_sq
        if rows.size == n_rows and decrement <= d:
            # Within about one posterior sd of the mode on all rows: the quadratic regime,
            # where the full Newton step needs no check (and a check would cost a data pass).
            q = q + test.step
        else:
            q = _line_search(oracles, q, test.step, rows, decrement, counts)
        if rows.size == n_rows and decrement < tol:
            converged = True
            break
    else:
        warnings.warn(
            f"find_reference_point stopped after max_iter={max_iter} iterations with squared "
            f"Newton decrement {decrement:.3g} (tol={tol}). Raise max_iter, or check that the "
            "posterior has a mode (an improper flat prior on separable data has none).",
            SubsampleWarning,
            stacklevel=3,
        )
    return Optimum(
        q=q,
        converged=converged,
        n_iterations=len(batch_sizes),
        n_gradient_rows=counts["gradient"],
        n_loglik_rows=counts["loglik"],
        newton_decrement_sq=decrement,
        batch_sizes=batch_sizes,
    )


def _tested_update(
    oracles: ModelOracles,
    q: np.ndarray,
    sampler: RowSampler,
    rng: np.random.Generator,
    first: int,
    z: float,
    method: str,
    counts: dict[str, int],
) -> tuple[np.ndarray, DirectionTest]:
    """Grow a minibatch (doubling) until the update passes the direction test; all rows at most."""
    n_rows, d = oracles.n_rows, oracles.n_params
    sampler.start_test()
    prior_gradient = oracles.log_prior_grad(q)
    prior_hessian = oracles.log_prior_hessian(q)
    chunks: list[np.ndarray] = []
    score_sum, outer_sum, hessian_sum = np.zeros(d), np.zeros((d, d)), np.zeros((d, d))
    size = min(first, n_rows)
    while True:
        rows = sampler.draw(rng, size)
        chunks.append(rows)
        scores = oracles.score_rows(q, rows)
        counts["gradient"] += rows.size
        score_sum += scores.sum(0)
        outer_sum += scores.T @ scores
        if method == "newton":
            hessian_sum += oracles.gradient_hessian_sums(q, rows)[1]
        n_used = sampler.n_taken
        scale = n_rows / n_used
        curvature = -hessian_sum if method == "newton" else outer_sum
        precision = positive_definite(scale * curvature - prior_hessian)
        mean = score_sum / n_used
        covariance = (outer_sum - n_used * np.outer(mean, mean)) / max(n_used - 1, 1)
        test = direction_test(
            prior_gradient + scale * score_sum, precision, covariance, n_used, n_rows
        )
        if n_used == n_rows or test.passes(z):
            return np.concatenate(chunks), test
        size = min(n_used, n_rows - n_used)


def _line_search(
    oracles: ModelOracles,
    q: np.ndarray,
    step: np.ndarray,
    rows: np.ndarray,
    decrement: float,
    counts: dict[str, int],
) -> np.ndarray:
    """Backtrack from the full step until the minibatch objective rises enough (Armijo)."""
    scale = oracles.n_rows / rows.size
    alpha = 1.0
    for _ in range(_MAX_HALVINGS):
        candidate = q + alpha * step
        counts["loglik"] += rows.size
        gain = oracles.log_prior_ratio(candidate, q) + scale * float(
            oracles.loglik_ratio_rows(candidate, q, rows).sum()
        )
        if np.isfinite(gain) and gain >= _ARMIJO * alpha * decrement:
            return candidate
        alpha *= 0.5
    return q


def _points(
    model: pm.Model,
    value_vars: Sequence[TensorVariable],
    initial_point: dict[str, np.ndarray],
    q: np.ndarray,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Unravel ``q`` into value-variable and constrained random-variable dicts."""
    point = dict(initial_point)
    offset = 0
    for var in value_vars:
        shape = np.shape(initial_point[str(var.name)])
        size = int(np.prod(shape))
        point[str(var.name)] = q[offset : offset + size].reshape(shape)
        offset += size
    constrained = model.replace_rvs_by_values(model.free_RVs)
    values = model.compile_fn(
        constrained, inputs=model.value_vars, point_fn=True, on_unused_input="ignore"
    )(point)
    initvals = {str(rv.name): np.asarray(v) for rv, v in zip(model.free_RVs, values, strict=True)}
    optimised = {str(var.name) for var in value_vars}
    return {k: v for k, v in point.items() if k in optimised}, initvals

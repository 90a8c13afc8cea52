"""Reference points of control variates: ``find_reference_point`` and the steps' own search.

:func:`find_reference_point` (public) and :func:`automatic_reference` (a step given no
reference point) run the minibatch Newton search of ``reference_search.py`` with the same
default settings, and keep its result with the model's compiled functions
(``ModelFunctions.references``), so that a step built after either reuses it. The search's
point carries a ``failure`` where it is no usable expansion point: no mode (a funnel, which
:func:`funnel_explanation` names in a centred hierarchy, or a singular Hessian) or a posterior
far from Gaussian around it (``laplace_check.py``); steps with control variates refuse it
(docs/control_variates.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, cast

import numpy as np
import pymc as pm
from pymc.util import RandomGenerator, get_random_generator, get_value_vars_from_user_vars
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.reference_search import Optimum, optimise_reference, search_tol
from pymc_subsample.warnings import warn_user

__all__ = [
    "ReferencePoint",
    "automatic_reference",
    "find_reference_point",
    "funnel_explanation",
]


class _Settings(NamedTuple):
    """The settings of a reference search, part of the key under which its result is kept."""

    method: str = "newton"
    error_tolerance: float = 0.01
    batch_size: int | None = None
    tol: float | None = None
    max_iter: int = 100


#: The default settings, shared by find_reference_point's signature and the steps' search.
_DEFAULTS = _Settings()


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
    laplace_log_weight_sd : float
        Sd of the log importance weights of the Laplace approximation at the point, over 40
        draws (0 for a Gaussian posterior; NaN when not computed): how far from Gaussian the
        posterior is around it.
    failure : str or None
        Why the point is not a usable expansion point for control variates (no convergence away
        from a mode, a funnel, a singular Hessian, a posterior far from Gaussian), or None.
        Steps with control variates refuse a point with a failure.
    row_sums : tuple of ndarray or None
        The rows' summed log-likelihood gradient and Hessian at ``q`` over the data the search
        read (None when the Laplace check did not run): a step given no reference point expands
        its control variate with them instead of another pass.
    at_mode : bool
        The point is a mode found on all rows (or within about one posterior sd of one): a
        ``failure`` is then the Laplace check's, and a step with ``control_variate="auto"``
        expands its control variate in the likelihood's parameters there instead.
    """

    point: dict[str, np.ndarray] = field(default_factory=dict)
    initvals: dict[str, np.ndarray] = field(default_factory=dict)


def find_reference_point(
    vars: Sequence[TensorVariable] | None = None,
    *,
    model: pm.Model | None = None,
    start: dict[str, Any] | None = None,
    method: str = _DEFAULTS.method,
    error_tolerance: float = _DEFAULTS.error_tolerance,
    batch_size: int | None = _DEFAULTS.batch_size,
    tol: float | None = _DEFAULTS.tol,
    max_iter: int = _DEFAULTS.max_iter,
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
        until the test passes. Default ``max(200, 20 d)``; every row where the rows read a
        table of group parameters by an index (a hierarchy), whose small groups a minibatch
        leaves without rows.
    tol : float, optional
        Stop when an iteration on all rows has a squared Newton decrement below ``tol``
        (about ``sqrt(tol)`` posterior standard deviations from the mode). Default 1e-4;
        1e-2 (0.1 sd) from 2^22 rows, where a pass over every row costs seconds and a point
        that close serves the control variates and the Laplace proposal as well.
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

    Warns
    -----
    SubsampleWarning
        When the result has a ``failure`` (the message says why and what to do), or stopped at
        ``max_iter`` within about one posterior sd of a mode.

    Notes
    -----
    The test of an update ``u_n - q_t = P^{-1} g`` (Korattikara et al. 2016, eq. 3-6) uses the
    sandwich covariance ``P^{-1} Cov(g) P^{-1}`` with the finite-population correction; it
    treats ``P`` as fixed, which is the first-order (delta-method) approximation. Where the
    curvature is not negative definite the step uses its eigenvalues' absolute values
    (saddle-free Newton). The point returned never has a lower full-data log posterior than
    the start (two log-likelihood passes), and the Laplace check costs one pass for the
    gradient and Hessian sums and 40 x 10,000 rows' residuals: all at set-up.

    In a centred hierarchical model pass ``vars`` without the hyperparameters (the group mean
    and scale): the joint posterior has no mode (a funnel as the scale goes to 0), and the
    result then names the scale in its ``failure``.

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
    given_tol = None if tol is None else float(tol)
    settings = _Settings(method, float(error_tolerance), batch_size, given_tol, int(max_iter))
    result = optimise_reference(
        oracles, oracles.initial_q, rng=get_random_generator(random_seed), **settings._asdict()
    )
    oracles.ensure_rows_finite()  # where the search made no pass over every row
    if result.failure is not None:
        funnel = funnel_explanation(model, value_vars)
        if funnel:
            result = replace(result, failure=f"{funnel} (the optimiser: {result.failure})")
        warn_user(
            f"find_reference_point: {result.failure}. A step with control variates refuses "
            "this reference point."
        )
    elif not result.converged:
        warn_user(
            f"find_reference_point stopped after max_iter={max_iter} iterations with squared "
            f"Newton decrement {result.newton_decrement_sq:.3g} "
            f"(tol={search_tol(tol, oracles.n_rows)}), within about one posterior sd of the "
            "mode: good enough for control variates; raise max_iter to converge."
        )
    # A step built next on the same model, data and start finds it instead of searching again.
    oracles.references[(*oracles.state_key(oracles.initial_q), settings)] = result
    point, initvals = _points(model, value_vars, initial_point, result.q)
    return ReferencePoint(**result.__dict__, point=point, initvals=initvals)


def funnel_explanation(model: pm.Model, value_vars: Sequence[TensorVariable]) -> str:
    """Explain a centred hierarchy among ``value_vars``, where no mode exists; empty if none.

    That is a positive free variable (a scale) that is a parameter of another free variable,
    both optimised.
    """
    optimised = {model.values_to_rvs[v] for v in value_vars}
    free = set(model.free_RVs)
    pairs = []
    for group in model.free_RVs:
        if group not in optimised or group.owner is None:
            continue
        parents = set(ancestors(group.owner.inputs, blockers=list(free))) & free & optimised
        pairs += [
            (str(parent.name), str(group.name))
            for parent in parents
            if parent is not group and model.rvs_to_transforms.get(parent) is not None
        ]
    if not pairs:
        return ""
    scale, group = pairs[0]
    return (
        f"{scale!r} is a positive parameter (a scale) of the free variable {group!r}: in this "
        "centred hierarchy the joint posterior has no mode, its density grows without bound as "
        f"{scale!r} goes to 0 with {group!r} at its mean (a funnel), and the optimiser follows "
        f"it there. Find the reference point for the variables the likelihood sees only, "
        f"without {scale!r} and the group mean (pms.find_reference_point([{group}, ...])), and "
        f"sample {scale!r} and the group mean in their own step without control variates; or "
        "sample without control variates (control_variate=None)"
    )


#: Seed of the steps' automatic reference search: the same model, data and start give the same
#: reference point, so that pm.sample(random_seed=...) repeats a run in a new process.
AUTOMATIC_SEARCH_SEED = 20_171_213


def automatic_reference(oracles: ModelOracles, funnel: str = "") -> Optimum:
    """Return the reference point of a step given none: searched once per data and start.

    The search (default settings, fixed seed) starts at ``oracles.initial_q``; its result is
    kept with the model's compiled functions, so every step and chain built on the same model,
    data and start reuses it, as does a step built after :func:`find_reference_point` with the
    default settings. After ``pm.set_data`` the key changes and the search runs again.
    ``funnel`` (from :func:`funnel_explanation`) is prefixed to the message of a failure.
    """
    settings = _DEFAULTS
    key = (*oracles.state_key(oracles.initial_q), settings)
    found = oracles.references.get(key)
    if found is None:
        rng = np.random.default_rng(AUTOMATIC_SEARCH_SEED)
        found = optimise_reference(oracles, oracles.initial_q, rng=rng, **settings._asdict())
        if found.failure is not None and funnel:
            found = replace(found, failure=f"{funnel} (the optimiser: {found.failure})")
        oracles.references[key] = found
    return cast(Optimum, found)


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

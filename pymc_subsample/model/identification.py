"""Warn, before sampling, when flat priors make the posterior improper.

With proper priors the posterior is always proper. A ``pm.Flat`` or ``pm.HalfFlat`` prior leaves
it to the data: if the likelihood is flat along a direction of those parameters (a predictor
that is a combination of others, a parameter that no row depends on) the posterior is flat there
too, has no normalising constant, and a chain drifts without bound whatever the step.

The test is the empirical Fisher information of the flat-prior coordinates near the initial
point, ``F = sum_i s_i s_i^T`` with ``s_i`` the row's score: ``v^T F v = sum_i (s_i . v)^2`` is
zero exactly when no row's log-likelihood changes, to first order, along ``v``. It is read at
the initial point jittered (a fixed seed, as the self-check's): at the initial point itself a
non-centred hierarchy's ``z`` is 0, and the rows do not change along its flat scale ``tau`` in
``tau * z[g]`` there, though they identify it everywhere else. In a model whose rows
are linear in the parameters (regressions with an identity or GLM link) this does not depend on
the point, so a singular ``F`` is the improper posterior itself; elsewhere it is a warning sign
that the user can check. What it cannot see is a likelihood that is bounded but never peaks, such
as logistic regression on separable data (``find_reference_point`` reports that: no mode).
``docs/architecture.md`` ("Which models are refused") lists this check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from pymc.distributions.continuous import FlatRV, HalfFlatRV
from pymc.model import Model
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.self_check import JITTER_SD
from pymc_subsample.warnings import warn_user

__all__ = [
    "MAX_ROWS",
    "SINGULAR",
    "flat_prior_coordinates",
    "refuse_flat_priors_outside_the_likelihood",
    "unidentified_coordinates",
    "warn_if_unidentified",
]

#: Rows read by the check: all of them up to this many, else this many evenly spaced.
MAX_ROWS = 100_000
#: Smallest eigenvalue of the Fisher information's correlation matrix that counts as nonzero;
#: below it the flat direction is within rounding of exact (an exactly collinear predictor gives
#: about 1e-16, two predictors correlated at 0.99999 give 1e-5).
SINGULAR = 1e-10
#: Components of the flat direction below this share of its largest are not named.
NAMED_SHARE = 0.1
#: The seed of the noise (``self_check.JITTER_SD``) that moves the check's point.
JITTER_SEED = 20_161_017


def flat_prior_coordinates(
    model: Model, vars: Sequence[TensorVariable], initial_point: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Positions in the raveled ``q`` of the step's variables whose prior is flat.

    A flat-prior variable that another free variable's distribution reads (a hierarchy's
    ``mu`` and ``tau`` in ``a ~ Normal(mu, tau)``) is left out: that distribution gives it
    information whether or not any row reads it, and its posterior is not flat.

    Parameters
    ----------
    model : pymc.Model
        The user's model.
    vars : sequence of TensorVariable
        The step's value variables, in the order ``q`` ravels them.
    initial_point : mapping
        A point of the model, for the variables' sizes.

    Returns
    -------
    dict
        The random variable's name (``pm.Flat`` or ``pm.HalfFlat``) to its indices in ``q``.
    """
    coordinates: dict[str, np.ndarray] = {}
    offset = 0
    read_by_priors: set[Variable] | None = None
    for value in vars:
        size = int(np.size(initial_point[str(value.name)]))
        rv = model.values_to_rvs[value]
        if rv.owner is not None and isinstance(rv.owner.op, FlatRV | HalfFlatRV):
            if read_by_priors is None:
                read_by_priors = _read_by_priors(model)
            if rv not in read_by_priors:
                coordinates[str(rv.name)] = np.arange(offset, offset + size)
        offset += size
    return coordinates


def _read_by_priors(model: Model) -> set[Variable]:
    """Return the free random variables that some other free variable's distribution reads."""
    free = set(model.free_RVs)
    read: set[Variable] = set()
    for rv in model.free_RVs:
        assert rv.owner is not None
        read.update(v for v in ancestors(rv.owner.inputs) if v in free and v is not rv)
    return read


def refuse_flat_priors_outside_the_likelihood(coordinates: Mapping[str, np.ndarray]) -> None:
    """Refuse flat-prior variables of a step whose variables no row of the likelihood reads.

    Parameters
    ----------
    coordinates : mapping
        From :func:`flat_prior_coordinates`; nothing is done when empty.

    Raises
    ------
    ValueError
        Naming the variables: their posterior is their flat prior, which is improper.
    """
    if not coordinates:
        return
    one = len(coordinates) == 1
    raise ValueError(
        f"{', '.join(coordinates)} {'has a flat prior' if one else 'have flat priors'} "
        "(pm.Flat or pm.HalfFlat) and no row of the likelihood depends on the sampled "
        f"variables, so {'its' if one else 'their'} posterior is flat and improper: a chain "
        f"would drift without bound. Give {'it a proper prior' if one else 'them proper priors'}"
        " (for example pm.Normal(name, 0, 10))."
    )


def unidentified_coordinates(fisher: np.ndarray, labels: Sequence[str]) -> list[str]:
    """Labels of the coordinates along which ``fisher`` is singular (empty if it is not).

    Coordinates with zero information are named on their own; otherwise the ones that carry the
    flattest direction (the eigenvector of the smallest eigenvalue of the correlation matrix
    ``D^{-1/2} F D^{-1/2}``), when that eigenvalue is below :data:`SINGULAR`.

    Examples
    --------
    >>> x = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 1.0], [2.0, 0.0, 2.0], [1.0, 1.0, 2.0]])
    >>> unidentified_coordinates(x.T @ x, ["a", "b", "c"])  # c = a + b
    ['a', 'b', 'c']
    >>> unidentified_coordinates(x[:, :2].T @ x[:, :2], ["a", "b"])
    []
    """
    diagonal = np.diag(fisher).copy()
    largest = float(diagonal.max(initial=0.0))
    zero = diagonal <= SINGULAR * max(largest, np.finfo(float).tiny)
    if zero.any():
        return [label for label, z in zip(labels, zero, strict=True) if z]
    scale = 1.0 / np.sqrt(diagonal)
    values, vectors = np.linalg.eigh(fisher * np.outer(scale, scale))
    if values[0] > SINGULAR:
        return []
    direction = np.abs(vectors[:, 0])
    named = direction >= NAMED_SHARE * direction.max()
    return [label for label, n in zip(labels, named, strict=True) if n]


def warn_if_unidentified(
    coordinates: Mapping[str, np.ndarray],
    score_rows: Callable[[np.ndarray, np.ndarray], np.ndarray],
    n_rows: int,
    q: np.ndarray,
    chunk_size: int = 8192,
) -> None:
    """Warn (``SubsampleWarning``) if the data leave flat-prior coordinates unidentified at ``q``.

    Parameters
    ----------
    coordinates : mapping
        From :func:`flat_prior_coordinates`; nothing is done when empty.
    score_rows : callable
        ``score_rows(q, rows)``: per-row gradients, shape ``(len(rows), len(q))``.
    n_rows : int
        Rows in the data; at most :data:`MAX_ROWS` of them are read, once, at set-up.
    q : ndarray
        The step's initial point, continuous everywhere; the scores are read at it jittered
        (module doc), or at it where a jittered row's score is not finite.
    chunk_size : int, default 8192
        Rows per call of ``score_rows``.
    """
    if not coordinates:
        return
    index = np.concatenate(list(coordinates.values()))
    labels = [
        name if len(where) == 1 else f"{name}[{k}]"
        for name, where in coordinates.items()
        for k in range(len(where))
    ]
    rows = (
        np.arange(n_rows, dtype="int64")
        if n_rows <= MAX_ROWS
        else np.linspace(0, n_rows - 1, MAX_ROWS).astype("int64")
    )
    jittered = q + np.random.default_rng(JITTER_SEED).normal(scale=JITTER_SD, size=q.size)
    fisher = _fisher_information(score_rows, jittered, rows, index, chunk_size)
    if not np.all(np.isfinite(fisher)):
        fisher = _fisher_information(score_rows, q, rows, index, chunk_size)
    unidentified = unidentified_coordinates(fisher, labels)
    if unidentified:
        warn_user(
            f"The posterior is probably improper: {', '.join(unidentified)} "
            f"{'has a flat prior' if len(unidentified) == 1 else 'have flat priors'} "
            "(pm.Flat or pm.HalfFlat) and the data do not identify "
            f"{'it' if len(unidentified) == 1 else 'them, or a combination of them'} (no "
            "row's log-likelihood changes along that direction near the initial point). The "
            "posterior is then flat in that direction and chains drift without bound, with "
            "this step or any other. Give these parameters proper priors (for example "
            "pm.Normal(name, 0, 10)) or remove the predictors that repeat others."
        )


def _fisher_information(
    score_rows: Callable[[np.ndarray, np.ndarray], np.ndarray],
    q: np.ndarray,
    rows: np.ndarray,
    index: np.ndarray,
    chunk_size: int,
) -> np.ndarray:
    """``sum_i s_i s_i^T`` over ``rows``, the scores' entries at ``index`` only, at ``q``."""
    fisher = np.zeros((index.size, index.size))
    with np.errstate(all="ignore"):
        for start in range(0, rows.size, chunk_size):
            scores = score_rows(q, rows[start : start + chunk_size])[:, index]
            fisher += scores.T @ scores
    return fisher

"""The oracles' self-check: subset rows against the full model, every row finite at the start.

``build_oracles`` runs it on every new set of oracles (``docs/architecture.md``). It reads the
data in chunks of rows and never holds a copy of them: PyMC's own per-row terms, one pass over
all rows, are its reference only where the data have at most :data:`_FULL_REFERENCE_ROWS` rows.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.row_data import Rows, row_chunks
from pymc_subsample.model.rows import RowLayout

__all__ = ["CheckedOracles", "check_rows_finite", "self_check"]

#: Fixed seed of the construction-time self-check (deterministic, not a statistical test).
_SELF_CHECK_SEED = 20140614
#: The sd of the normal noise that moves a checked point away from the initial one, where a
#: value such as 0 can hide what the check looks for (also ``identification.py``'s).
JITTER_SD = 0.3
#: Rows per call when the self-check reads every row at the initial point.
_FINITE_CHUNK = 65_536
#: Up to this many rows, the checked rows are compared with PyMC's own per-row terms, one
#: vectorised pass over every row (its arrays are the size of the data, and a float32 array
#: is upcast whole by ``X @ beta``: 2x the data, so it is kept to one chunk's size). Beyond,
#: they are compared with the same rows read among :data:`_CONTEXT_ROWS` others.
_FULL_REFERENCE_ROWS = 65_536
#: Other rows read with the checked rows beyond :data:`_FULL_REFERENCE_ROWS`.
_CONTEXT_ROWS = 1_024


class CheckedOracles(Protocol):
    """What the self-check reads of the oracles (``ModelOracles`` has it)."""

    @property
    def n_rows(self) -> int:
        """Number of rows N on the row axis."""
        ...

    @property
    def layout(self) -> RowLayout:
        """Which observed variables were subsampled."""
        ...

    def loglik_rows(self, q: np.ndarray, idx: Rows) -> np.ndarray:
        """Per-row log-likelihood of the rows ``idx``."""
        ...

    def setup_log_prior(self, q: np.ndarray) -> float:
        """Return the prior part of the log-density (interpreted at first: set-up calls)."""
        ...

    def data_shapes(self) -> str:
        """Describe the data arrays read and their shapes."""
        ...

    def loglik_total(self, q: np.ndarray) -> float | None:
        """Return every row's log-likelihood summed on every core, or None (not shared)."""
        ...

    @property
    def rows_on_dask(self) -> bool:
        """Whether the rows are on Dask (the model itself holds a placeholder's rows only)."""
        ...


def self_check(
    oracles: CheckedOracles,
    full_fn: LazyFunction,
    q0: np.ndarray,
    continuous: np.ndarray,
    check_finite: bool = True,
) -> None:
    """Check the per-row function against the full model on a few rows, at a jittered point.

    The rows' function is the model's likelihood rebuilt on row subsets of the data
    (``rows.py``). On data of at most :data:`_FULL_REFERENCE_ROWS` rows, the full model's own
    per-row log-likelihood (``full_fn``, one vectorised pass over every row in PyTensor's
    Python linker, no compilation) must agree with it on the checked rows. On more rows that
    pass would hold arrays the size of the data (a float32 ``X`` upcast whole by ``X @
    beta``), so each checked row's value must instead not change when the row is read among
    :data:`_CONTEXT_ROWS` other rows: a reduction over rows inside the model (``X -
    X.mean(0)``) gives it another value there, as an array of length N that is not on the row
    axis does (or fails). One point suffices, jittered away from ``q0``, where a value such as
    0 could hide a reduction over rows (``X - X.mean(0)`` times a zero coefficient). At ``q0``
    itself every row must have a finite log-likelihood: checked range by range with the
    compiled per-row function (no copy of the data); with ``check_finite`` False that is left
    to :func:`check_rows_finite`, called later (``docs/architecture.md``, "Full-data
    passes": the first pass over every row checks it for free). Only the ``continuous``
    entries of ``q0`` are jittered: a discrete value moved off its support is cast at
    different places by the two functions.
    """
    n_rows = oracles.n_rows
    check_rng = np.random.default_rng(_SELF_CHECK_SEED)
    sample = check_rng.choice(n_rows, size=min(n_rows, 6), replace=False)
    rows = np.unique(np.concatenate([[0, n_rows - 1], sample])).astype("int64")
    names = [str(rv.name) for rv in oracles.layout.row_rvs]
    jittered = q0 + continuous * check_rng.normal(scale=JITTER_SD, size=q0.size)
    try:
        subset = oracles.loglik_rows(jittered, rows)
        full_reference = n_rows <= _FULL_REFERENCE_ROWS and not oracles.rows_on_dask
        if full_reference:
            full = full_fn(jittered)[rows]
        else:
            full = _among_other_rows(oracles, jittered, rows, check_rng)
        bad = _nonfinite_rows(oracles, q0) if check_finite else np.empty(0, dtype=np.int64)
    except Exception as error:
        raise ValueError(
            f"The likelihood of {names} could not be evaluated on a subset of rows "
            f"({type(error).__name__}: {error}). Per-row latent variables (a free variable "
            "with one entry per row) cannot be subsampled; if some array of length "
            f"N={n_rows} is not row-aligned, give the rows a named dim and pass obs_dim. "
            "Arrays that should hold the same rows must have the same length; the data "
            f"arrays read: {oracles.data_shapes()}."
        ) from error
    if not np.allclose(subset, full, rtol=1e-6, atol=1e-8, equal_nan=True):
        raise ValueError(
            f"Self-check failed: the log-likelihood of {names} evaluated on a subset of rows "
            + (
                "differs from the full model's value for the same rows."
                if full_reference
                else "changes when the same rows are read among other rows."
            )
            + " The model probably "
            "transforms data with a reduction over rows (for example standardising with "
            "X.mean(0) inside the model): do that in numpy before building the model. If an "
            f"array of length N={n_rows} is not row-aligned, name the row dim via obs_dim."
        )
    _check_initial_finite(bad, oracles.setup_log_prior(q0), names)


def check_rows_finite(oracles: CheckedOracles, q0: np.ndarray) -> None:
    """Raise a ``ValueError`` naming the rows whose log-likelihood is not finite at ``q0``."""
    names = [str(rv.name) for rv in oracles.layout.row_rvs]
    _check_initial_finite(_nonfinite_rows(oracles, q0), oracles.setup_log_prior(q0), names)


def _among_other_rows(
    oracles: CheckedOracles, q: np.ndarray, rows: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Return the values of ``rows`` at ``q`` read among :data:`_CONTEXT_ROWS` other rows."""
    context = rng.choice(oracles.n_rows, size=min(_CONTEXT_ROWS, oracles.n_rows), replace=False)
    read = np.unique(np.concatenate([rows, context])).astype("int64")
    return oracles.loglik_rows(q, read)[np.searchsorted(read, rows)]


def _nonfinite_rows(oracles: CheckedOracles, q: np.ndarray) -> np.ndarray:
    """Rows whose log-likelihood at ``q`` is not finite, read range by range in place.

    On data large enough for a pass shared among the cores (``model/parallel_pass.py``), a
    finite sum of every row's value says that none is NaN or infinite (a sum of finite values
    overflows only beyond 1e308), and the rows are listed only when it is not.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        total = oracles.loglik_total(q)
    if total is not None and np.isfinite(total):
        return np.empty(0, dtype=np.int64)
    bad: list[np.ndarray] = []
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for piece in row_chunks(oracles.n_rows, _FINITE_CHUNK):
            values = oracles.loglik_rows(q, piece)
            bad.append(piece.start + np.flatnonzero(~np.isfinite(values)))
    return np.concatenate(bad)


def _check_initial_finite(bad: np.ndarray, log_prior: float, names: list[str]) -> None:
    if bad.size:
        raise ValueError(
            f"The log-likelihood of {names} is not finite at the initial point for rows "
            f"{bad[:10].tolist()} ({bad.size} rows in all). Check the data for NaN/inf; if the "
            "data are fine, start the parameters where every row has positive density by giving "
            "them initial values in the model (initval= on the variable, or "
            "model.set_initval(var, value)) before building the step: the step is built at the "
            "model's initial point, so pm.sample(initvals=...) comes too late."
        )
    if not np.isfinite(log_prior):
        raise ValueError(
            "The prior log-density is not finite at the initial point. Give initial values inside "
            "the support in the model (initval= on the variable, or model.set_initval(var, "
            "value)) before building the step: the step is built at the model's initial point, "
            "so pm.sample(initvals=...) comes too late."
        )

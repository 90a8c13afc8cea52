"""Compile the functions ("oracles") that the kernels call, over the raveled vector ``q``.

``q`` is the concatenation of the step's value variables in the unconstrained space, in the
order of ``vars``, as :class:`pymc.blocking.DictToArrayBijection` ravels them. Variables of the
model that the step does not sample are read from shared variables that PyMC updates before
each step (``make_shared_replacements``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple, cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.model import Model
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pymc.vartypes import discrete_types
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.gradient import disconnected_grad, jacobian
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorConstant, TensorVariable

from pymc_subsample.model.checks import check_no_per_row_latents
from pymc_subsample.model.compiled import (
    GraphBuilder,
    LazyFunction,
    NumbaKernel,
    collection_paused,
)
from pymc_subsample.model.gradients import (
    per_row_gradient,
    per_row_proxy_terms,
    summed_gradient_and_hessian,
    with_static_length,
)
from pymc_subsample.model.identification import (
    flat_prior_coordinates,
    refuse_flat_priors_outside_the_likelihood,
    warn_if_unidentified,
)
from pymc_subsample.model.likelihood_parameters import likelihood_parameters
from pymc_subsample.model.rows import (
    RowLayout,
    find_row_layout,
    gather_missing_rows,
    row_loglik_graph,
)

__all__ = [
    "DataTracker",
    "LikelihoodSpace",
    "ModelFunctions",
    "ModelOracles",
    "Rows",
    "SearchSums",
    "build_oracles",
    "check_continuous",
    "discrete_names",
    "row_chunks",
]

#: Rows to read: int64 indices, or a slice for a contiguous range (read in place, no copy).
Rows = np.ndarray | slice

#: Fixed seed of the construction-time self-check (deterministic, not a statistical test).
_SELF_CHECK_SEED = 20140614
#: Rows per call when the self-check reads every row at the initial point.
_FINITE_CHUNK = 65_536


class SearchSums(NamedTuple):
    """What one pass of the reference search reads from a set of rows at a point ``q``.

    Attributes
    ----------
    loglik : float
        ``sum_i loglik_i(q)``.
    gradient : ndarray
        ``sum_i s_i``, the rows' summed gradient (scores ``s_i = d loglik_i / dq``).
    outer : ndarray
        ``sum_i s_i s_i^T`` (d x d): the scores' spread, for the direction test.
    hessian : ndarray or None
        ``sum_i d^2 loglik_i / dq^2`` (d x d); None when not asked for.
    """

    loglik: float
    gradient: np.ndarray
    outer: np.ndarray
    hessian: np.ndarray | None


class LikelihoodSpace(NamedTuple):
    """The functions of control variates expanded in the likelihood's parameters ``theta``.

    ``theta = phi(q)`` (``model/likelihood_parameters.py``): the Taylor proxies are polynomials
    in ``theta``, their sums ``d_theta``-dimensional. Each function compiles at first use.
    """

    size: int
    phi: LazyFunction  # q -> theta
    pullback: LazyFunction  # q, v -> J_phi(q)^T v
    residual: dict[int, LazyFunction]  # q, q_old, theta_ref, rows -> l_i - r_i
    sums: LazyFunction  # theta_ref, rows -> (G, H) in theta
    remainder_gradient: LazyFunction  # q, theta_ref, factor, rows


@dataclass(frozen=True)
class ModelFunctions:
    """The compiled functions of one model and set of step variables, shared by every user.

    Built once per (model, variables, row dimension, compile options) and process by
    :func:`build_oracles`; each function compiles at its first call (:class:`LazyFunction`).

    Attributes
    ----------
    layout : RowLayout
        Which observed variables were subsampled and which are evaluated in full.
    shared : dict
        Shared variables standing for model variables the step does not sample.
    rows_depend_on_q : bool
        Whether some row's log-likelihood depends on the sampled variables (per-row gradients
        exist only then).
    other_variables_in_rows : tuple of str
        Free variables the step does not sample that the row log-likelihood reads.
    """

    layout: RowLayout
    shared: dict[Variable, Variable]
    rows_depend_on_q: bool
    other_variables_in_rows: tuple[str, ...]
    prior: LazyFunction
    prior_ratio: LazyFunction
    rows: LazyFunction
    ratio: LazyFunction
    full_rows: LazyFunction
    score: LazyFunction
    prior_grad: LazyFunction
    posterior_gradient: LazyFunction
    remainder_gradient: LazyFunction
    residual: dict[int, LazyFunction]
    sums: LazyFunction
    search: dict[bool, LazyFunction]
    prior_hessian: LazyFunction
    row_data: tuple[Variable, ...]
    data: tuple[SharedVariable, ...]
    frozen: tuple[tuple[SharedVariable, SharedVariable], ...]
    flat: dict[str, np.ndarray]
    #: Builds (once, at first call) the functions in the likelihood's parameters; None when
    #: the rows' graph has no usable cut (``likelihood_parameters``).
    likelihood_space: Callable[[], LikelihoodSpace | None]
    #: Reference points found on these functions, by data, start and settings (reference.py).
    references: dict[tuple[Any, ...], Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelOracles:
    """Compiled functions of the raveled unconstrained parameter vector ``q``.

    Attributes
    ----------
    initial_q : ndarray
        The raveled unconstrained initial point the oracles were built at.
    proxy_order : int
        Order of the Taylor proxies of :meth:`residual_ratio_rows` (0 when none are used).
    expansion : {"unconstrained", "likelihood"}
        The space of the Taylor proxies: ``q`` itself, or the likelihood's parameters
        ``theta = phi(q)`` (:meth:`in_likelihood_parameters`). The methods that take an
        expansion point (``q_ref``) take it in that space.

    """

    initial_q: np.ndarray
    _functions: ModelFunctions
    proxy_order: int = 0
    _data: DataTracker | None = None
    expansion: str = "unconstrained"

    def in_likelihood_parameters(self) -> ModelOracles | None:
        """Return these oracles with Taylor proxies in the likelihood's parameters, or None.

        None where the rows' graph reads ``q`` through no usable cut, or through one with more
        entries than ``q`` (whose sums would cost more than ``q``'s).
        """
        space = self._functions.likelihood_space()
        if space is None or space.size > self.n_params:
            return None
        return replace(self, expansion="likelihood")

    def in_unconstrained(self) -> ModelOracles:
        """Return these oracles with Taylor proxies in ``q`` itself (the default)."""
        if self.expansion == "unconstrained":
            return self
        return replace(self, expansion="unconstrained")

    @property
    def expansion_size(self) -> int:
        """Length of the expansion point: ``d``, or the likelihood's parameters' count."""
        return self.n_params if self.expansion == "unconstrained" else self._space.size

    def expansion_point(self, q: np.ndarray) -> np.ndarray:
        """``q`` in the proxies' space: ``q`` itself, or ``phi(q)``."""
        if self.expansion == "unconstrained":
            return q
        return np.asarray(self._space.phi(q))

    def expansion_pullback(self, q: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """Take a gradient in the proxies' space back to ``q``: ``J_phi(q)^T vector``."""
        if self.expansion == "unconstrained":
            return vector
        return np.asarray(self._space.pullback(q, vector))

    @property
    def _space(self) -> LikelihoodSpace:
        space = self._functions.likelihood_space()
        if space is None:  # pragma: no cover - in_likelihood_parameters returned None
            raise RuntimeError("these oracles have no likelihood-parameter space")
        return space

    @property
    def layout(self) -> RowLayout:
        """Which observed variables were subsampled and which are evaluated in full."""
        return self._functions.layout

    @property
    def shared(self) -> dict[Variable, Variable]:
        """Shared variables standing for model variables this step does not sample."""
        return self._functions.shared

    @property
    def rows_depend_on_q(self) -> bool:
        """Whether some row's log-likelihood depends on ``q`` (else no per-row gradients)."""
        return self._functions.rows_depend_on_q

    @property
    def other_variables_in_rows(self) -> tuple[str, ...]:
        """Free variables outside ``q`` that the row log-likelihood reads (another step's)."""
        return self._functions.other_variables_in_rows

    @property
    def n_rows(self) -> int:
        """Number of rows N on the row axis, for the data as of the last :meth:`refresh_data`."""
        return self._tracker.n_rows

    def refresh_data(self) -> bool:
        """Re-read the model's data after ``pm.set_data``; whether anything changed.

        O(1) when nothing changed (the data arrays are compared by identity and shape, as
        ``pm.set_data`` replaces them). Changes made in place to a data array are not seen.
        """
        return self._tracker.refresh()

    def data_fingerprint(self) -> tuple[Any, ...]:
        """Identity and shape of every data array read: equal while the data are unchanged."""
        return self._tracker.fingerprint()

    def with_proxy_order(self, proxy_order: int) -> ModelOracles:
        """Return the same oracles (functions, data view) with Taylor proxies of this order."""
        if proxy_order not in (0, 1, 2):
            raise ValueError(f"proxy_order must be 0, 1 or 2, got {proxy_order!r}.")
        return replace(self, proxy_order=proxy_order)

    def state_key(self, q: np.ndarray) -> tuple[Any, ...]:
        """Return what a result computed from ``q`` depends on: data, ``q``, other variables.

        The other variables are the model variables this step does not sample, at their
        current values.
        """
        others = tuple(
            np.asarray(live.get_value(borrow=True)).tobytes() for live, _ in self._functions.frozen
        )
        return (self.data_fingerprint(), np.asarray(q, dtype="float64").tobytes(), others)

    @property
    def references(self) -> dict[tuple[Any, ...], Any]:
        """Reference points found on these oracles' functions, by :meth:`state_key` and settings."""
        return self._functions.references

    @property
    def _tracker(self) -> DataTracker:
        if self._data is None:
            raise RuntimeError("ModelOracles was built without a DataTracker (use build_oracles).")
        return self._data

    @property
    def n_params(self) -> int:
        """Length of ``q``."""
        return self.initial_q.size

    def log_prior(self, q: np.ndarray) -> float:
        """Free-variable log-densities with Jacobians, Potentials, and off-row observed terms."""
        return float(self._functions.prior(q))

    def log_prior_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> float:
        """``log_prior(q_new) - log_prior(q_old)`` in one call."""
        return float(self._functions.prior_ratio(q_new, q_old))

    def loglik_rows(self, q: np.ndarray, idx: Rows) -> np.ndarray:
        """Per-row log-likelihood of the rows ``idx`` (int64 indices or a slice); O(len(idx))."""
        return self._functions.rows(q, *self._gather(idx))

    def loglik_ratio_rows(
        self, q_new: np.ndarray, q_old: np.ndarray, idx: np.ndarray
    ) -> np.ndarray:
        """Per-row ``loglik_i(q_new) - loglik_i(q_old)`` of the int64 rows ``idx``, in one call."""
        return self._functions.ratio(q_new, q_old, *self._gather(idx))

    def score_rows(self, q: np.ndarray, idx: Rows) -> np.ndarray:
        """Per-row gradients ``d loglik_i / dq`` of the rows ``idx``: shape (len(idx), d)."""
        return self._gradient("score_rows", self._functions.score)(
            q, *[rows[:, None] for rows in self._gather(idx)]
        )

    def log_prior_grad(self, q: np.ndarray) -> np.ndarray:
        """Gradient of :meth:`log_prior`."""
        return self._gradient("log_prior_grad", self._functions.prior_grad)(q)

    def gradient_on_rows(
        self, rows: np.ndarray | None, temperature: float = 1.0
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``q -> log_prior_grad(q) + N / (n T) * sum of score_rows(q, rows)``, rows read once.

        Unbiased for rows drawn with replacement: the gradient estimate of stochastic-gradient
        Langevin dynamics (Korattikara et al. 2016, eq. 21) and of a trajectory's leapfrog
        steps, with the likelihood tempered by ``1 / temperature``. The rows' data are gathered
        once for any number of points, and one compiled call takes the gradient of the rows'
        sum (no per-row matrix). ``rows=None`` is every row, read in place (no copy): the exact
        gradient of the tempered log posterior.
        """
        function = self._gradient("gradient_on_rows", self._functions.posterior_gradient)
        if rows is None:
            data = [_data_value(array) for array in self._functions.row_data]
            n_used = self.n_rows
        else:
            data, n_used = self._gather(rows), rows.size
        factor = np.asarray(self.n_rows / (n_used * temperature), dtype="float64")

        def gradient(q: np.ndarray) -> np.ndarray:
            return np.asarray(function(q, factor, *data))

        return gradient

    def remainder_gradient_on_rows(
        self, rows: np.ndarray, q_ref: np.ndarray, temperature: float = 1.0
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``q -> log_prior_grad(q) + N / (n T) * sum of the rows' second-order remainders``.

        The remainder of row ``i`` is its score's difference from its first-order Taylor
        expansion at ``q_ref``: ``s_i(q) - s_i(q_ref) - H_i(q_ref) (q - q_ref)``. Adding the
        expansion's exact sum over all N rows, ``(G + H (q - q_ref)) / T`` (the second-order
        control variate's sums), gives an unbiased gradient estimate whose noise vanishes
        where the rows' log-likelihoods are quadratic, as a Gaussian likelihood is in its
        location parameters: the gradient counterpart of the second-order difference estimator
        (Quiroz et al. 2019; ``docs/hmc.md``). One compiled call per point: the rows' summed
        gradient at ``q`` and a Hessian-vector product at ``q_ref`` (about three gradients'
        cost); the rows' data are gathered once.
        """
        remainder = (
            self._functions.remainder_gradient
            if self.expansion == "unconstrained"
            else self._space.remainder_gradient
        )
        function = self._gradient("remainder_gradient_on_rows", remainder)
        data = self._gather(rows)
        factor = np.asarray(self.n_rows / (rows.size * temperature), dtype="float64")
        reference = np.asarray(q_ref, dtype="float64")

        def gradient(q: np.ndarray) -> np.ndarray:
            return np.asarray(function(q, reference, factor, *data))

        return gradient

    def residual_ratio_rows(
        self, q_new: np.ndarray, q_old: np.ndarray, q_ref: np.ndarray, idx: np.ndarray
    ) -> np.ndarray:
        """Per-row ``l_i(q_new) - l_i(q_old)`` minus the Taylor proxies' difference at ``q_ref``.

        The proxies are of order :attr:`proxy_order` (1 or 2), expanded at ``q_ref`` with the
        other model variables frozen at their values at the last :meth:`freeze_shared`, so that
        :meth:`gradient_hessian_sums` sums exactly the proxies subtracted here.
        """
        if self.proxy_order not in self._functions.residual:
            raise RuntimeError("residual_ratio_rows needs build_oracles(..., proxy_order=1 or 2).")
        functions = (
            self._functions.residual if self.expansion == "unconstrained" else self._space.residual
        )
        residual = self._gradient("residual_ratio_rows", functions[self.proxy_order])
        return residual(q_new, q_old, q_ref, *self._gather(idx))

    def gradient_hessian_sums(
        self, q: np.ndarray, idx: np.ndarray | None = None, chunk_size: int = 8192
    ) -> tuple[np.ndarray, np.ndarray]:
        """``sum_i grad loglik_i(q)`` and ``sum_i hess loglik_i(q)`` over rows ``idx`` (all rows).

        Rows are summed in chunks of ``chunk_size`` rows: O(N) time, O(chunk_size * d)
        memory. Other model variables are read at their frozen values (:meth:`freeze_shared`).
        """
        sums = self._functions.sums if self.expansion == "unconstrained" else self._space.sums
        sums_fn = self._gradient("gradient_hessian_sums", sums)
        d = self.expansion_size
        gradient, hessian = np.zeros(d), np.zeros((d, d))
        chunks: Iterator[Rows]
        if idx is None:
            chunks = row_chunks(self.n_rows, chunk_size)
        else:
            rows_all = np.asarray(idx, dtype="int64")
            chunks = (
                rows_all[start : start + chunk_size]
                for start in range(0, rows_all.size, chunk_size)
            )
        for rows in chunks:
            chunk_gradient, chunk_hessian = sums_fn(q, *self._gather(rows))
            gradient += chunk_gradient
            hessian += chunk_hessian
        return gradient, hessian

    def search_sums(
        self, q: np.ndarray, idx: Rows, *, with_hessian: bool, chunk_size: int = 8192
    ) -> SearchSums:
        """Sum over the rows ``idx`` at ``q`` what one iteration of the reference search needs.

        One compiled call per chunk of ``chunk_size`` rows returns the rows' summed
        log-likelihood, gradient, scores' outer products and (``with_hessian``) Hessian, so
        an iteration reads its rows once: O(len(idx)) time, O(chunk_size * d) memory. A slice
        is read in place. Other model variables are read at their current values.
        """
        function = self._gradient("search_sums", self._functions.search[with_hessian])
        d = self.n_params
        loglik, gradient, outer = 0.0, np.zeros(d), np.zeros((d, d))
        hessian = np.zeros((d, d)) if with_hessian else None
        pieces: Iterator[Rows]
        if isinstance(idx, slice):
            start, stop, _ = idx.indices(self.n_rows)
            pieces = (
                slice(start + piece.start, start + piece.stop)
                for piece in row_chunks(stop - start, chunk_size)
            )
        else:
            pieces = (idx[begin : begin + chunk_size] for begin in range(0, idx.size, chunk_size))
        for rows in pieces:
            sums = function(q, *[array[:, None] for array in self._gather(rows)])
            loglik += float(sums[0])
            gradient += sums[1]
            outer += sums[2]
            if hessian is not None:
                hessian += sums[3]
        return SearchSums(loglik, gradient, outer, hessian)

    def log_prior_hessian(self, q: np.ndarray) -> np.ndarray:
        """Hessian of :meth:`log_prior` (d x d)."""
        return self.log_prior_derivatives(q)[1]

    def log_prior_derivatives(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gradient and Hessian of :meth:`log_prior` in one call (one compiled function)."""
        gradient, hessian = self._gradient("log_prior_hessian", self._functions.prior_hessian)(q)
        return gradient, hessian

    def freeze_shared(self) -> None:
        """Copy the current values of the variables this step does not sample into the proxies."""
        for live, frozen in self._functions.frozen:
            frozen.set_value(np.array(live.get_value(borrow=True), copy=True))

    def frozen_values(self) -> list[np.ndarray]:
        """Return copies of the frozen values (see :meth:`freeze_shared`)."""
        return [np.array(frozen.get_value(), copy=True) for _, frozen in self._functions.frozen]

    def set_frozen(self, values: list[np.ndarray]) -> None:
        """Set the frozen copies to ``values`` (as returned by :meth:`frozen_values`)."""
        for (_, frozen), value in zip(self._functions.frozen, values, strict=True):
            frozen.set_value(value)

    def row_arrays(self) -> list[np.ndarray]:
        """Return the row-aligned data arrays the row functions read, in order (no copy)."""
        return [_data_value(array) for array in self._functions.row_data]

    def numba_kernels(self) -> tuple[NumbaKernel, NumbaKernel]:
        """Return the prior ratio's and the rows' functions as Numba dispatchers.

        The rows' function is that of :meth:`residual_ratio_rows` (inputs ``q, q_old, q_ref``
        and the gathered rows) with a Taylor order, else that of :meth:`loglik_ratio_rows`
        (``q, q_old`` and the rows); the prior ratio's inputs are ``q, q_old``.
        """
        functions = self._functions
        rows = functions.ratio if self.proxy_order == 0 else functions.residual[self.proxy_order]
        return functions.prior_ratio.numba_kernel(), rows.numba_kernel()

    def _gradient(self, name: str, function: LazyFunction) -> LazyFunction:
        if not self._functions.rows_depend_on_q:
            raise RuntimeError(
                f"{name}: no row of the likelihood depends on the sampled variables, so there "
                "are no per-row gradients."
            )
        return function

    def _gather(self, idx: Rows) -> list[np.ndarray]:
        arrays = [_data_value(data) for data in self._functions.row_data]
        if isinstance(idx, slice):
            # A range of rows of a C-ordered array is a C-ordered view: no copy.
            return [
                array[idx] if array.flags.c_contiguous else np.take(array, _indices(idx, array), 0)
                for array in arrays
            ]
        # np.take on axis 0 is several times faster than fancy indexing on large arrays.
        return [np.take(array, idx, axis=0) for array in arrays]


def _indices(rows: slice, array: np.ndarray) -> np.ndarray:
    return np.arange(*rows.indices(array.shape[0]))


def row_chunks(n_rows: int, chunk_size: int) -> Iterator[slice]:
    """Consecutive ranges of at most ``chunk_size`` rows covering rows 0 to ``n_rows - 1``."""
    return (slice(begin, min(begin + chunk_size, n_rows)) for begin in range(0, n_rows, chunk_size))


def _data_value(data: Variable) -> np.ndarray:
    if isinstance(data, SharedVariable):
        return data.get_value(borrow=True)
    return cast(TensorConstant, data).data


class DataTracker:
    """The model's data arrays as the oracles last saw them, and the row count N they imply.

    Parameters
    ----------
    row_data : tuple of Variable
        The row-aligned data (constants or shared variables), whose leading length is N.
    data : tuple of SharedVariable
        Every shared data array the oracles read (``pm.Data``), row-aligned or not.
    """

    def __init__(self, row_data: tuple[Variable, ...], data: tuple[SharedVariable, ...]) -> None:
        self.row_data = row_data
        self.data = data
        self.n_rows = self._row_count()
        self._seen = self.fingerprint()

    def refresh(self) -> bool:
        """Re-read the row count if any data array was replaced; whether one was."""
        seen = self.fingerprint()
        if seen == self._seen:
            return False
        self.n_rows = self._row_count()
        self._seen = seen
        return True

    def fingerprint(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Identity and shape of every shared data array (``pm.set_data`` replaces arrays)."""
        values = [data.get_value(borrow=True) for data in self.data]
        return tuple((id(value), np.shape(value)) for value in values)

    def _row_count(self) -> int:
        lengths = {str(data.name): len(_data_value(data)) for data in self.row_data}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"The row-aligned data arrays have different lengths {lengths}: after "
                "pm.set_data, give every array on the row axis (covariates and observed values) "
                "the same new number of rows in one call, e.g. pm.set_data({'X': X_new, "
                "'y': y_new})."
            )
        return next(iter(lengths.values()))


def _shared_data(graphs: Sequence[Variable], exclude: set[Variable]) -> tuple[SharedVariable, ...]:
    """Return the shared tensors (``pm.Data``) that ``graphs`` read, other than ``exclude``."""
    return tuple(
        var
        for var in ancestors(list(graphs))
        if isinstance(var, SharedVariable) and var not in exclude and hasattr(var.type, "ndim")
    )


def discrete_names(vars: Sequence[TensorVariable]) -> list[str]:
    """Return the names of the discrete value variables among ``vars``."""
    return [str(v.name) for v in vars if v.dtype in discrete_types]


def check_continuous(model: Model, vars: Sequence[TensorVariable]) -> None:
    """Refuse discrete value variables: the random-walk proposals are continuous."""
    discrete = discrete_names(vars)
    if discrete:
        raise ValueError(
            f"Discrete variables {discrete} cannot be sampled by a pymc_subsample step. "
            "Pass only continuous variables in `vars` and let pm.sample assign another step "
            "(for example pm.Metropolis or pm.CategoricalGibbsMetropolis) to the discrete ones."
        )


#: Each model's functions, per (variables, row dimension, compile options); dropped with the
#: model. See :func:`build_oracles`.
_FUNCTIONS: weakref.WeakKeyDictionary[Model, dict[tuple[Any, ...], ModelFunctions]] = (
    weakref.WeakKeyDictionary()
)


def build_oracles(
    model: Model,
    vars: Sequence[TensorVariable],
    *,
    initial_point: dict[str, np.ndarray],
    obs_dim: str | None = None,
    compile_kwargs: dict[str, Any] | None = None,
    with_gradients: bool = False,
    proxy_order: int = 0,
    discrete: bool = False,
) -> ModelOracles:
    """Read the model once and return its per-row and prior functions for ``vars``.

    The functions compile at their first call and are shared, within a process, by every call
    with the same model, variables, ``obs_dim`` and ``compile_kwargs`` (a reference search
    and the steps built after it compile each function once). Each call gets its own view of
    the data (:meth:`ModelOracles.refresh_data`).

    Parameters
    ----------
    model : pymc.Model
        The user's model.
    vars : sequence of TensorVariable
        Value variables sampled by the step.
    initial_point : dict
        A point of the model (``model.initial_point()``), used for shapes and the self-check.
    obs_dim : str, optional
        Name of the row dimension; see :func:`pymc_subsample.model.rows.find_row_layout`.
    compile_kwargs : dict, optional
        Passed to PyTensor's compiler, e.g. ``{"mode": "NUMBA"}`` or ``{"mode": "JAX"}``.
    with_gradients : bool, default False
        The caller needs per-row gradients: refuse now if no row depends on ``vars``.
    proxy_order : {0, 1, 2}, default 0
        Order of the Taylor proxies of ``residual_ratio_rows`` (control variates), which
        implies ``with_gradients``.
    discrete : bool, default False
        Accept discrete variables in ``vars`` (a step whose moves keep them on their support:
        the binary Gibbs step, a reversible-jump proposal). ``q`` then holds their values as
        floats, cast back to the variables' dtypes inside the graphs; there are no gradients.

    Returns
    -------
    ModelOracles

    Raises
    ------
    ValueError
        If the per-row values on a few rows differ from the full model's (a reduction over rows
        inside the model), or the initial point has a non-finite log-density, or gradients are
        asked for variables that no row depends on.

    """
    if proxy_order not in (0, 1, 2):
        raise ValueError(f"proxy_order must be 0, 1 or 2, got {proxy_order!r}.")
    if not discrete:
        check_continuous(model, vars)
    elif with_gradients or proxy_order > 0:
        raise ValueError("Discrete variables have no gradients: with_gradients must be False.")
    key = (
        tuple(vars),
        tuple(model.basic_RVs),
        tuple(model.potentials),
        obs_dim,
        repr(sorted((compile_kwargs or {}).items())),
    )
    per_model = _FUNCTIONS.setdefault(model, {})
    functions = per_model.get(key)
    new = functions is None
    if functions is None:
        # No stack trace per node created (as in LazyFunction.compile): 0.05-0.1 s.
        with pytensor.config.change_flags(traceback__limit=0), collection_paused():
            functions = per_model[key] = _model_functions(
                model, vars, initial_point, obs_dim, dict(compile_kwargs or {})
            )
    if (with_gradients or proxy_order > 0) and not functions.rows_depend_on_q:
        names = ", ".join(str(v.name) for v in vars)
        raise ValueError(
            f"No row of the likelihood depends on {names} (only the prior sees them), so there "
            "are no per-row gradients for SGFS, proposal='langevin' or control_variate. Sample "
            "them with pms.AusterityMH or pms.MinibatchBarkerMH, random-walk proposal and no "
            "control variate, in a compound step: pm.sample(step=[..., that_step]). Such a "
            "step reads one batch per draw."
        )
    q0 = _initial_q(initial_point, vars)
    oracles = ModelOracles(
        initial_q=q0,
        _functions=functions,
        proxy_order=proxy_order,
        _data=DataTracker(functions.row_data, functions.data),
    )
    continuous = np.concatenate(
        [
            np.full(int(np.size(initial_point[str(v.name)])), v.dtype not in discrete_types)
            for v in vars
        ]
    )
    _self_check(oracles, functions.full_rows, q0, continuous)
    if new and not discrete:
        warn_if_unidentified(functions.flat, oracles.score_rows, oracles.n_rows, q0)
    return oracles


def _model_functions(
    model: Model,
    vars: Sequence[TensorVariable],
    initial_point: dict[str, np.ndarray],
    obs_dim: str | None,
    kwargs: dict[str, Any],
) -> ModelFunctions:
    """Read the model's graphs and wrap each function of ``q`` to compile at first use."""
    layout = find_row_layout(model, obs_dim)
    check_no_per_row_latents(model, layout.row_rvs, initial_point, layout.n_rows, layout.obs_dim)
    graph = row_loglik_graph(model, layout)
    prior = model.logp(vars=[*model.free_RVs, *model.potentials, *layout.full_rvs])
    # Missing values' density (a free variable's) reads only their rows, not all N.
    prior = gather_missing_rows(model, prior, layout)

    shared = make_shared_replacements(initial_point, vars, model)
    [rows_q, full_q, prior_q], q = join_nonshared_inputs(
        initial_point, [graph.rows_logp, graph.full_logp, prior], vars, shared
    )
    if q.dtype != "float64":
        # Only discrete variables: PyMC joins them into an integer vector; the steps pass q as
        # float64 (PyMC 5's compiled functions refuse it), so cast inside the graph instead.
        q_float = pt.vector("q", dtype="float64")
        [rows_q, full_q, prior_q] = clone_replace(
            [rows_q, full_q, prior_q], replace={q: q_float.astype(q.dtype)}
        )
        q = q_float
    # dims models leave q's length symbolic, and PyTensor 2.x's rewrites of the Hessians stall.
    q_size = sum(int(np.size(initial_point[str(v.name)])) for v in vars)
    [rows_q, full_q, prior_q], q = with_static_length([rows_q, full_q, prior_q], q, q_size)
    q_old = q.type("q_old")
    rows_q_old, prior_q_old = clone_replace([rows_q, prior_q], replace={q: q_old})

    row_inputs = list(graph.row_inputs)
    flat = flat_prior_coordinates(model, vars, initial_point)
    rows_ancestors = set(ancestors([rows_q]))
    depends_on_q = q in rows_ancestors
    if not depends_on_q:
        refuse_flat_priors_outside_the_likelihood(flat)
    others = tuple(
        str(model.values_to_rvs[value].name)
        for value, live in shared.items()
        if live in rows_ancestors and value in model.values_to_rvs
    )
    frozen = tuple(
        (live, pytensor.shared(np.array(live.get_value(), copy=True), name=f"{live.name}_frozen"))
        for live in shared.values()
        if isinstance(live, SharedVariable)
    )
    q_ref = q.type("q_ref")
    rows_ref = cast(TensorVariable, clone_replace(rows_q, replace={q: q_ref, **dict(frozen)}))

    def lazy(build: GraphBuilder) -> LazyFunction:
        return LazyFunction(build, kwargs)

    def fixed(inputs: list[Variable], outputs: Any) -> LazyFunction:
        return lazy(partial(_given, inputs, outputs))

    residual_inputs = (rows_q, rows_q_old, rows_ref, q, q_old, q_ref, [q, q_old], row_inputs)
    space = partial(
        _likelihood_space, rows_q, rows_q_old, prior_q, q, q_old, row_inputs, frozen, kwargs
    )
    return ModelFunctions(
        layout=layout,
        shared=shared,
        rows_depend_on_q=depends_on_q,
        other_variables_in_rows=others,
        prior=fixed([q], prior_q),
        prior_ratio=fixed([q, q_old], prior_q - prior_q_old),
        rows=fixed([q, *row_inputs], rows_q),
        ratio=fixed([q, q_old, *row_inputs], rows_q - rows_q_old),
        # Called once, by the self-check only: PyTensor's Python linker skips the rewrites and
        # the JIT (0.3-0.5 s of set-up) and is fast enough for one vectorised pass.
        full_rows=LazyFunction(partial(_given, [q], full_q), {**kwargs, "mode": "FAST_COMPILE"}),
        score=lazy(partial(_score_graph, rows_q, q, row_inputs)),
        prior_grad=lazy(partial(_prior_gradient_graph, prior_q, q)),
        posterior_gradient=lazy(partial(_posterior_gradient_graph, prior_q, rows_q, q, row_inputs)),
        remainder_gradient=lazy(
            partial(_remainder_gradient_graph, prior_q, rows_q, rows_ref, q, q_ref, row_inputs)
        ),
        residual={
            order: lazy(partial(_residual_graph, *residual_inputs, order)) for order in (1, 2)
        },
        sums=lazy(partial(_sums_graph, rows_ref, q_ref, row_inputs)),
        search={
            hessian: lazy(partial(_search_graph, rows_q, q, row_inputs, hessian))
            for hessian in (False, True)
        },
        prior_hessian=lazy(partial(_prior_hessian_graph, prior_q, q)),
        row_data=graph.row_data,
        data=_shared_data([rows_q, prior_q, *graph.row_data], set(shared.values()) | set(shared)),
        frozen=frozen,
        flat=flat,
        likelihood_space=_OnFirstCall(partial(space, _initial_q(initial_point, vars))),
    )


def _given(inputs: list[Variable], outputs: Any) -> tuple[list[Variable], Any]:
    return inputs, outputs


def _score_graph(
    rows_q: TensorVariable, q: TensorVariable, row_inputs: list[TensorVariable]
) -> tuple[list[Variable], Any]:
    scores, batched_inputs = per_row_gradient(rows_q, q, row_inputs)
    return [q, *batched_inputs], scores


def _residual_graph(
    rows_q: TensorVariable,
    rows_q_old: Variable,
    rows_ref: TensorVariable,
    point: TensorVariable,
    point_old: TensorVariable,
    ref: TensorVariable,
    inputs: list[TensorVariable],
    row_inputs: list[TensorVariable],
    order: int,
) -> tuple[list[Variable], Any]:
    """Residuals ``l_i(q) - l_i(q_old)`` minus the Taylor proxies' difference at ``ref``.

    ``point`` and ``point_old`` are ``q`` and ``q_old`` in the proxies' space (themselves, or
    the likelihood's parameters ``phi(q)``, ``phi(q_old)``), ``rows_ref`` the rows' graph of
    ``ref`` in that space. The proxies read the other model variables at their frozen values
    (the ``_frozen`` shared copies), so that the sums of :func:`_sums_graph` are those of the
    proxies subtracted here.
    """
    step = point - point_old
    centre = point + point_old - 2 * ref if order == 2 else None
    proxies = per_row_proxy_terms(rows_ref, ref, step, centre)
    return [*inputs, ref, *row_inputs], rows_q - rows_q_old - proxies


def _sums_graph(
    rows_ref: TensorVariable, q_ref: TensorVariable, row_inputs: list[TensorVariable]
) -> tuple[list[Variable], Any]:
    gradient_sum, hessian_sum = summed_gradient_and_hessian(rows_ref, q_ref)
    return [q_ref, *row_inputs], [gradient_sum, hessian_sum]


def _search_graph(
    rows_q: TensorVariable, q: TensorVariable, row_inputs: list[TensorVariable], hessian: bool
) -> tuple[list[Variable], Any]:
    """Build the rows' summed log-likelihood, gradient, scores' outer products and Hessian.

    Inputs are the rows batched as for :func:`_score_graph` (``(n, 1, ...)``); the per-row
    scores stay inside the function.
    """
    scores, batched_inputs = per_row_gradient(rows_q, q, row_inputs)
    unbatched: dict[Variable, Variable] = {
        row: batch[:, 0] for row, batch in zip(row_inputs, batched_inputs, strict=True)
    }
    rows = cast(TensorVariable, clone_replace(rows_q, replace=unbatched))
    outputs = [rows.sum(), scores.sum(0), scores.T @ scores]
    if hessian:
        outputs.append(summed_gradient_and_hessian(rows, q)[1])
    return [q, *batched_inputs], outputs


def _posterior_gradient_graph(
    prior_q: TensorVariable,
    rows_q: TensorVariable,
    q: TensorVariable,
    row_inputs: list[TensorVariable],
) -> tuple[list[Variable], Any]:
    # One backward pass through the rows' sum: no (n, d) matrix of per-row scores.
    factor = pt.dscalar("likelihood_factor")
    gradient = pytensor.grad(prior_q + factor * rows_q.sum(), q, disconnected_inputs="ignore")
    return [q, factor, *row_inputs], gradient


def _remainder_gradient_graph(
    prior_q: TensorVariable,
    rows_q: TensorVariable,
    rows_ref: TensorVariable,
    q: TensorVariable,
    q_ref: TensorVariable,
    row_inputs: list[TensorVariable],
    point: TensorVariable | None = None,
) -> tuple[list[Variable], Any]:
    # Rows' summed remainders s_i(q) - s_i(q_ref) - H_i(q_ref) (q - q_ref): the summed Hessian
    # times the direction is the gradient of the summed score's projection on it (a
    # Hessian-vector product, no d x d matrix per row), the direction held constant. With
    # ``point = phi(q)`` the expansion is in the likelihood's parameters, and its gradient
    # (score_ref + H (phi(q) - q_ref)) is taken back to q by J_phi(q)^T.
    [_, factor, *_], gradient = _posterior_gradient_graph(prior_q, rows_q, q, row_inputs)
    score_ref = cast(
        TensorVariable, pytensor.grad(rows_ref.sum(), q_ref, disconnected_inputs="ignore")
    )
    direction = disconnected_grad((q if point is None else point) - q_ref)
    hessian_direction = cast(
        TensorVariable,
        pytensor.grad((score_ref * direction).sum(), q_ref, disconnected_inputs="ignore"),
    )
    expansion = score_ref + hessian_direction
    if point is not None:
        held = disconnected_grad(expansion)
        expansion = cast(
            TensorVariable,
            pytensor.grad((point * held).sum(), q, disconnected_inputs="ignore"),
        )
    return [q, q_ref, factor, *row_inputs], gradient - factor * expansion


def _likelihood_space(
    rows_q: TensorVariable,
    rows_q_old: Variable,
    prior_q: TensorVariable,
    q: TensorVariable,
    q_old: TensorVariable,
    row_inputs: list[TensorVariable],
    frozen: tuple[tuple[SharedVariable, SharedVariable], ...],
    kwargs: dict[str, Any],
    q0: np.ndarray,
) -> LikelihoodSpace | None:
    """Build the control variates' functions in the likelihood's parameters (or None)."""
    found = likelihood_parameters(rows_q, q, row_inputs, q0)
    if found is None:
        return None
    theta_ref = found.theta.type("theta_ref")
    to_reference: dict[Variable, Variable] = {found.theta: theta_ref, **dict(frozen)}
    rows_ref = cast(TensorVariable, clone_replace(found.rows_logp, replace=to_reference))
    phi = found.phi
    to_old: dict[Variable, Variable] = {q: q_old}
    phi_old = cast(TensorVariable, clone_replace(phi, replace=to_old))

    def lazy(build: GraphBuilder) -> LazyFunction:
        return LazyFunction(build, kwargs)

    points = (phi, phi_old, theta_ref, [q, q_old])
    residual_inputs = (rows_q, rows_q_old, rows_ref, *points, row_inputs)
    vector = phi.type("vector")
    pullback = pytensor.grad((phi * vector).sum(), q, disconnected_inputs="ignore")
    return LikelihoodSpace(
        size=int(found.theta.type.shape[0] or 0),
        phi=lazy(partial(_given, [q], phi)),
        pullback=lazy(partial(_given, [q, vector], pullback)),
        residual={
            order: lazy(partial(_residual_graph, *residual_inputs, order)) for order in (1, 2)
        },
        sums=lazy(partial(_sums_graph, rows_ref, theta_ref, row_inputs)),
        remainder_gradient=lazy(
            partial(
                _remainder_gradient_graph, prior_q, rows_q, rows_ref, q, theta_ref, row_inputs, phi
            )
        ),
    )


class _OnFirstCall:
    """A value built at the first call and kept (and pickled with what was built)."""

    __slots__ = ("_build", "_built", "_value")

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._built = False
        self._value: Any = None

    def __call__(self) -> Any:
        if not self._built:
            with pytensor.config.change_flags(traceback__limit=0), collection_paused():
                self._value = self._build()
            self._built = True
        return self._value

    def __getstate__(self) -> tuple[Any, ...]:
        return (self._build, self._built, self._value)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._build, self._built, self._value = state


def _initial_q(initial_point: dict[str, np.ndarray], vars: Sequence[TensorVariable]) -> np.ndarray:
    return np.concatenate([np.ravel(initial_point[str(v.name)]) for v in vars]).astype("float64")


def _prior_gradient_graph(prior_q: TensorVariable, q: TensorVariable) -> tuple[list[Variable], Any]:
    return [q], _prior_gradient(prior_q, q)


def _prior_hessian_graph(prior_q: TensorVariable, q: TensorVariable) -> tuple[list[Variable], Any]:
    gradient = _prior_gradient(prior_q, q)
    hessian = jacobian(gradient, q, vectorize=True, disconnected_inputs="ignore")
    return [q], [gradient, hessian]


def _prior_gradient(prior_q: TensorVariable, q: TensorVariable) -> TensorVariable:
    # Flat priors (pm.Flat, and pm.HalfFlat's constant log-Jacobian gradient) leave the prior's
    # gradient or Hessian disconnected from q: those are zero, not an error.
    return cast(TensorVariable, pytensor.grad(prior_q, q, disconnected_inputs="ignore"))


def _self_check(
    oracles: ModelOracles, full_fn: LazyFunction, q0: np.ndarray, continuous: np.ndarray
) -> None:
    """Check the per-row function against the full model on a few rows, at a jittered point.

    The rows' function is the model's likelihood rebuilt on row subsets of the data
    (``rows.py``); the full model's own per-row log-likelihood (``full_fn``, one vectorised
    pass in PyTensor's Python linker, no compilation) must agree with it on the checked rows.
    One point suffices, jittered away from ``q0``, where a value such as 0 could hide a
    reduction over rows (``X - X.mean(0)`` times a zero coefficient). At ``q0`` itself every
    row must have a finite log-likelihood: checked range by range with the compiled per-row
    function (no copy of the data). Only the ``continuous`` entries of ``q0`` are jittered: a
    discrete value moved off its support is cast at different places by the two functions.
    """
    n_rows = oracles.n_rows
    check_rng = np.random.default_rng(_SELF_CHECK_SEED)
    sample = check_rng.choice(n_rows, size=min(n_rows, 6), replace=False)
    rows = np.unique(np.concatenate([[0, n_rows - 1], sample])).astype("int64")
    names = [str(rv.name) for rv in oracles.layout.row_rvs]
    jittered = q0 + continuous * check_rng.normal(scale=0.3, size=q0.size)
    try:
        subset, full = oracles.loglik_rows(jittered, rows), full_fn(jittered)[rows]
        bad = _nonfinite_rows(oracles, q0)
    except Exception as error:
        raise ValueError(
            f"The likelihood of {names} could not be evaluated on a subset of rows "
            f"({type(error).__name__}: {error}). Per-row latent variables (a free variable "
            "with one entry per row) cannot be subsampled; if some array of length "
            f"N={n_rows} is not row-aligned, give the rows a named dim and pass obs_dim."
        ) from error
    if not np.allclose(subset, full, rtol=1e-6, atol=1e-8, equal_nan=True):
        raise ValueError(
            f"Self-check failed: the log-likelihood of {names} evaluated on a subset of rows "
            "differs from the full model's value for the same rows. The model probably "
            "transforms data with a reduction over rows (for example standardising with "
            "X.mean(0) inside the model): do that in numpy before building the model. If an "
            f"array of length N={n_rows} is not row-aligned, name the row dim via obs_dim."
        )
    _check_initial_finite(bad, oracles.log_prior(q0), names)


def _nonfinite_rows(oracles: ModelOracles, q: np.ndarray) -> np.ndarray:
    """Rows whose log-likelihood at ``q`` is not finite, read range by range in place."""
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

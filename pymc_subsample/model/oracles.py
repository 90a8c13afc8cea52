"""Compile the functions ("oracles") that the kernels call, over the raveled vector ``q``.

``q`` is the concatenation of the step's value variables in the unconstrained space, in the
order of ``vars``, as :class:`pymc.blocking.DictToArrayBijection` ravels them. Variables of the
model that the step does not sample are read from shared variables that PyMC updates before
each step (``make_shared_replacements``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pytensor.graph.basic import Variable

from pymc_subsample.model.compiled import LazyFunction, NumbaKernel
from pymc_subsample.model.functions import ModelFunctions
from pymc_subsample.model.group_effects import GroupEffectFunctions
from pymc_subsample.model.likelihood_space import LikelihoodSpace
from pymc_subsample.model.mapped_pages import MappedRows, gather_from_maps
from pymc_subsample.model.oracle_sums import RowSums
from pymc_subsample.model.parallel_pass import PARALLEL_ROWS, PASS_CHUNK, summed_over_ranges
from pymc_subsample.model.row_data import DataTracker, Rows, data_value, row_chunks, row_count
from pymc_subsample.model.rows import RowLayout
from pymc_subsample.model.self_check import check_rows_finite

__all__ = ["ModelOracles"]


@dataclass(frozen=True)
class ModelOracles(RowSums):
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

    @property
    def pages(self) -> MappedRows:
        """The memory maps under the row data, released as rows are read (``mapped_pages.py``)."""
        return self._tracker.pages

    @property
    def rows_on_dask(self) -> bool:
        """Whether the rows are read from Dask arrays (``pms.dask_data``, ``dask_rows.py``)."""
        return self._tracker.dask is not None

    @property
    def rows_far(self) -> bool:
        """Whether a scattered row costs far more than a row of a pass (a map, or Dask)."""
        return bool(self.pages) or self.rows_on_dask

    @property
    def passes_shared(self) -> bool:
        """Whether a pass over every row is shared: among the cores, or on the Dask cluster.

        From ``PARALLEL_ROWS`` rows (``parallel_pass.py``), or whatever N with the rows on
        Dask (``dask_pass.py``): such a pass reads the rows in place, so every row costs less
        than the rest of them listed, or a large minibatch drawn and gathered.
        """
        return self.n_rows >= PARALLEL_ROWS or self.rows_on_dask

    def row_proposals(self) -> Callable[[np.random.Generator, int], np.ndarray] | None:
        """Return the row samplers' proposals where drawn ahead (data on Dask), else None."""
        rows = self._tracker.dask
        return None if rows is None else rows.proposals

    def data_shapes(self) -> str:
        """Describe the data arrays the rows' functions read and their shapes, for a message."""
        return self._tracker.shapes()

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

    @property
    def reads_groups(self) -> bool:
        """Whether the rows read a table of parameters by a group index (``grouped_rows.py``)."""
        return self._functions.grouped_search() is not None

    def row_groups(self, chunk_size: int = 65_536) -> np.ndarray | None:
        """Each row's group (``GroupedSums.row_groups``), or None where the rows read no table.

        One pass over the rows' index data, range by range: an int64 array of N entries.
        """
        grouped = self._functions.grouped_search()
        if grouped is None:
            return None
        chunks = (self._gather(rows) for rows in row_chunks(self.n_rows, chunk_size))
        return grouped.row_groups(chunks)

    def rows_at(self, idx: Rows) -> list[np.ndarray]:
        """Return the arrays of the rows ``idx`` (int64 indices or a slice) the functions read."""
        return self._gather(idx)

    def group_effects(self) -> GroupEffectFunctions | str:
        """Return what a per-group update of the step's variables reads, or why there is none.

        Built at the first call (``model/group_effects.py``).
        """
        return self._functions.group_effects()

    def log_prior(self, q: np.ndarray) -> float:
        """Free-variable log-densities with Jacobians, Potentials, and off-row observed terms."""
        return float(self._functions.prior(q))

    def log_prior_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> float:
        """``log_prior(q_new) - log_prior(q_old)`` in one call."""
        return float(self._functions.prior_ratio(q_new, q_old))

    def setup_log_prior(self, q: np.ndarray) -> float:
        """:meth:`log_prior` for the set-up's few calls: interpreted until its budget is spent.

        The self-check and the reference search call the prior a few dozen times; compiling
        it for them (cold: seconds, for a function a fused draw never calls) would cost more
        than running it on PyTensor's Python linker (``LazyFunction``, ``interpreted_first``).
        The draws' callers use :meth:`log_prior`, compiled at its first call.
        """
        return float(self._functions.setup_prior(q))

    def setup_log_prior_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> float:
        """:meth:`log_prior_ratio` for the set-up's few calls (:meth:`setup_log_prior`)."""
        return float(self._functions.setup_prior_ratio(q_new, q_old))

    def loglik_rows(self, q: np.ndarray, idx: Rows) -> np.ndarray:
        """Per-row log-likelihood of the rows ``idx`` (int64 indices or a slice); O(len(idx))."""
        return self._functions.rows(q, *self._gather(idx))

    def loglik_total(self, q: np.ndarray, chunk_size: int = PASS_CHUNK) -> float | None:
        """Sum every row's log-likelihood at ``q`` on every core, or None below the threshold.

        Only where the pass is shared among threads (``model/parallel_pass.py``: from
        ``PARALLEL_ROWS`` rows, data in C order); None otherwise, and the caller reads the
        rows range by range with :meth:`loglik_rows`.
        """
        total = self._summed_pass(self._functions.loglik_sum, q, chunk_size)
        if total is None:
            return None
        self._after_full_pass(float(total[0]))
        return float(total[0])

    def ensure_rows_finite(self) -> None:
        """Check, if not done yet, that every row's log-likelihood is finite at the start.

        On data from ``PARALLEL_ROWS`` rows, ``oracle_builder.build_oracles`` leaves this
        check to the first pass over every row (a finite sum says every row is finite), which the
        reference search makes anyway; steps call this once built, so that a step that made
        no such pass still checks before sampling. Raises the self-check's ``ValueError``
        naming the rows.
        """
        tracker = self._data
        if tracker is None or tracker.finite_pending is None:
            return
        q0, tracker.finite_pending = tracker.finite_pending, None
        check_rows_finite(self, q0)

    def _after_full_pass(self, total: float) -> None:
        """Clear the pending check after a pass over every row gave a finite ``total``, else run it.

        Every row's value at some point is finite when their sum is, which is what the check
        at the start is for (NaN or impossible data; ``self_check.py``); a non-finite sum
        lists the rows at the start point now, before a search reports a failed pass.
        """
        tracker = self._data
        if tracker is None or tracker.finite_pending is None:
            return
        if np.isfinite(total):
            tracker.finite_pending = None
        else:
            self.ensure_rows_finite()

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
        sum (no per-row matrix). ``rows=None`` is every row: the exact gradient of the tempered
        log posterior, read in place range by range (:data:`_EXACT_GRADIENT_CHUNK` rows per
        call; one call on all N rows held its arrays at N rows, a float32 ``X`` upcast whole).
        """
        function = self._gradient("gradient_on_rows", self._functions.posterior_gradient)
        n_used = self.n_rows if rows is None else rows.size
        factor = np.asarray(self.n_rows / (n_used * temperature), dtype="float64")
        on_dask = self._tracker.dask
        if rows is None and on_dask is not None:
            prior_gradient = self.log_prior_grad

            def exact_on_dask(q: np.ndarray) -> np.ndarray:
                # Each call adds the prior's gradient to its rows': keep it once.
                (total,), calls = on_dask.summed(function, [q, factor])
                return total - (calls - 1) * prior_gradient(q)

            return exact_on_dask
        if rows is None and self.n_rows > _EXACT_GRADIENT_CHUNK:
            pieces = list(row_chunks(self.n_rows, _EXACT_GRADIENT_CHUNK))
            prior_gradient = self.log_prior_grad

            def exact(q: np.ndarray) -> np.ndarray:
                # Each call adds the prior's gradient to its rows': keep it once.
                total = sum(np.asarray(function(q, factor, *self._gather(p))) for p in pieces)
                return total - (len(pieces) - 1) * prior_gradient(q)

            return exact
        data = self._gather(slice(0, self.n_rows) if rows is None else rows)

        def gradient(q: np.ndarray) -> np.ndarray:
            return np.asarray(function(q, factor, *data))

        return gradient

    def remainder_gradient_on_rows(
        self,
        rows: np.ndarray,
        q_ref: np.ndarray,
        temperature: float = 1.0,
        population: int | None = None,
    ) -> Callable[[np.ndarray], np.ndarray]:
        """``q -> log_prior_grad(q) + N / (n T) * sum of the rows' second-order remainders``.

        ``population`` replaces N where ``rows`` are drawn from a part of the rows only (a
        stratum of ``population`` rows, or all the rows of one, with ``population = n``).

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
        size = self.n_rows if population is None else population
        factor = np.asarray(size / (rows.size * temperature), dtype="float64")
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
        return [data_value(array) for array in self._functions.row_data]

    def numba_kernels(self) -> tuple[NumbaKernel, NumbaKernel]:
        """Return the prior ratio's and the rows' functions as Numba dispatchers.

        The rows' function is that of :meth:`residual_ratio_rows` (inputs ``q, q_old, q_ref``
        and the gathered rows) with a Taylor order, else that of :meth:`loglik_ratio_rows`
        (``q, q_old`` and the rows); the prior ratio's inputs are ``q, q_old``.
        """
        prior, rows = self._draw_functions()
        return prior.numba_kernel(), rows.numba_kernel()

    def prefetch_numba_kernels(self) -> None:
        """Have the compile helper compile :meth:`numba_kernels`' functions meanwhile.

        Called before the reference search of a step whose draws may be fused, with the
        proxy order it asks for (``LazyFunction.prefetch``).
        """
        prior, rows = self._draw_functions()
        rows.prefetch()  # the larger graph first: the search's Laplace check calls it
        prior.prefetch()

    def _draw_functions(self) -> tuple[LazyFunction, LazyFunction]:
        """Return the prior ratio's and the rows' functions of :meth:`numba_kernels`."""
        functions = self._functions
        rows = functions.ratio if self.proxy_order == 0 else functions.residual[self.proxy_order]
        return functions.prior_ratio, rows

    def numba_prior(self) -> NumbaKernel:
        """Return :meth:`log_prior`'s function as a Numba dispatcher (input ``q``)."""
        return self._functions.prior.numba_kernel()

    def _gradient(self, name: str, function: LazyFunction) -> LazyFunction:
        if not self._functions.rows_depend_on_q:
            raise RuntimeError(
                f"{name}: no row of the likelihood depends on the sampled variables, so there "
                "are no per-row gradients."
            )
        return function

    def _summed_pass(
        self, function: LazyFunction, q: np.ndarray, chunk_size: int = PASS_CHUNK
    ) -> list[np.ndarray] | None:
        """Sum ``function(q, rows)`` over every row: on Dask, on the cores, or None (serial)."""
        on_dask = self._tracker.dask
        if on_dask is not None:
            return on_dask.summed(function, [np.asarray(q, dtype="float64")])[0]
        return summed_over_ranges(
            function, [q], self.row_arrays(), self.n_rows, chunk_size, self.pages
        )

    def _gather(self, idx: Rows) -> list[np.ndarray]:
        on_dask = self._data.dask if self._data is not None else None
        if on_dask is not None:
            if isinstance(idx, slice):
                return on_dask.gather_range(idx)
            return on_dask.gather(idx)
        arrays = [data_value(data) for data in self._functions.row_data]
        pages = self._data.pages if self._data is not None else None
        if pages and not isinstance(idx, slice):
            return gather_from_maps(arrays, idx, pages)
        if pages:
            pages.rows_read(row_count(idx, self.n_rows), contiguous=True)
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


#: Rows per call of the exact gradient (``gradient_on_rows(None)``), each range read in place.
_EXACT_GRADIENT_CHUNK = 65_536

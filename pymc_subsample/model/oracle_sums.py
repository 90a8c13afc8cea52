"""Sums over the rows that the reference search and the control variates read.

:class:`RowSums` is a mixin of :class:`~pymc_subsample.model.oracles.ModelOracles`: each
method reads a set of rows once, in chunks (one compiled call per chunk, or a pass shared
among the cores, ``model/parallel_pass.py``), and returns sums of the rows' derivatives:

- :meth:`RowSums.gradient_hessian_sums`: the Taylor proxies' exact sums (control variates,
  ``docs/architecture.md``, "Control variates");
- :meth:`RowSums.search_sums`: one iteration of the reference search (``reference_search.py``):
  log-likelihood, gradient, the scores' outer products and the Hessian.

What the methods read of the oracles is :class:`OracleView`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast

import numpy as np

from pymc_subsample.model.parallel_pass import PASS_CHUNK
from pymc_subsample.model.row_data import Rows, row_chunks, row_count

if TYPE_CHECKING:
    from pymc_subsample.model.compiled import LazyFunction
    from pymc_subsample.model.functions import ModelFunctions
    from pymc_subsample.model.likelihood_space import LikelihoodSpace

__all__ = ["OracleView", "RowSums", "SearchSums"]


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


class OracleView(Protocol):
    """The members of :class:`~pymc_subsample.model.oracles.ModelOracles` the sums read."""

    @property
    def _functions(self) -> ModelFunctions: ...

    @property
    def _space(self) -> LikelihoodSpace: ...

    @property
    def expansion(self) -> str:
        """The space of the Taylor proxies: ``"unconstrained"`` or ``"likelihood"``."""

    @property
    def expansion_size(self) -> int:
        """Length of an expansion point."""

    @property
    def n_rows(self) -> int:
        """Number of rows N."""

    @property
    def n_params(self) -> int:
        """Length of ``q``."""

    @property
    def passes_shared(self) -> bool:
        """Whether a pass over every row is shared among the cores."""

    def _gradient(self, name: str, function: LazyFunction) -> LazyFunction: ...

    def _gather(self, idx: Rows) -> list[np.ndarray]: ...

    def _after_full_pass(self, total: float) -> None: ...

    def _full_search_sums(self, q: np.ndarray, chunk_size: int) -> SearchSums: ...

    def _summed_pass(
        self, function: LazyFunction, q: np.ndarray, chunk_size: int = PASS_CHUNK
    ) -> list[np.ndarray] | None: ...


class RowSums:
    """Sums over sets of rows (module doc); mixed into ``ModelOracles``."""

    def gradient_hessian_sums(
        self: OracleView, q: np.ndarray, idx: np.ndarray | None = None, chunk_size: int = 8192
    ) -> tuple[np.ndarray, np.ndarray]:
        """``sum_i grad loglik_i(q)`` and ``sum_i hess loglik_i(q)`` over rows ``idx`` (all rows).

        Rows are summed in chunks of ``chunk_size`` rows: O(N) time, O(chunk_size * d)
        memory. Other model variables are read at their frozen values (:meth:`freeze_shared`).
        """
        unconstrained = self.expansion == "unconstrained"
        sums = self._functions.sums if unconstrained else self._space.sums
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
        grouped = self._functions.grouped_sums() if unconstrained else self._space.grouped
        if grouped is not None:
            # Rows that read their groups' parameters: summed by the chain rule through the
            # groups' tables (grouped_sums.py), O(N) whatever the number of groups.
            totals = grouped.totals(
                q, (self._gather(rows) for rows in chunks), outer=False, hessian=True
            )
            return totals.gradient, cast(np.ndarray, totals.hessian)
        if idx is None:
            shared = self._summed_pass(sums_fn, q)
            if shared is not None:
                self._after_full_pass(float(np.sum(shared[0])))
                return shared[0], shared[1]
        for rows in chunks:
            chunk_gradient, chunk_hessian = sums_fn(q, *self._gather(rows))
            gradient += chunk_gradient
            hessian += chunk_hessian
        return gradient, hessian

    def search_sums(
        self: OracleView, q: np.ndarray, idx: Rows, *, with_hessian: bool, chunk_size: int = 8192
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
        grouped = self._functions.grouped_search()
        if grouped is not None:
            # Rows that read their groups' parameters (grouped_sums.py): no d x d work per row.
            totals = grouped.totals(
                q, (self._gather(rows) for rows in pieces), outer=True, hessian=with_hessian
            )
            return SearchSums(
                totals.loglik, totals.gradient, cast(np.ndarray, totals.outer), totals.hessian
            )
        if (
            with_hessian
            and self.passes_shared
            and isinstance(idx, slice)
            and row_count(idx, self.n_rows) == self.n_rows
        ):
            return self._full_search_sums(q, chunk_size)
        for rows in pieces:
            sums = function(q, *[array[:, None] for array in self._gather(rows)])
            loglik += float(sums[0])
            gradient += sums[1]
            outer += sums[2]
            if hessian is not None:
                hessian += sums[3]
        return SearchSums(loglik, gradient, outer, hessian)

    def _full_search_sums(self: OracleView, q: np.ndarray, chunk_size: int) -> SearchSums:
        """:meth:`search_sums` with the Hessian on every row: no scores, threaded.

        The scores' outer products are returned as zeros: on every row the direction test's
        variance has the finite-population factor 0 (``kernels/optimizer.py``), and without
        per-row scores the pass does about half the work (74 against 154 ns per row on a
        logistic regression with d = 10, one core). Used from ``PARALLEL_ROWS`` rows, where
        that saves more than compiling one more function costs, and shared among the cores
        there (``model/parallel_pass.py``).
        """
        function = self._functions.full_sums
        d = self.n_params
        totals = self._summed_pass(function, q)
        if totals is None:
            totals = [np.zeros(()), np.zeros(d), np.zeros((d, d))]
            for rows in row_chunks(self.n_rows, chunk_size):
                for total, output in zip(totals, function(q, *self._gather(rows)), strict=True):
                    total += output
        loglik, gradient, hessian = totals
        self._after_full_pass(float(loglik))
        return SearchSums(float(loglik), gradient, np.zeros((d, d)), hessian)

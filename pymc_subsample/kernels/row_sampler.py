"""Draw rows without replacement within one test, at a cost proportional to the rows drawn.

A test draws batches of rows until it can decide; rows must not repeat inside a test, and no
step may cost O(N) (so no ``rng.permutation(N)`` per step). The sampler keeps one int64 stamp
per row, allocated once (zeroed lazily by the operating system, so that only the pages of
rows ever stamped take memory): a row is taken in the current test when its stamp is at
least the test's starting stamp, so starting a test costs O(1) and nothing is ever cleared.

While fewer than half the rows are taken, a batch is drawn by uniform proposals with rejection
of taken rows and of repeats (each accepted row is uniform over the rows not yet taken, so the
batch is a uniform sample without replacement). A test's first batch, which is all that most
control-variate draws read, is stamped only if the test asks for more rows: when its proposals
hold no repeat (checked on a sorted copy) it is returned as drawn. Once a test needs more than
half the rows its cost is already O(N), and the remaining rows are listed and shuffled once
(O(N), amortised by the O(N) rows the test evaluates anyway).

:class:`SparseRowSampler` draws the same rows from the same generator while remembering only
the rows taken in the current test (sorted), not a stamp per row: for the set-up's one-off
draws (the reference search, the Laplace check, SGFS's start), which would otherwise each hold
8 bytes per row beside the step's own sampler.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

__all__ = ["Proposals", "RowSampler", "SparseRowSampler"]

#: ``(rng, size) -> size`` independent uniform row proposals (int64).
Proposals = Callable[[np.random.Generator, int], np.ndarray]


class RowSampler:
    """Sampler of row indices without replacement inside a test.

    Parameters
    ----------
    n_rows : int
        Number of rows N.
    proposals : callable, optional
        ``proposals(rng, size)`` returns ``size`` independent uniform row proposals (int64);
        by default ``rng.integers(0, n_rows, size)``. Data on Dask give a stream drawn ahead,
        whose rows are fetched before the draws ask for them (``model/dask_rows.py``).

    Examples
    --------
    >>> sampler = RowSampler(10)
    >>> rng = np.random.default_rng(0)
    >>> sampler.start_test()
    >>> rows = np.concatenate([sampler.draw(rng, 4), sampler.draw(rng, 4), sampler.draw(rng, 4)])
    >>> sorted(rows.tolist()) == list(range(10))
    True

    """

    def __init__(self, n_rows: int, proposals: Proposals | None = None) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be at least 1, got {n_rows}.")
        self.n_rows = int(n_rows)
        self._propose: Proposals = proposals or _UniformProposals(self.n_rows)
        self._stamps = _lazy_zeros(self.n_rows)
        #: The next stamp, then scratch space of the fused draw (``kernels/fused.py``), which
        #: draws rows the same way on the same stamps: one int64 array, so that stamps and
        #: counter stay together (a copy in a worker process included).
        self.counters = np.zeros(4, dtype=np.int64)
        self.counters[0] = 1
        self._test_start = 1
        self._n_taken = 0
        self._remaining: np.ndarray | None = None
        #: The test's first batch, returned before its rows were stamped (see start_test).
        self._unstamped: np.ndarray | None = None

    def __getstate__(self) -> dict[str, object]:
        # A copy (a worker process's) starts with fresh stamps: a test never spans a copy.
        return {**self.__dict__, "_stamps": None, "_remaining": None, "_unstamped": None}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._stamps = _lazy_zeros(self.n_rows)
        self._test_start = int(self.counters[0])
        self._n_taken = 0

    @property
    def stamps(self) -> np.ndarray:
        """The per-row stamps (shared with the fused draw, which samples rows the same way)."""
        return self._stamps

    @property
    def n_taken(self) -> int:
        """Rows drawn in the current test."""
        return self._n_taken

    def start_test(self) -> None:
        """Begin a new test: every row becomes available again (O(1))."""
        self._test_start = int(self.counters[0])
        self._n_taken = 0
        self._remaining = None
        self._unstamped = None

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw up to ``size`` rows not yet drawn in this test (fewer once rows run out).

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of randomness.
        size : int
            Number of rows wanted.

        Returns
        -------
        ndarray of int64
            Distinct row indices, none drawn before in this test.

        """
        size = min(int(size), self.n_rows - self._n_taken)
        if self._n_taken == 0 and 2 * size <= self.n_rows:
            candidates = self._propose(rng, size)
            if _distinct(candidates):
                self._unstamped = candidates
                self._n_taken = size
                return candidates
            rows = self._draw_sparse(rng, size, candidates)
            self._n_taken += rows.size
            return rows
        if self._unstamped is not None:
            self._stamp(self._unstamped)
            self._unstamped = None
        if self._remaining is None and 2 * (self._n_taken + size) > self.n_rows:
            self._remaining = self._shuffled_untaken(rng)
        if self._remaining is not None:
            start = self._n_taken - (self.n_rows - self._remaining.size)
            rows = self._remaining[start : start + size]
        else:
            rows = self._draw_sparse(rng, size)
        self._n_taken += rows.size
        return rows

    def _draw_sparse(
        self, rng: np.random.Generator, size: int, first: np.ndarray | None = None
    ) -> np.ndarray:
        # ``first``: the test's first proposals, already drawn (they hold a repeat).
        def untaken(candidates: np.ndarray) -> np.ndarray:
            return candidates[self._stamps[candidates] < self._test_start]

        return _rejection_draw(
            rng, self._propose, size, first, untaken, self._stamp, self._n_taken > 0
        )

    def _stamp(self, candidates: np.ndarray) -> np.ndarray:
        """Mark rows taken in this test; return them without repeats (the last copy of each)."""
        stamps = self.counters[0] + np.arange(candidates.size)
        self._stamps[candidates] = stamps
        self.counters[0] += stamps.size
        # Where a row was proposed twice, only its last stamp survives: keep that copy.
        return candidates[self._stamps[candidates] == stamps]

    def _shuffled_untaken(self, rng: np.random.Generator) -> np.ndarray:
        if self._unstamped is not None:
            self._stamp(self._unstamped)
            self._unstamped = None
        untaken = np.flatnonzero(self._stamps < self._test_start)
        rng.shuffle(untaken)
        return untaken


class SparseRowSampler:
    """The rows :class:`RowSampler` draws, from a memory of the test's rows, not of all N.

    Given the same generator, draws the same rows in the same order as a fresh
    :class:`RowSampler` (the same proposals, rejections and repeats dropped), so set-up results
    do not depend on which of the two drew them. Its memory is the rows taken in the current
    test, sorted, where :class:`RowSampler` holds an int64 stamp per row for its whole life:
    cheaper for the set-up's draws, which take a share of N once, and dearer per draw (a merge
    of the taken rows), which a sampler drawing every step would feel. Once a test needs more
    than half the rows, the remaining rows are listed (O(N)), as :class:`RowSampler` lists them.

    Parameters
    ----------
    n_rows : int
        Number of rows N.
    proposals : callable, optional
        As for :class:`RowSampler`.

    Examples
    --------
    >>> rng, again = np.random.default_rng(1), np.random.default_rng(1)
    >>> sparse, dense = SparseRowSampler(50), RowSampler(50)
    >>> sparse.start_test(), dense.start_test()
    (None, None)
    >>> all(
    ...     np.array_equal(sparse.draw(rng, size), dense.draw(again, size)) for size in (8, 16, 26)
    ... )
    True
    """

    def __init__(self, n_rows: int, proposals: Proposals | None = None) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be at least 1, got {n_rows}.")
        self.n_rows = int(n_rows)
        self._propose: Proposals = proposals or _UniformProposals(self.n_rows)
        self._taken = np.empty(0, dtype=np.int64)  # this test's rows, sorted
        self._n_taken = 0
        self._remaining: np.ndarray | None = None

    @property
    def n_taken(self) -> int:
        """Rows drawn in the current test."""
        return self._n_taken

    @property
    def taken(self) -> np.ndarray:
        """The rows drawn in the current test, sorted."""
        if self._remaining is None:
            return self._taken
        listed = self._n_taken - (self.n_rows - self._remaining.size)
        return np.sort(np.concatenate([self._taken, self._remaining[:listed]]))

    def start_test(self) -> None:
        """Begin a new test: every row becomes available again."""
        self._taken = np.empty(0, dtype=np.int64)
        self._n_taken = 0
        self._remaining = None

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw up to ``size`` rows not yet drawn in this test (:meth:`RowSampler.draw`)."""
        size = min(int(size), self.n_rows - self._n_taken)
        if self._n_taken == 0 and 2 * size <= self.n_rows:
            candidates = self._propose(rng, size)
            if _distinct(candidates):
                self._taken = np.sort(candidates)
                self._n_taken = size
                return candidates
            rows = self._draw_sparse(rng, size, candidates)
            self._n_taken += rows.size
            return rows
        if self._remaining is None and 2 * (self._n_taken + size) > self.n_rows:
            untaken = np.ones(self.n_rows, dtype=bool)
            untaken[self._taken] = False
            self._remaining = np.flatnonzero(untaken)
            rng.shuffle(self._remaining)
        if self._remaining is not None:
            start = self._n_taken - (self.n_rows - self._remaining.size)
            rows = self._remaining[start : start + size]
        else:
            rows = self._draw_sparse(rng, size)
        self._n_taken += rows.size
        return rows

    def _draw_sparse(
        self, rng: np.random.Generator, size: int, first: np.ndarray | None = None
    ) -> np.ndarray:
        # RowSampler._draw_sparse, with membership in the test read from the sorted rows.
        def untaken(candidates: np.ndarray) -> np.ndarray:
            return candidates[~_among(self._taken, candidates)]

        def take(candidates: np.ndarray) -> np.ndarray:
            candidates = _last_copies(candidates)
            self._taken = np.sort(np.concatenate([self._taken, candidates]))
            return candidates

        return _rejection_draw(rng, self._propose, size, first, untaken, take, self._n_taken > 0)


def _lazy_zeros(n_rows: int) -> np.ndarray:
    """Zeroed int64 stamps whose memory is taken only by the pages of rows ever stamped.

    A private anonymous map of small pages: the operating system zeroes a page when it is first
    written, so N rows cost nothing until stamped (a few pages per test that reads past its
    first batch). ``np.zeros`` would ask for huge pages on Linux (NumPy advises them for
    large arrays), and a few thousand stamps scattered over N = 1e9 rows then took 7 GB.
    """
    if not hasattr(mmap, "MAP_PRIVATE"):  # pragma: no cover - Windows
        return np.zeros(n_rows, dtype=np.int64)
    buffer = mmap.mmap(-1, max(1, n_rows) * 8, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buffer, dtype=np.int64, count=n_rows)


class _UniformProposals:
    """``(rng, size) -> rng.integers(0, n_rows, size)``: the samplers' proposals (picklable)."""

    __slots__ = ("n_rows",)

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows

    def __call__(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(0, self.n_rows, size=size)


def _rejection_draw(
    rng: np.random.Generator,
    propose: Proposals,
    size: int,
    first: np.ndarray | None,
    untaken: Callable[[np.ndarray], np.ndarray],
    take: Callable[[np.ndarray], np.ndarray],
    filter_first: bool,
) -> np.ndarray:
    """Propose rows uniformly until ``size`` new ones are taken; both samplers' draw.

    ``propose(rng, size)`` draws uniform proposals; ``first`` are proposals already drawn;
    ``untaken`` drops the rows taken earlier in the test (skipped for the first batch when
    nothing was taken: ``filter_first`` False); ``take`` records a batch and returns it
    without repeats (the last copy of each row).
    """
    batches: list[np.ndarray] = []
    needed = size
    while needed > 0:
        if first is not None:
            candidates, first = first, None
        else:
            candidates = propose(rng, needed)
        if filter_first or batches:
            candidates = untaken(candidates)
        candidates = take(candidates)
        batches.append(candidates)
        needed -= candidates.size
    return batches[0] if len(batches) == 1 else np.concatenate(batches)


def _among(ordered: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` is in the sorted array ``ordered``."""
    if ordered.size == 0:
        return np.zeros(rows.size, dtype=bool)
    where = np.minimum(np.searchsorted(ordered, rows), ordered.size - 1)
    return ordered[where] == rows


def _last_copies(rows: np.ndarray) -> np.ndarray:
    """``rows`` without repeats, keeping the last copy of each in place (as ``_stamp`` does)."""
    _, first_from_end = np.unique(rows[::-1], return_index=True)
    return rows[np.sort(rows.size - 1 - first_from_end)]


def _distinct(rows: np.ndarray) -> bool:
    """Whether no row repeats (a sort of a batch-sized copy: O(b log b), no O(N) work)."""
    ordered = np.sort(rows)
    return not bool((ordered[1:] == ordered[:-1]).any())

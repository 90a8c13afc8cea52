"""Row data held by Dask: the draws' rows fetched ahead of the draws, passes on the cluster.

The model holds a few rows of each Dask-backed array as a placeholder (``pms.dask_data``,
``pymc_subsample/dask_data.py``), and the placeholder's shared variable carries the Dask
array (``tag.dask_rows``). :class:`DaskRows` is what the oracles read instead of the
placeholders (``docs/architecture.md``, "Data on Dask"):

- **Draws.** A step's row sampler proposes rows uniformly, independently of the chain
  (``kernels/row_sampler.py``), so its proposals can be drawn before they are needed.
  :meth:`DaskRows.proposals` hands them out from a stream drawn ahead by its own generator;
  the rows of the next blocks of the stream are fetched from the cluster in a background
  thread while the draws read the current block from local memory. Each test's rows are
  the same uniform sample without replacement as in memory (the sampler's rejection of
  repeats is unchanged), so no estimator or test changes: only when they are read does.
  A draw waits only when it outruns the fetches, never on a pass over the data.
- **Other reads** (the set-up's minibatches, a stratified test's rows) fetch the rows they
  name from the cluster when they are asked for (:meth:`DaskRows.gather`).
- **Passes over every row** run as a Dask reduction (``model/dask_pass.py``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable

from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.dask_pass import aligned, summed_on_dask, whole_rows

__all__ = [
    "FIRST_FETCH_ROWS",
    "FETCH_AHEAD",
    "FETCH_ROWS",
    "KEPT_BLOCKS",
    "KEPT_ROWS",
    "DaskRows",
    "dask_array_of",
    "dask_rows",
]

#: Proposals in the stream's first block: small, so that the first draw waits little; the
#: next blocks double in size up to ``FETCH_ROWS``.
FIRST_FETCH_ROWS = 1 << 13

#: Proposals per later block: a fetch of scattered rows costs a task per chunk of the array
#: whatever its size, so blocks are large (a few MB of rows), and last hundreds of draws.
FETCH_ROWS = 1 << 17

#: Blocks fetched ahead of the one the draws read.
FETCH_AHEAD = 2

#: Rows kept for lookups (the stream's latest blocks, rows fetched on demand): the set-up's
#: minibatches and line searches read their rows again, and a test may span blocks.
KEPT_ROWS = 1 << 19

#: Blocks kept for lookups at most: a lookup searches each (rows fetched on demand, one block
#: per read, would otherwise pile up by the hundred).
KEPT_BLOCKS = 16


def dask_array_of(data: Variable) -> Any | None:
    """Return the Dask array behind a placeholder made by ``pms.dask_data``, else None."""
    return getattr(data.tag, "dask_rows", None) if isinstance(data, SharedVariable) else None


def dask_rows(row_data: Sequence[Variable]) -> DaskRows | None:
    """Return the Dask rows behind ``row_data``, or None where none is on Dask.

    Raises
    ------
    ValueError
        If some row-aligned arrays are on Dask and others are not, or an array's
        placeholder was replaced (``pm.set_data``).
    """
    arrays = [dask_array_of(data) for data in row_data]
    if all(array is None for array in arrays):
        return None
    names = [str(data.name) for data in row_data]
    local = [name for name, array in zip(names, arrays, strict=True) if array is None]
    if local:
        raise ValueError(
            f"The row-aligned data {local} are in memory while the other row-aligned arrays are "
            "on Dask: give every array on the row axis (covariates and observed values) with "
            "pms.dask_data, e.g. y = pms.dask_data('y', da.from_array(y_values)), so that the "
            "rows of all of them are read from the same place."
        )
    for data in row_data:
        if cast(SharedVariable, data).get_value(borrow=True) is not data.tag.dask_placeholder:
            raise ValueError(
                f"The data {data.name!r} were given with pms.dask_data and then replaced "
                "(pm.set_data or set_value). Data on Dask cannot be swapped in place: build the "
                "model again with pms.dask_data on the new Dask arrays."
            )
    dtypes = tuple(np.dtype(data.tag.dask_placeholder.dtype) for data in row_data)
    return DaskRows(tuple(arrays), tuple(names), dtypes)


class DaskRows:
    """The row-aligned Dask arrays a model's rows read, as the oracles read them.

    Parameters
    ----------
    arrays : tuple of dask.array.Array
        The row-aligned arrays, in the order of the rows' functions' inputs.
    names : tuple of str
        Their names, for messages.
    dtypes : tuple of numpy.dtype
        The dtypes the model holds them in (its placeholders'): rows are cast to them where
        they are read, after a fetch or inside a pass's task.
    """

    def __init__(
        self, arrays: tuple[Any, ...], names: tuple[str, ...], dtypes: tuple[np.dtype, ...]
    ) -> None:
        lengths = {name: array.shape[0] for name, array in zip(names, arrays, strict=True)}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"The row-aligned Dask arrays have different lengths {lengths}: every array on "
                "the row axis must hold the same rows."
            )
        # Each chunk holds whole rows (one chunk along every other axis), once for all reads.
        self.arrays = tuple(whole_rows(array) for array in arrays)
        self.names = names
        self.dtypes = dtypes
        self.n_rows = int(next(iter(lengths.values())))
        #: The process that read the arrays: the one whose Dask scheduler (a distributed
        #: client's connection, a thread pool) computes them.
        self.process = os.getpid()
        self._stream = _ProposalStream(self)

    def __getstate__(self) -> dict[str, Any]:
        # A copy starts its own stream; it is refused in another process (check_process).
        keys = ("arrays", "names", "dtypes", "n_rows", "process")
        return {key: self.__dict__[key] for key in keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stream = _ProposalStream(self)

    def check_process(self) -> None:
        """Refuse to read the rows from another process than the one that built the step.

        ``pm.sample(cores=2)`` forks (or spawns) one process per chain; Dask's scheduler of
        the model's process (a ``distributed.Client``'s connection, its thread pools) does not
        work there, and a computation would wait forever.
        """
        if os.getpid() != self.process:
            raise RuntimeError(
                f"The data {list(self.names)} are on Dask (pms.dask_data) and cannot be read "
                "from a worker process of pm.sample: sample with cores=1. The chains then run "
                "one after the other in this process, and the passes over every row still run "
                "on every worker of the Dask cluster."
            )

    def proposals(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Return the next ``size`` uniform row proposals of the stream (int64).

        They are independent uniform draws over the rows, as ``rng.integers(0, N, size)``
        would give; the stream draws them ahead from its own generator, seeded from ``rng``
        at its first call and again whenever a different generator (a new chain's) asks.
        """
        self.check_process()
        return self._stream.take(rng, size)

    def summed(
        self, function: LazyFunction, leading: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], int]:
        """Sum ``function(*leading, *rows)`` over every row on Dask (:func:`summed_on_dask`)."""
        self.check_process()
        return summed_on_dask(function, leading, self.arrays, self.dtypes)

    def gather(self, rows: np.ndarray) -> list[np.ndarray]:
        """Return the data of ``rows`` (int64, any order, repeats allowed), one array each.

        Rows of the stream's recent blocks are read from local memory; others are fetched
        from the cluster now.
        """
        self.check_process()
        rows = np.asarray(rows, dtype=np.int64)
        found = self._stream.lookup(rows)
        if found is not None:
            return found
        unique, inverse = np.unique(rows, return_inverse=True)
        block = _Block(unique, unique, fetch_rows(self.arrays, unique, self.dtypes))
        self._stream.keep(block)
        return [np.take(data, inverse, axis=0) for data in block.data]

    def gather_range(self, rows: slice) -> list[np.ndarray]:
        """Return the data of a range of rows, computed by Dask."""
        import dask

        self.check_process()
        computed = dask.compute(*[array[rows] for array in self.arrays])
        return [
            aligned(np.asarray(block, dtype=dtype))
            for block, dtype in zip(computed, self.dtypes, strict=True)
        ]


def fetch_rows(
    arrays: Sequence[Any], rows: np.ndarray, dtypes: Sequence[np.dtype]
) -> list[np.ndarray]:
    """Compute the sorted, distinct ``rows`` of each Dask array, cast here to ``dtypes``.

    Each array's chunks hold whole rows (:func:`whole_rows`). Where a ``distributed``
    client holds the array's chunks in its workers' memory (``array.persist()``), one task
    per worker takes the rows from the chunks it holds (:func:`_fetch_by_worker`). Otherwise
    one task per chunk that holds some of the rows takes them from the chunk where it is (a
    worker's memory, or read from Zarr there): a graph Dask builds in milliseconds, where
    ``array[rows]`` built its general fancy-indexing graph in 50-70 ms per block of 2^17 rows
    (1e7 rows in chunks of 2^22). Tasks per fetch matter more than its rows: on 3e7 rows in
    115 chunks on two workers, a fetch of 2^17 rows took 0.8-1.1 s by chunk and 0.17-0.34 s
    by worker.
    """
    fetched = _fetch_by_worker(arrays, rows)
    if fetched is None:
        fetched = _fetch_by_chunk(arrays, rows)
    return [
        aligned(np.asarray(data, dtype=dtype)) for data, dtype in zip(fetched, dtypes, strict=True)
    ]


def _chunk_slices(array: Any, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each chunk that holds some of the sorted ``rows``: its position, its rows within it."""
    bounds = np.cumsum((0, *array.chunks[0]))
    edges = np.searchsorted(rows, bounds)
    return [
        (position, rows[begin:end] - start)
        for position, (start, begin, end) in enumerate(
            zip(bounds[:-1], edges[:-1], edges[1:], strict=True)
        )
        if end > begin
    ]


def _fetch_by_chunk(arrays: Sequence[Any], rows: np.ndarray) -> list[np.ndarray]:
    """Fetch ``rows`` with one ``np.take`` task per chunk that holds some of them."""
    import dask

    parts: list[list[Any]] = []
    for array in arrays:
        blocks = array.to_delayed().reshape(-1)
        parts.append(
            [
                dask.delayed(np.take, pure=True)(blocks[position], within, axis=0)
                for position, within in _chunk_slices(array, rows)
            ]
        )
    computed = dask.compute(*[piece for pieces in parts for piece in pieces])
    fetched, position = [], 0
    for array, pieces in zip(arrays, parts, strict=True):
        taken = computed[position : position + len(pieces)]
        position += len(pieces)
        fetched.append(_joined(array, [np.asarray(piece) for piece in taken]))
    return fetched


def _fetch_by_worker(arrays: Sequence[Any], rows: np.ndarray) -> list[np.ndarray] | None:
    """Fetch ``rows`` with one task per worker and array, from the chunks the worker holds.

    Applies where every chunk of every array is a ``distributed`` future (a persisted
    array, its chunks in the workers' memory); returns None otherwise. Each task runs on the
    worker that holds its chunks (another may run it if that worker is lost, after the
    chunks moved), so no chunk crosses the network.
    """
    try:
        from distributed import futures_of
    except ImportError:
        return None
    chunk_futures = []
    for array in arrays:
        by_key = {future.key: future for future in futures_of(array)}
        keys = _row_keys(array)
        if not by_key or any(key not in by_key for key in keys):
            return None
        chunk_futures.append([by_key[key] for key in keys])
    client = chunk_futures[0][0].client  # the client that holds the chunks
    holders = client.who_has([future for futures in chunk_futures for future in futures])
    # (array, chunk positions, task): one task per worker and array.
    submitted: list[tuple[int, list[int], Any]] = []
    for number, (futures, array) in enumerate(zip(chunk_futures, arrays, strict=True)):
        by_worker: dict[str, list[tuple[int, np.ndarray]]] = {}
        for position, within in _chunk_slices(array, rows):
            workers = holders.get(futures[position].key) or ("",)
            by_worker.setdefault(sorted(workers)[0], []).append((position, within))
        for worker, slices in by_worker.items():
            task = client.submit(
                _taken_from_chunks,
                [within for _, within in slices],
                *[futures[position] for position, _ in slices],
                workers=[worker] if worker else None,
                allow_other_workers=True,
                pure=False,
            )
            submitted.append((number, [position for position, _ in slices], task))
    gathered = client.gather([task for _, _, task in submitted])
    pieces: list[dict[int, np.ndarray]] = [{} for _ in arrays]
    for (number, positions, _), taken in zip(submitted, gathered, strict=True):
        pieces[number].update(zip(positions, taken, strict=True))
    return [
        _joined(array, [found[position] for position in sorted(found)])
        for array, found in zip(arrays, pieces, strict=True)
    ]


def _row_keys(array: Any) -> list[Any]:
    """Return the keys of an array's chunks along the rows (one chunk along other axes)."""
    keys = array.__dask_keys__()
    for _ in range(1, array.ndim):
        keys = [chunk[0] for chunk in keys]
    return list(keys)


def _taken_from_chunks(within: Sequence[np.ndarray], *chunks: np.ndarray) -> list[np.ndarray]:
    """On a worker: each chunk's rows ``within`` it (a task of :func:`_fetch_by_worker`)."""
    return [np.take(chunk, rows, axis=0) for chunk, rows in zip(chunks, within, strict=True)]


def _joined(array: Any, pieces: list[np.ndarray]) -> np.ndarray:
    """Join an array's fetched pieces in order (an empty array of its shape if none)."""
    if not pieces:
        return np.empty((0, *array.shape[1:]), dtype=array.dtype)
    return np.concatenate(pieces)


class _Block:
    """Fetched rows of the stream: the proposals in order, and their data by sorted row."""

    __slots__ = ("data", "proposals", "sorted_rows")

    def __init__(
        self, proposals: np.ndarray, sorted_rows: np.ndarray, data: list[np.ndarray]
    ) -> None:
        self.proposals = proposals
        self.sorted_rows = sorted_rows
        self.data = data


class _ProposalStream:
    """Uniform row proposals drawn ahead, their rows fetched in a background thread."""

    def __init__(self, rows: DaskRows) -> None:
        self._rows = rows
        self._owner: np.random.Generator | None = None
        self._generator: np.random.Generator | None = None
        self._pending: deque[Future[_Block]] = deque()
        self._executor: ThreadPoolExecutor | None = None
        self._current: _Block | None = None
        self._position = 0
        self._next_size = FIRST_FETCH_ROWS
        #: Blocks whose rows lookups find: the stream's latest and rows fetched on demand.
        self._kept: deque[_Block] = deque()

    def take(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if rng is not self._owner:
            self._restart(rng)
        pieces = []
        while size > 0:
            current = self._current
            if current is None or self._position == current.proposals.size:
                current = self._advance()
            piece = current.proposals[self._position : self._position + size]
            self._position += piece.size
            size -= piece.size
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def lookup(self, rows: np.ndarray) -> list[np.ndarray] | None:
        """Return the data of ``rows`` if the kept blocks hold all of them, else None.

        The block the draws read is searched first and is always searched: rows fetched on
        demand are kept too, and once they had pushed it out of the kept blocks every draw's
        rows were fetched on demand (on 1e8 rows from the 813th draw on, 56 ms a draw).
        """
        found: list[tuple[_Block, np.ndarray, np.ndarray]] = []
        missing = np.ones(rows.size, dtype=bool)
        current = [] if self._current is None else [self._current]
        for block in [*current, *(kept for kept in self._kept if kept is not self._current)]:
            where = np.searchsorted(block.sorted_rows, rows)
            np.minimum(where, block.sorted_rows.size - 1, out=where)
            hit = missing & (block.sorted_rows[where] == rows)
            if hit.any():
                found.append((block, hit, where))
                missing &= ~hit
                if not missing.any():
                    break
        if missing.any():
            return None
        if len(found) == 1:
            block, _, where = found[0]
            return [np.take(data, where, axis=0) for data in block.data]
        first = found[0][0].data
        gathered = [np.empty((rows.size, *data.shape[1:]), data.dtype) for data in first]
        for block, hit, where in found:
            for out, data in zip(gathered, block.data, strict=True):
                out[hit] = np.take(data, where[hit], axis=0)
        return gathered

    def keep(self, block: _Block) -> None:
        """Keep a block's rows for lookups, newest first; drop the oldest past the limits."""
        self._kept.appendleft(block)
        rows = sum(kept.sorted_rows.size for kept in self._kept)
        while len(self._kept) > 1 and (rows > KEPT_ROWS or len(self._kept) > KEPT_BLOCKS):
            rows -= self._kept.pop().sorted_rows.size

    def _restart(self, rng: np.random.Generator) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._owner = rng
        self._generator = np.random.default_rng(rng.integers(0, 2**63 - 1))
        self._current = None
        self._position = 0

    def _advance(self) -> _Block:
        """Move to the next fetched block (waiting for it if need be); fetch more ahead."""
        if self._current is None and not self._pending:
            self._next_size = FIRST_FETCH_ROWS
        while len(self._pending) < FETCH_AHEAD + 1:
            # Sizes double from the first block's: each next block is fetched while the
            # draws read the smaller one before it.
            self._submit(self._next_size)
            self._next_size = min(2 * self._next_size, FETCH_ROWS)
        block = self._pending.popleft().result()
        self._current, self._position = block, 0
        self.keep(block)
        return block

    def _submit(self, size: int) -> None:
        assert self._generator is not None
        proposals = self._generator.integers(0, self._rows.n_rows, size=size)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="pymc-subsample-fetch")
        rows = self._rows
        self._pending.append(self._executor.submit(_fetched, rows.arrays, rows.dtypes, proposals))


def _fetched(arrays: Sequence[Any], dtypes: Sequence[np.dtype], proposals: np.ndarray) -> _Block:
    sorted_rows = np.unique(proposals)
    return _Block(proposals, sorted_rows, fetch_rows(arrays, sorted_rows, dtypes))

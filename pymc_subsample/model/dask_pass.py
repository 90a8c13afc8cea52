"""Passes over every row of Dask-held data, as a Dask map-reduce on the user's cluster.

A pass (the reference search's Newton iterations on all rows, the control variates' sums, the
start's finiteness check) calls one compiled function on ranges of rows and adds up what it
returns: sums over the range's rows, never per-row arrays (``model/parallel_pass.py`` does
the same on this process's cores). On Dask each chunk of rows is one task, on the worker that
holds the chunk: it calls the function on the chunk's rows, ``PASS_PIECE_ROWS`` at a time,
and returns the chunk's sums; the sums are added in a tree of tasks, and only the total comes
back. The function travels to the workers as what builds its graph (``LazyFunction``
pickles without its compiled code where :func:`shipped` copies it), is compiled once per
worker process (PyTensor's caches make that a load on a machine that compiled it before), and
is called under a lock: a compiled PyTensor function holds its inputs' storage and is not for
two threads at once. ``docs/architecture.md``, "Data on Dask".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from pymc_subsample.model.compiled import LazyFunction

__all__ = [
    "PASS_PIECE_ROWS",
    "ShippedFunction",
    "aligned",
    "aligned_chunks",
    "summed_on_dask",
    "whole_rows",
]

#: Rows per call of the function inside a chunk's task: a call's temporaries (rows x d) stay
#: small whatever the chunk's size.
PASS_PIECE_ROWS = 65_536


class ShippedFunction:
    """A :class:`LazyFunction` sent to Dask's workers: built there, called under a lock.

    Parameters
    ----------
    function : LazyFunction
        The function to call on each chunk; copied without its compiled code.
    """

    def __init__(self, function: LazyFunction) -> None:
        self.function = function.uncompiled()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"function": self.function}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.function = state["function"]
        self._lock = threading.Lock()

    def chunk_sums(
        self, leading: Sequence[np.ndarray], dtypes: Sequence[np.dtype], *chunks: np.ndarray
    ) -> list[np.ndarray]:
        """Sum the function's outputs over a chunk's rows, ``PASS_PIECE_ROWS`` at a time.

        Each piece of rows is cast to its input's dtype (``dtypes``, the model's) first. The
        last entry counts the calls (for outputs that add a constant at each call).
        """
        n_rows = chunks[0].shape[0]
        totals: list[np.ndarray] | None = None
        calls = 0
        with self._lock:
            for begin in range(0, max(n_rows, 1), PASS_PIECE_ROWS):
                calls += 1
                piece = [
                    aligned(np.asarray(chunk[begin : begin + PASS_PIECE_ROWS], dtype=dtype))
                    for chunk, dtype in zip(chunks, dtypes, strict=True)
                ]
                returned = self.function(*leading, *piece)
                if not isinstance(returned, list | tuple):  # a function of one output
                    returned = [returned]
                outputs = [np.array(output, dtype="float64") for output in returned]
                if totals is None:
                    totals = outputs
                else:
                    for total, output in zip(totals, outputs, strict=True):
                        total += output
        assert totals is not None
        return [*totals, np.array(calls)]


def aligned(rows: np.ndarray) -> np.ndarray:
    """Return ``rows``, copied where their memory is not aligned to their dtype.

    Arrays a worker receives from another (deserialised from the network's buffers) can be
    unaligned, which PyTensor's C backend (PyMC 5) refuses.
    """
    return rows if rows.flags.aligned else np.array(rows)


def whole_rows(array: Any) -> Any:
    """Rechunk a Dask array to one chunk along every axis but the rows' (a no-op if it is)."""
    return array.rechunk({axis: -1 for axis in range(1, array.ndim)})


def aligned_chunks(arrays: Sequence[Any]) -> list[Any]:
    """Rechunk the arrays to the first one's row chunks, each chunk holding whole rows."""
    rows = arrays[0].chunks[0]
    return [whole_rows(array).rechunk({0: rows}) for array in arrays]


def summed_on_dask(
    function: LazyFunction,
    leading: Sequence[np.ndarray],
    arrays: Sequence[Any],
    dtypes: Sequence[np.dtype],
) -> tuple[list[np.ndarray], int]:
    """Sum ``function(*leading, *rows)`` over every row of the Dask ``arrays``, on Dask.

    Parameters
    ----------
    function : LazyFunction
        Returns sums over the rows it is given (arrays of fixed shapes).
    leading : sequence of ndarray
        Its inputs before the rows (the point ``q``), the same for every chunk.
    arrays : sequence of dask.array.Array
        The row-aligned data.
    dtypes : sequence of numpy.dtype
        The function's row inputs' dtypes: each chunk's rows are cast to them in its task.

    Returns
    -------
    list of ndarray
        The summed outputs, computed by Dask's scheduler in use (a ``distributed.Client``'s
        cluster where one is active).
    int
        How many calls were summed (a function that adds a constant to its rows' sum, as a
        posterior gradient adds the prior's, added it that many times).
    """
    import dask

    blocks = [array.to_delayed().reshape(-1) for array in aligned_chunks(arrays)]
    token = uuid.uuid4().hex
    shipped = dask.delayed(ShippedFunction(function), name=f"pymc-subsample-function-{token}")
    leading_values = [np.asarray(value) for value in leading]
    parts = [
        dask.delayed(_chunk_sums, pure=True)(shipped, leading_values, list(dtypes), *chunks)
        for chunks in zip(*blocks, strict=True)
    ]
    while len(parts) > 1:  # a tree of additions: only the total comes back
        parts = [
            dask.delayed(_added, pure=True)(*parts[begin : begin + 2])
            if begin + 1 < len(parts)
            else parts[begin]
            for begin in range(0, len(parts), 2)
        ]
    (total,) = dask.compute(parts[0])
    return list(total[:-1]), int(total[-1])


def _chunk_sums(
    shipped: ShippedFunction,
    leading: Sequence[np.ndarray],
    dtypes: Sequence[np.dtype],
    *chunks: np.ndarray,
) -> list[np.ndarray]:
    return shipped.chunk_sums(leading, dtypes, *[np.asarray(chunk) for chunk in chunks])


def _added(first: list[np.ndarray], second: list[np.ndarray]) -> list[np.ndarray]:
    return [a + b for a, b in zip(first, second, strict=True)]

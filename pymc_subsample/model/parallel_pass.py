"""Full-data passes shared among the cores: each thread sums its own ranges of rows.

A pass over every row (the reference search's Newton iterations on all rows, the control
variates' sums at a reference passed in) calls one compiled function per range of rows and
adds up what it returns: sums over the range's rows (a log-likelihood, a gradient, a
Hessian), never per-row arrays. At ``PARALLEL_ROWS`` rows and more the ranges are shared
among the threads: a small Numba driver, compiled to run without the GIL, calls PyTensor's
Numba kernel of the function on each of its ranges of the data arrays (a range of a
C-ordered array is a C-ordered view, read in place: no copy) and adds the outputs into the
thread's own totals, which are added at the end. BLAS runs one thread per pass thread
inside: OpenBLAS's own threads on top of the pass's made a pass 10x slower on 2 cores.
``docs/architecture.md``, "Full-data passes".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import cache
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from pymc_subsample.model.compiled import LazyFunction, NumbaKernel, compile_driver
from pymc_subsample.model.mapped_pages import MappedRows

__all__ = ["PARALLEL_ROWS", "PASS_CHUNK", "pass_threads", "summed_over_ranges"]

#: Rows from which a full pass is shared among threads. Below it a pass takes well under a
#: second (about 0.1 us per row and core for a GLM's gradient and Hessian), less than a cold
#: compile of the driver.
PARALLEL_ROWS = 1 << 22

#: Rows per range of a shared pass: a range's temporaries (rows x d) stay in the cores'
#: caches. Logistic regression, d = 10, 1e7 rows on 2 threads, ns per row for the
#: log-likelihood, gradient and Hessian (the log-likelihood alone): 72-78 (35-47) at 2,048
#: to 4,096 rows, 85 (46) at 8,192 and 16,384, 114 (53) at 65,536.
PASS_CHUNK = 4096

#: Bumped whenever the driver's template changes (part of its cache key).
DRIVER_VERSION = 1

_TEMPLATE = """
def range_sums({leading}, starts, stops{totals}{data}{implicit}):
    for c in range(starts.size):
        begin = starts[c]
        end = stops[c]
        outputs = kernel({leading}{ranges}{implicit})
{additions}
"""


def pass_threads() -> int:
    """Return the number of threads a full pass uses: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - platforms without affinity masks
        return os.cpu_count() or 1


def summed_over_ranges(
    function: LazyFunction,
    leading: Sequence[np.ndarray],
    arrays: Sequence[np.ndarray],
    n_rows: int,
    chunk_size: int,
    pages: MappedRows | None = None,
    threads: int | None = None,
) -> list[np.ndarray] | None:
    """Sum ``function(*leading, *ranges)`` over every range of ``chunk_size`` rows, threaded.

    Parameters
    ----------
    function : LazyFunction
        Returns sums over the rows it is given (arrays of fixed shapes).
    leading : sequence of ndarray
        Its inputs before the rows (the point ``q``), the same for every range.
    arrays : sequence of ndarray
        The row-aligned data arrays, read range by range in place.
    n_rows : int
        Rows in each array.
    chunk_size : int
        Rows per range.
    pages : MappedRows, optional
        The memory maps under ``arrays`` (``mapped_pages.py``). Where there are any, the pass
        streams: it reads the maps block by block, each block read ahead and dropped from
        the process once summed, so its resident memory stays near one block whatever N is.
    threads : int, optional
        Threads to share the ranges among; defaults to :func:`pass_threads`.

    Returns
    -------
    list of ndarray or None
        The summed outputs; None where the pass is not shared (below ``PARALLEL_ROWS``
        rows, one thread and no memory map, a data array that is not C-ordered, or a function
        PyTensor's Numba backend cannot compile): the caller then sums range by range itself.
    """
    threads = pass_threads() if threads is None else threads
    stream = pages if pages is not None and pages else None  # maps to stream, if any
    if n_rows < PARALLEL_ROWS or (threads < 2 and stream is None):
        return None
    if not all(array.flags.c_contiguous for array in arrays):
        return None
    try:
        kernel = function.numba_kernel()
    except RuntimeError:
        return None
    starts = np.arange(0, n_rows, chunk_size, dtype=np.int64)
    stops = np.minimum(starts + chunk_size, n_rows)
    # The first range through the Python-callable function gives the outputs' shapes.
    first = [np.asarray(output) for output in function(*leading, *[a[: stops[0]] for a in arrays])]
    driver = _driver(kernel, len(leading), len(arrays), len(first))
    implicit = kernel.implicit_values()
    totals = [[np.zeros(output.size) for output in first] for _ in range(threads)]

    def run(thread: int, ranges: np.ndarray) -> None:
        if ranges.size:
            driver(*leading, starts[ranges], stops[ranges], *totals[thread], *arrays, *implicit)

    # Blocks of ranges: all of them at once in RAM; STREAM_BLOCK_BYTES of a map's rows each.
    per_block = starts.size
    if stream is not None:
        per_block = max(1, stream.block_rows(n_rows) // chunk_size)
    advice = stream.streaming() if stream is not None else nullcontext()
    with (
        threadpool_limits(limits=1, user_api="blas"),
        ThreadPoolExecutor(threads) as pool,
        advice,
    ):
        for begin in range(1, starts.size, per_block):
            end = min(begin + per_block, starts.size)
            if stream is not None:  # this block and the next
                stream.read_ahead(
                    int(starts[begin]), int(stops[min(end + per_block, starts.size) - 1])
                )
            shares = np.array_split(np.arange(begin, end), threads)
            list(pool.map(run, range(threads), shares))
            if stream is not None:
                stream.release(int(starts[begin]), int(stops[end - 1]))
    return [
        output + np.sum([part[k] for part in totals], axis=0).reshape(output.shape)
        for k, output in enumerate(first)
    ]


def _driver(kernel: NumbaKernel, n_leading: int, n_data: int, n_outputs: int) -> Callable[..., Any]:
    """Generate, compile (or load from PyTensor's Numba cache) the driver for ``kernel``."""
    key = (kernel.function, n_leading, n_data, n_outputs, len(kernel.implicit))
    return _compiled_driver(key, kernel.cache_key)


@cache
def _compiled_driver(key: tuple[Any, ...], kernel_cache_key: str | None) -> Callable[..., Any]:
    function, n_leading, n_data, n_outputs, n_implicit = key
    source = _driver_source(n_leading, n_data, n_outputs, n_implicit)
    environment = {"__name__": __name__, "np": np, "kernel": function}
    return compile_driver(
        source,
        "range_sums",
        environment,
        f"range_sums_{DRIVER_VERSION}",
        [kernel_cache_key],
        nogil=True,
    )


def _driver_source(n_leading: int, n_data: int, n_outputs: int, n_implicit: int) -> str:
    """Return the driver's source: its ranges of each data array through the kernel, summed."""

    def names(prefix: str, count: int) -> list[str]:
        return [f"{prefix}_{k}" for k in range(count)]

    data = names("data", n_data)
    totals = names("total", n_outputs)
    implicit = names("implicit", n_implicit)
    return _TEMPLATE.format(
        leading=", ".join(names("leading", n_leading)),
        totals="".join(f", {name}" for name in totals),
        data="".join(f", {name}" for name in data),
        implicit="".join(f", {name}" for name in implicit),
        ranges="".join(f", {name}[begin:end]" for name in data),
        additions="\n".join(
            f"        {name} += np.ravel(outputs[{k}])" for k, name in enumerate(totals)
        ),
    )

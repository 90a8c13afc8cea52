"""The model's data as the oracles read them: rows, row ranges and the row count N.

Rows are given as int64 indices or as a ``slice`` (:data:`Rows`); :func:`row_chunks` cuts the
full data into ranges read in place. :class:`DataTracker` remembers the data arrays the oracles
read, so that a ``pm.set_data`` is noticed in O(1).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorConstant

from pymc_subsample.model.dask_rows import DaskRows, dask_array_of, dask_rows
from pymc_subsample.model.mapped_pages import MappedRows, mapped_rows

__all__ = ["DataTracker", "Rows", "data_value", "row_chunks", "row_count", "shared_data"]

#: Rows to read: int64 indices, or a slice for a contiguous range (read in place, no copy).
Rows = np.ndarray | slice


def row_chunks(n_rows: int, chunk_size: int) -> Iterator[slice]:
    """Consecutive ranges of at most ``chunk_size`` rows covering rows 0 to ``n_rows - 1``."""
    return (slice(begin, min(begin + chunk_size, n_rows)) for begin in range(0, n_rows, chunk_size))


def row_count(rows: Rows, n_rows: int) -> int:
    """Return how many rows ``rows`` names among ``n_rows`` (a slice's length, or the indices')."""
    return len(range(*rows.indices(n_rows))) if isinstance(rows, slice) else rows.size


def data_value(data: Variable) -> np.ndarray:
    """Return the array of a data variable (shared or constant), without a copy."""
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
        #: The Dask arrays behind the row data (``pms.dask_data``), or None in memory.
        self.dask: DaskRows | None = dask_rows(row_data)
        self.n_rows = self._row_count()
        self._seen = self.fingerprint()
        self._pages: MappedRows | None = None
        #: The initial point at which every row's log-likelihood is still to be checked
        #: finite (``ModelOracles.ensure_rows_finite``), or None once it was.
        self.finite_pending: np.ndarray | None = None

    def __getstate__(self) -> dict[str, object]:
        # The maps' handles stay in this process; a copy finds its own maps when it reads.
        return {**self.__dict__, "_pages": None}

    @property
    def pages(self) -> MappedRows:
        """The memory maps under the row data, advised as rows are read (``mapped_pages.py``)."""
        if self._pages is None:
            self._pages = mapped_rows([data_value(data) for data in self.row_data])
        return self._pages

    def refresh(self) -> bool:
        """Re-read the row count if any data array was replaced; whether one was."""
        seen = self.fingerprint()
        if seen == self._seen:
            return False
        self.dask = dask_rows(self.row_data)
        self.n_rows = self._row_count()
        self._seen = seen
        self._pages = None
        return True

    def shapes(self) -> str:
        """Describe the data arrays read and their shapes, for a message."""
        arrays = list(self.row_data) + [data for data in self.data if data not in self.row_data]
        return ", ".join(
            f"{_describe(data, position)}: {_shape(data)}" for position, data in enumerate(arrays)
        )

    def fingerprint(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Identity and shape of every shared data array (``pm.set_data`` replaces arrays)."""
        values = [data.get_value(borrow=True) for data in self.data]
        return tuple((id(value), np.shape(value)) for value in values)

    def _row_count(self) -> int:
        lengths = {
            _describe(data, position): _shape(data)[0]
            for position, data in enumerate(self.row_data)
        }
        if len(set(lengths.values())) != 1:
            raise ValueError(
                f"The row-aligned data arrays have different lengths {lengths}: after "
                "pm.set_data, give every array on the row axis (covariates and observed values) "
                "the same new number of rows in one call, e.g. pm.set_data({'X': X_new, "
                "'y': y_new}); with pytensor.shared arrays, call set_value on each of them "
                "before sampling."
            )
        return next(iter(lengths.values()))


def _shape(data: Variable) -> tuple[int, ...]:
    """Return a data array's shape: its Dask array's where it is on Dask (``pms.dask_data``)."""
    on_dask = dask_array_of(data)
    return tuple(on_dask.shape) if on_dask is not None else np.shape(data_value(data))


def _describe(data: Variable, position: int) -> str:
    """Name a data array for a message: its name, else its place among the row data."""
    if data.name:
        return str(data.name)
    return f"unnamed array {position} ({type(data).__name__})"


def shared_data(graphs: Sequence[Variable], exclude: set[Variable]) -> tuple[SharedVariable, ...]:
    """Return the shared tensors (``pm.Data``) that ``graphs`` read, other than ``exclude``."""
    return tuple(
        var
        for var in ancestors(list(graphs))
        if isinstance(var, SharedVariable) and var not in exclude and hasattr(var.type, "ndim")
    )

"""Pages of memory-mapped row data: read ahead, released once read.

A NumPy memory map (``np.load(path, mmap_mode="r")``) keeps every page it has read mapped in
the process, so a pass over data larger than RAM would count them all in the process's
resident memory until the kernel evicts them under pressure. The row data's maps are found
here (an array, or a view of one, whose base is a read-only or shared ``np.memmap``) and
advised with ``madvise(2)``:

- a pass over every row advises the maps as read in order (``MADV_NORMAL``) while it runs,
  asks the kernel to read the next block ahead (``MADV_WILLNEED``) and drops the block it has
  summed from the process (``MADV_DONTNEED``; the pages stay in the page cache, so a second
  pass over data that fit in RAM reads them from there);
- gathers of scattered rows (the minibatches of the set-up and of every draw) are advised as
  random reads (``MADV_RANDOM``: the disk reads no neighbouring pages), and, for maps larger
  than ``RESIDENT_SHARE`` of the machine's memory, every page of the maps is dropped once the
  process's resident file pages grew by ``RELEASE_BYTES``. A read of one scattered row maps
  more than its page: the cached pages around it, up to a large folio of the page cache.

Where Python's ``mmap`` has no ``madvise`` (Windows), no map is found and the rows are read as
in RAM.

Dropping a page of a shared or read-only file mapping loses nothing: the next read maps it
again from the page cache or the file. A private (copy-on-write, ``mmap_mode="c"``) map is
never advised, since dropping its pages would drop the user's writes. ``docs/architecture.md``,
"Full-data passes", and ``docs/data_beyond_ram.md``.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FAULT_AROUND_BYTES",
    "GATHER_PIECE_ROWS",
    "RELEASE_BYTES",
    "RESIDENT_SHARE",
    "STREAM_BLOCK_BYTES",
    "MappedRows",
    "gather_from_maps",
    "mapped_rows",
]

#: Bytes of row data per block of a streamed pass: large enough that the threads share a
#: block's ranges evenly and the disk reads ahead in long runs, small beside the memory a
#: pass may hold.
STREAM_BLOCK_BYTES = 1 << 27

#: Growth of the process's resident file pages after which every page of the maps is
#: dropped.
RELEASE_BYTES = 1 << 29

#: What one read of a scattered row may map, where the process's resident pages cannot be
#: read: Linux maps the cached pages around a faulting page with it ("fault-around", 64 KiB
#: by default) whatever the map's advice, or the whole large folio of the page cache that
#: holds it (measured on Linux 6.18: 54-64 KiB per row on one file, 220 KiB on another).
FAULT_AROUND_BYTES = 1 << 16

#: Share of the machine's memory up to which the maps keep the pages scattered reads map.
#: Beyond it they are dropped every ``RELEASE_BYTES``, which costs: a read maps a whole large
#: folio of the page cache (after a pass read ahead, up to 2 MiB per row), and at N = 1e8
#: (a 4.1 GB map, warm) releasing them every few draws took 1.8 ms per draw against 0.18 ms
#: for the same draws in RAM.
RESIDENT_SHARE = 0.5

#: Scattered rows gathered between two looks at the process's resident pages: one read can
#: map a whole large folio of the page cache (up to ``TABLE_REACH``), and a pass read ahead
#: in large folios, so 8,192 rows gathered at once after a pass mapped 6 GB.
GATHER_PIECE_ROWS = 256

#: How far from a faulting page the pages mapped with it may lie: one page table (2 MiB with
#: 4 KiB pages on x86-64 and arm64).
TABLE_REACH = 1 << 21

_PAGE = mmap.PAGESIZE
_SHARED_MODES = ("r", "r+", "w+", "readonly", "readwrite", "write")


@dataclass(frozen=True)
class _Map:
    """One memory map under a row-data array: the map and where the array starts in it."""

    handle: mmap.mmap
    length: int
    first_byte: int  # the array's first row, from the map's start
    row_bytes: int  # bytes from one row to the next


class MappedRows:
    """The memory maps under a model's row-data arrays, advised as they are read.

    Parameters
    ----------
    maps : sequence of _Map
        One per mapped array (arrays in RAM have none).
    """

    def __init__(self, maps: Sequence[_Map]) -> None:
        self._maps = tuple(maps)
        self._bytes_since_release = 0
        self._row_bytes = sum(item.row_bytes for item in self._maps)
        self._scattered_row_bytes = sum(
            max(FAULT_AROUND_BYTES, item.row_bytes) for item in self._maps
        )
        if self._maps:
            self._advise_all(mmap.MADV_RANDOM)
        self._resident_after_release = _resident_file_bytes() or 0
        #: Maps that fit in ``RESIDENT_SHARE`` of the machine's memory keep the pages that
        #: scattered reads map (only passes drop theirs): dropping them cost more than the
        #: draws' own work.
        self.keeps_read_pages = sum(item.length for item in self._maps) <= _resident_budget()

    def __bool__(self) -> bool:
        return bool(self._maps)

    def block_rows(self, n_rows: int) -> int:
        """Rows per block of a streamed pass: ``STREAM_BLOCK_BYTES`` of the maps' rows."""
        return max(1, min(n_rows, STREAM_BLOCK_BYTES // max(self._row_bytes, 1)))

    def draw_block_rows(self) -> int:
        """Return the rows a draw's test reads together, as one sampled unit.

        That is 1 unless the maps' pages leave the process (:attr:`keeps_read_pages` False:
        larger than ``RESIDENT_SHARE`` of memory), where every scattered row is a read from
        the disk (50 us). There it is the rows of one page of the widest map, so that a unit
        costs one or two reads a map where each of its rows cost one
        (``docs/architecture.md``, "Rows read in blocks").
        """
        if not self._maps or self.keeps_read_pages:
            return 1
        return max(1, _PAGE // max(item.row_bytes for item in self._maps))

    @contextmanager
    def streaming(self) -> Iterator[None]:
        """Advise the maps for a pass in order (``MADV_NORMAL``), then random reads again.

        Measured on this project's machine, reading a cold 4 GB range of a map in blocks:
        975 MB/s with normal advice and each next block read ahead, 318 MB/s with random
        advice and the read-ahead, 90 MB/s with random advice alone; scattered rows: 50 us
        each with random advice, 3.2-4 ms with normal advice (the disk reads around each).
        """
        self._advise_all(mmap.MADV_NORMAL)
        try:
            yield
        finally:
            self._advise_all(mmap.MADV_RANDOM)

    def read_ahead(self, start: int, stop: int) -> None:
        """Ask the kernel to start reading rows ``start:stop`` of every map."""
        self._advise_rows(mmap.MADV_WILLNEED, start, stop)

    def release(self, start: int, stop: int) -> None:
        """Drop rows ``start:stop`` of every map from the process (they stay in the cache).

        With them goes ``TABLE_REACH`` before ``start``: reading a range's first rows maps
        cached pages around them (a large folio of the page cache, or the fault-around
        window), which reach back into the range released before it, but never beyond the
        page table of the faulting page.
        """
        self._advise_rows(mmap.MADV_DONTNEED, start, stop, margin=TABLE_REACH)

    def rows_read(self, count: int, *, contiguous: bool = False) -> None:
        """Note ``count`` rows read (a range if ``contiguous``, else scattered rows).

        Every page of the maps is dropped once the process's file pages grew by
        ``RELEASE_BYTES`` since the last release (``/proc/self/statm``: a read of a few
        microseconds). Where that is not available, the growth is estimated:
        ``FAULT_AROUND_BYTES`` per scattered row, the rows' bytes for a range.
        """
        if not self._maps or self.keeps_read_pages:
            return
        resident = _resident_file_bytes()
        if resident is None:
            self._bytes_since_release += count * (
                self._row_bytes if contiguous else self._scattered_row_bytes
            )
            grown = self._bytes_since_release
        else:
            grown = resident - self._resident_after_release
        if grown >= RELEASE_BYTES:
            self.release_all()

    def release_all(self) -> None:
        """Drop every page of the maps from the process."""
        self._advise_all(mmap.MADV_DONTNEED)
        self._bytes_since_release = 0
        self._resident_after_release = _resident_file_bytes() or 0

    def _advise_all(self, advice: int) -> None:
        for item in self._maps:
            item.handle.madvise(advice, 0, item.length)

    def _advise_rows(self, advice: int, start: int, stop: int, margin: int = 0) -> None:
        for item in self._maps:
            # Whole pages covering the rows, clipped to the map (madvise wants page-aligned
            # starts; a neighbouring row's page is advised with them, harmlessly).
            begin = max(0, item.first_byte + start * item.row_bytes - margin)
            end = item.first_byte + stop * item.row_bytes
            begin -= begin % _PAGE
            end = min(item.length, end + (-end) % _PAGE)
            if end > begin:
                item.handle.madvise(advice, begin, end - begin)


def mapped_rows(arrays: Sequence[np.ndarray]) -> MappedRows:
    """Find the shared or read-only memory maps under ``arrays`` (row-aligned data).

    An array is mapped when it, or an array it is a view of, is an ``np.memmap`` whose mode
    shares the file (``"r"``, ``"r+"``, ``"w+"``) and it reads its rows forward in memory.
    """
    found: list[_Map] = []
    if not hasattr(mmap.mmap, "madvise"):  # pragma: no cover - Windows
        return MappedRows(found)
    for array in arrays:
        item = _map_under(array)
        if item is not None:
            found.append(item)
    return MappedRows(found)


def _map_under(array: np.ndarray) -> _Map | None:
    if array.ndim == 0 or array.shape[0] < 2 or array.strides[0] <= 0:
        return None
    base: object = array
    while isinstance(base, np.ndarray):
        handle = getattr(base, "_mmap", None)
        if isinstance(base, np.memmap) and isinstance(handle, mmap.mmap):
            if getattr(base, "mode", None) not in _SHARED_MODES:
                return None
            first_byte = array.__array_interface__["data"][0] - _address(handle)
            if not 0 <= first_byte < len(handle):
                return None
            return _Map(handle, len(handle), first_byte, array.strides[0])
        base = base.base
    return None


def gather_from_maps(
    arrays: Sequence[np.ndarray], rows: np.ndarray, pages: MappedRows
) -> list[np.ndarray]:
    """Copy ``rows`` of each array, ``GATHER_PIECE_ROWS`` at a time, releasing maps between.

    Parameters
    ----------
    arrays : sequence of ndarray
        Row-aligned data, some of them memory-mapped.
    rows : ndarray of int
        The rows to copy.
    pages : MappedRows
        The maps under ``arrays``, told of each piece read.

    Returns
    -------
    list of ndarray
        ``np.take(array, rows, axis=0)`` for each array.
    """
    gathered = [np.empty((rows.size, *array.shape[1:]), dtype=array.dtype) for array in arrays]
    for begin in range(0, rows.size, GATHER_PIECE_ROWS):
        piece = rows[begin : begin + GATHER_PIECE_ROWS]
        for array, out in zip(arrays, gathered, strict=True):
            np.take(array, piece, axis=0, out=out[begin : begin + piece.size])
        pages.rows_read(piece.size)
    return gathered


def _resident_budget() -> float:
    """Return ``RESIDENT_SHARE`` of the machine's physical memory in bytes (inf if unknown)."""
    try:
        return RESIDENT_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return float("inf")


def _resident_file_bytes() -> int | None:
    """Return the resident file and shared pages of the process in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[2]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _address(handle: mmap.mmap) -> int:
    """Return the address of a map's first byte."""
    view = np.frombuffer(handle, dtype=np.uint8, count=1)
    return int(view.__array_interface__["data"][0])

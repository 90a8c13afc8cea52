"""The package's own warning class, and the one function that issues it.

Every warning of the package goes through :func:`warn_user`, which attributes it to the user's
line (the first stack frame outside this package, PyMC, PyTensor and the standard library), so
that the message names the ``pm.sample(...)`` or step-construction line that caused it and
Python's per-location filters ("default", "once", ``-W error``) act on that line.

Inside a PyMC worker process (``pm.sample(cores>1)``) nobody sees a warning: there the step
diverts messages to a per-process outbox (:func:`divert_to_outbox`) and ships them to the parent
in its draw statistics (``pymc_subsample.step_methods.warning_relay``), where they are issued
again through :func:`warn_user`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = [
    "SubsampleWarning",
    "divert_to_outbox",
    "missing_blas_notice_silenced",
    "numba_fallbacks_silenced",
    "take_outbox",
    "user_frame",
    "warn_user",
]

#: Top-level packages whose frames are never "the user's line".
LIBRARY_PACKAGES = frozenset({"pymc_subsample", "pymc", "pytensor"})

#: What PyTensor's Numba backend (and Numba) say when an op without a Numba implementation runs
#: in object mode, bold-faced by Numba's ANSI codes or not: "Numba will use object mode to run
#: polygamma's perform method", "... falling back to object mode".
NUMBA_FALLBACK_MESSAGE = r"(\x1b\[1m)*(Numba will use object mode|.*falling back to object mode)"

#: PyTensor's notice, on a pip install (no BLAS to link its C code to), that "operations that
#: might benefit from BLAS will be severely degraded".
MISSING_BLAS_MESSAGE = r"PyTensor could not link to a BLAS installation"

#: (topic, message) pairs waiting to be shipped to the parent; None outside worker processes.
_outbox: list[tuple[str, str]] | None = None


class SubsampleWarning(UserWarning):
    """Warning about subsampled inference: cost, bias or a model that defeats subsampling.

    Filter it like any warning, for example
    ``warnings.simplefilter("error", pymc_subsample.SubsampleWarning)`` in tests.
    """


def warn_user(message: str, *, topic: str | None = None) -> None:
    """Issue ``message`` as a :class:`SubsampleWarning` attributed to the user's line.

    The line is that of :func:`user_frame`. In a worker process whose step diverted warnings
    (:func:`divert_to_outbox`) the message is queued for the parent instead.

    Parameters
    ----------
    message : str
        The warning's text.
    topic : str, optional
        What the warning is about (default: the message). From the worker processes of one
        parallel run, only the first warning of each topic is shown: chains that each report,
        say, their own distance from the reference point give one warning, not one per chain.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_user("costly")
    >>> caught[0].category.__name__
    'SubsampleWarning'
    """
    if _outbox is not None:
        _outbox.append((message if topic is None else topic, message))
        return
    frame = user_frame()
    module_globals = frame.f_globals
    # What warnings.warn(stacklevel=k) does once it has found its frame. Counting k ourselves
    # would have to copy warn's own rules for skipping importlib frames, which vary by version.
    warnings.warn_explicit(
        message,
        SubsampleWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__", "<string>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )


def user_frame() -> FrameType:
    """Return the innermost frame of the caller's stack that is not library code.

    Library code is this package, PyMC, PyTensor (:data:`LIBRARY_PACKAGES`) and the standard
    library (``sys.stdlib_module_names``: ``warnings``, ``contextlib``, ``multiprocessing``,
    ``logging``, ...). If every frame is library code, the outermost one.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and _is_library_frame(frame):
        frame = frame.f_back
    return frame


def _is_library_frame(frame: FrameType) -> bool:
    package = str(frame.f_globals.get("__name__", "")).partition(".")[0]
    return (
        package in LIBRARY_PACKAGES
        or package in sys.stdlib_module_names
        or frame.f_code.co_filename.startswith("<frozen ")
    )


def divert_to_outbox() -> None:
    """From now on, queue this process's warnings for :func:`take_outbox` instead of issuing them.

    Called by a step when it finds itself in a worker process; a worker process does nothing
    else, so the switch is never turned off.
    """
    global _outbox
    if _outbox is None:
        _outbox = []


def take_outbox() -> tuple[tuple[str, str], ...]:
    """Remove and return the queued (topic, message) pairs (none outside worker processes)."""
    if not _outbox:
        return ()
    messages = tuple(_outbox)
    _outbox.clear()
    return messages


@contextmanager
def numba_fallbacks_silenced() -> Iterator[None]:
    """Ignore, inside the block, the warnings that an op runs in Numba's object mode.

    They come from PyTensor's compiler, not from the user's model, and say only that the op is
    slower than compiled code; the row functions are still correct. Every other warning,
    ``SubsampleWarning`` included, passes.

    PyTensor's Numba backend, when first imported, adds filters of its own for Numba warnings
    it knows to be spurious: "np.dot() is faster on contiguous arrays" on the strided views its
    ``DimShuffle`` makes (``X @ beta`` becomes ``X @ beta[:, None]``; numba issue 10086).
    ``catch_warnings`` puts the filter list back as it was when the block ends, which dropped
    them when the first Numba compile (inside this block) imported the backend: the fused
    draw's compile then printed that warning. The backend is imported before the block.
    """
    _import_numba_backend()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NUMBA_FALLBACK_MESSAGE)
        yield


@contextmanager
def missing_blas_notice_silenced() -> Iterator[None]:
    """Ignore, inside the block, PyTensor's notice that it found no BLAS to link its C code to.

    PyTensor checks once per process, at the first compile whose rewrites ask (PyMC 5's C
    backend, on a pip install), so the notice came from the step's set-up. It is harmless for
    the package's functions: without BLAS flags PyTensor keeps its BLAS ops (``Gemv``, ``Dot``)
    as Python ops, whose ``perform`` calls SciPy's or NumPy's BLAS, and the fused draw is Numba
    code, which calls SciPy's. Only this notice, by its message and category, is ignored, and
    only while the package compiles its own functions.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_BLAS_MESSAGE, category=UserWarning)
        yield


def _import_numba_backend() -> None:
    """Import PyTensor's Numba backend (once; then a dictionary look-up), so its filters stay."""
    try:
        import pytensor.link.numba.dispatch.basic  # noqa: F401
    except ImportError:  # pragma: no cover - a PyTensor without its Numba backend
        pass

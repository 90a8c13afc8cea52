"""Compile a step's PyTensor functions into Numba's cache in a helper process.

A set-up function (``compiled.LazyFunction`` with ``interpreted_first``: the reference search's
graphs, the full-data sums, a hierarchy's per-row derivatives) runs on PyTensor's Python linker
until its estimated time there passes a budget, and is then compiled (``docs/architecture.md``,
"Model layer"). With a cold Numba cache that compile costs 5-20 s, paid in the middle of the
set-up or of tuning. :func:`submit` sends such a function, once half its budget is spent, to a
helper process that compiles it for the argument types of that call into PyTensor's Numba
cache, on another core, while this process goes on interpreting it; when the budget is spent,
:func:`wait_for` lets the compile here load the helper's code from the cache. On a machine's first
build, the functions the draws call from Numba code (the fused draw's, the group sweep's) are
sent before the set-up reaches them (``LazyFunction.prefetch``), for C-contiguous arrays of
their inputs' types, and a group sweep's generated drivers are sent at a chain's first draw,
to compile while its start moves the expansion (``step_methods/fused_group_path.py``). A job
is any picklable object whose ``run`` compiles into the caches (:class:`CompileJob`).

Nothing the step computes depends on the helper: when a function switches from the Python
linker to compiled code is decided by the estimate alone, and the compiled code is the same
whichever process compiled it. Where the helper cannot help or fails, this process compiles as
it did before; a job the helper has not started when this process needs the function is
withdrawn (its file removed, the helper skips it) rather than compiled twice, and while this
process waits for a job the helper has started, it takes back the last job the helper has not
started and compiles it itself, into the cache, rather than wait idle. It runs only in
the process that builds a step (not in ``pm.sample``'s workers), on at least two cores, with
Numba's cache on and outside Windows (its pipes are read with ``select``). A job carries the
function's graph and never the user's data: a graph holding an array of more than
:data:`MAX_ARRAY_BYTES` is not sent. The helper is one process, started at the first job (or
by :func:`start_helper`, at the start of a first build on a machine, so that it has imported
PyTensor by then) and stopped at exit; it reads jobs from its standard input and reports
``start K``, ``done K`` or ``fail K`` for its job ``K`` on its standard output.
A job's graph travels in a temporary file, its path through the pipe: a write into the pipe
never waits for a helper busy compiling.
It ends after :data:`JOBS_PER_HELPER` jobs, and the next job starts a new one: a session that
builds many models does not keep every model's compiled code in one process.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from pymc_subsample.helper_processes import (
    available_cores,
    helper_command,
    helper_environment,
    stop_process,
)

__all__ = [
    "MAX_ARRAY_BYTES",
    "WAIT_SECONDS",
    "CompileJob",
    "FunctionJob",
    "helper_available",
    "start_helper",
    "submit",
    "submit_job",
    "wait_for",
]

#: The largest array a job's graph may hold (constants and shared values): a graph over the
#: user's data as a shared variable is compiled here, never copied into the helper.
MAX_ARRAY_BYTES = 1 << 20
#: The longest a compile waits for the helper's job on the same function (seconds).
WAIT_SECONDS = 120.0
#: The jobs a helper process runs before it ends (the next job starts another).
JOBS_PER_HELPER = 16
_HEADER = struct.Struct("<Q")


class _CarriesData(Exception):
    """A job's graph holds a large array."""


class _DataFreePickler(pickle.Pickler):
    """A pickler that refuses arrays of more than :data:`MAX_ARRAY_BYTES`."""

    def persistent_id(self, obj: Any) -> None:
        if isinstance(obj, np.ndarray) and obj.nbytes > MAX_ARRAY_BYTES:
            raise _CarriesData
        return None


class _Helper:
    """A helper process, its jobs and what it has reported.

    Jobs are numbered across this process's helpers: this one's are ``first_job + 1`` on.
    """

    def __init__(self, first_job: int) -> None:
        self.process = subprocess.Popen(
            helper_command(f"from {__name__} import _serve\n_serve({JOBS_PER_HELPER})\n"),
            env=helper_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.pid = os.getpid()
        self.first_job = first_job
        self.jobs = 0
        self.started: set[int] = set()
        self.finished: set[int] = set()
        self.failed: set[int] = set()
        self._pending = b""
        self._files: list[str] = []

    def send(self, payload: bytes) -> int:
        """Send one job (its graph in a temporary file, the file's path in the pipe)."""
        assert self.process.stdin is not None
        handle, path = tempfile.mkstemp(prefix="pymc_subsample_job_", suffix=".pkl")
        self._files.append(path)
        with os.fdopen(handle, "wb") as file:
            file.write(payload)
        name = path.encode()
        self.process.stdin.write(_HEADER.pack(len(name)) + name)
        self.process.stdin.flush()
        self.jobs += 1
        return self.first_job + self.jobs

    def owns(self, job: int) -> bool:
        """Whether job ``job`` was sent to this helper, from this process."""
        return self.pid == os.getpid() and self.first_job < job <= self.first_job + self.jobs

    def read(self, timeout: float) -> bool:
        """Read what the helper reported within ``timeout`` seconds; False once it has ended."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
        if not ready:
            return True
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        reports = {"start": self.started, "done": self.finished, "fail": self.failed}
        for line in lines:
            word, _, number = line.decode(errors="replace").partition(" ")
            if number.isdigit() and word in reports:
                reports[word].add(self.first_job + int(number))
        return True

    def withdraw(self, job: int) -> bytes | None:
        """Remove job ``job``'s file, so that the helper skips it (reported as failed).

        Return its pickle; None where the helper has read it meanwhile.
        """
        return _take(self._files[job - self.first_job - 1])

    def take_last_pending(self) -> bytes | None:
        """Withdraw the last job the helper has not read and return its graph (None: none).

        A job's file exists until the helper reads it or the job is withdrawn. Where the helper
        reads it at the same moment, both may compile it: the same code into the same cache.
        """
        return next(
            (payload for path in reversed(self._files) if (payload := _take(path)) is not None),
            None,
        )

    def stop(self) -> None:
        """Stop the helper and reap it."""
        stop_process(self.process)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        for path in self._files:  # the jobs it had not read
            Path(path).unlink(missing_ok=True)


def _take(path: str) -> bytes | None:
    """Read a job's file and remove it; None where the helper read it first (or it is gone)."""
    try:
        payload = Path(path).read_bytes()
        Path(path).unlink()
    except OSError:
        return None
    return payload


#: The helpers this process started, the running one last.
_helpers: list[_Helper] = []
_unavailable = False


def helper_available() -> bool:
    """Whether this process may use a helper (the module docstring's conditions)."""
    if _unavailable or os.name == "nt" or multiprocessing.parent_process() is not None:
        return False
    from numba.core import config as numba_config
    from pytensor import config

    if getattr(numba_config, "DISABLE_JIT", False) or not getattr(config, "numba__cache", True):
        return False
    return available_cores() >= 2


def _running_helper() -> _Helper | None:
    """Return this process's helper, starting one at the first job and after a full one.

    A helper that ended before its :data:`JOBS_PER_HELPER` jobs failed: none is started again.
    """
    global _unavailable
    current = _helpers[-1] if _helpers and _helpers[-1].pid == os.getpid() else None
    if current is not None and current.jobs < JOBS_PER_HELPER:
        return current if current.process.poll() is None else None
    if not helper_available():
        return None
    try:
        helper = _Helper(0 if current is None else current.first_job + current.jobs)
    except OSError:
        _unavailable = True
        return None
    if current is None:
        atexit.register(_stop_helpers)
    _helpers.append(helper)
    return helper


def _stop_helpers() -> None:
    """Stop the helpers at exit (a script that ends does not wait for their jobs)."""
    for helper in _helpers:
        if helper.pid == os.getpid():
            helper.stop()


def start_helper() -> None:
    """Start the helper now, if one may run and none does, ahead of its first job.

    A helper takes a second or two to import PyTensor; a step that will send jobs soon
    (a first build on this machine) starts it while it builds its oracles.
    """
    _running_helper()


class CompileJob(Protocol):
    """A helper's job: picklable, its :meth:`run` compiles into the caches (``submit_job``)."""

    def run(self) -> None:
        """Compile, in whichever process runs it (the helper, or this one taking it back)."""


class FunctionJob(NamedTuple):
    """A job compiling one function's Numba code (``LazyFunction.compile_numba``)."""

    builder: Any
    compile_kwargs: dict[str, Any]
    argument_types: tuple[Any, ...] | None
    from_drivers: bool

    def run(self) -> None:
        """Compile the function for the job's argument types."""
        from pymc_subsample.model.compiled import LazyFunction

        LazyFunction(self.builder, self.compile_kwargs).compile_numba(
            self.argument_types, from_drivers=self.from_drivers
        )


def submit(
    builder: Any,
    compile_kwargs: dict[str, Any],
    argument_types: tuple[Any, ...] | None,
    *,
    from_drivers: bool = False,
) -> int:
    """Send a function to the helper; return the job's number, 0 if not sent.

    Parameters
    ----------
    builder : callable
        The function's picklable graph builder (``LazyFunction``'s).
    compile_kwargs : dict
        Its compile arguments.
    argument_types : tuple of numba types or None
        Numba's types of the explicit arguments it will be called with; None for
        C-contiguous arrays of its inputs' types (``LazyFunction.compile_numba``).
    from_drivers : bool, default False
        Compile it for calls from Numba code as well as from Python.
    """
    return submit_job(FunctionJob(builder, compile_kwargs, argument_types, from_drivers))


def submit_job(job: CompileJob) -> int:
    """Send a job to the helper; return its number, 0 if not sent.

    Not sent where no helper may run, where the job does not pickle, or where its pickle
    holds an array of more than :data:`MAX_ARRAY_BYTES`.
    """
    if not helper_available():
        return 0
    buffer = io.BytesIO()
    try:
        _DataFreePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(job)
    except Exception:  # a graph that does not pickle is compiled here
        return 0
    helper = _running_helper()
    if helper is None:
        return 0
    try:
        return helper.send(buffer.getvalue())
    except OSError:
        return 0


def wait_for(
    job: int, timeout: float = WAIT_SECONDS, *, take_back: bool = True
) -> CompileJob | None:
    """Wait while the helper compiles job ``job``; withdraw it if it has not started it.

    A withdrawn job is returned (None otherwise): this process then compiles what it asked
    for itself (``LazyFunction.compile`` the signatures a :class:`FunctionJob` names, at
    once: a group sweep's drivers call a kernel by both). Its file is removed, and the
    helper, finding none, goes on to its next job instead of compiling the same code.
    While the helper compiles job ``job``, this process takes the last job the helper has not
    started and compiles it here, as the helper would have (into the cache), rather than
    wait idle: the function that job was sent for then loads it from the cache. Not with
    ``take_back`` False: a wait that ends the build's last compile (a group sweep's drivers)
    would otherwise run a long job sent for later (a hierarchy's per-row derivatives, 10 s
    cold) to its end first.
    """
    helper = next((helper for helper in _helpers if job and helper.owns(job)), None)
    if helper is None:
        return None
    deadline = time.monotonic() + timeout
    wait = 0.0  # first read what has come, then wait for more while the job runs
    while helper.read(wait) and job not in helper.finished | helper.failed:
        if job not in helper.started:
            withdrawn = helper.withdraw(job)
            return None if withdrawn is None else pickle.loads(withdrawn)
        if time.monotonic() >= deadline:
            return None
        payload = helper.take_last_pending() if take_back else None
        if payload is not None:
            _compile_here(payload)
            wait = 0.0
            continue
        wait = min(deadline - time.monotonic(), 1.0)
    return None


def _compile_here(payload: bytes) -> None:
    """Compile a job taken back from the helper in this process, as the helper would have.

    A job that fails here is left to its function, which compiles (or fails) at its call.
    """
    try:
        _compile_job(payload)
    except Exception:  # the function's own compile reports a real failure
        return


def _compile_job(payload: bytes) -> None:
    """Run one job (a :class:`CompileJob`'s pickle)."""
    job: CompileJob = pickle.loads(payload)
    job.run()


def _serve(jobs: int) -> None:
    """Run jobs from standard input until it closes or ``jobs`` have run."""
    source, report = sys.stdin.buffer, sys.stdout
    for number in range(1, jobs + 1):
        header = source.read(_HEADER.size)
        if not header:
            return
        path = Path(source.read(_HEADER.unpack(header)[0]).decode())
        print(f"start {number}", file=report, flush=True)
        try:
            payload = path.read_bytes()
            path.unlink()
            _compile_job(payload)
        except Exception:  # the step compiles the function itself
            print(f"fail {number}", file=report, flush=True)
        else:
            print(f"done {number}", file=report, flush=True)

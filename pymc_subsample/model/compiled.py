"""PyTensor functions compiled on their first call, so that a step compiles only what it uses.

Compiling is most of a step's set-up (0.3-0.5 s per function; a Hessian graph's rewrites take
the longest), and which functions a step calls depends on choices made after the graphs are
read: whether the default control variate applies, whether the reference search needs
curvature, whether a flat prior needs the identification check. A :class:`LazyFunction` holds
what it needs to build its graph, builds it the first time it is called, runs it on PyTensor's
Python linker while the work it has done is small (the set-up's few passes: no compile at all)
and compiles it once it is used more (a helper process compiles it meanwhile:
``compile_helper.py``); the oracles of one model are shared by every step and reference search
built on it (``docs/architecture.md``, "Model layer"), so each function is compiled at most
once per process.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pytensor
from pymc.pytensorf import compile as compile_pytensor
from pytensor import config
from pytensor.compile.mode import Mode
from pytensor.graph.basic import Variable
from pytensor.scalar.basic import Add, Cast, Mul
from pytensor.tensor.elemwise import Elemwise

from pymc_subsample.model import compile_helper
from pymc_subsample.model.numba_special import register_numba_lowerings
from pymc_subsample.model.python_linker import PYTHON_LINKER_TAG
from pymc_subsample.warnings import missing_blas_notice_silenced, numba_fallbacks_silenced

__all__ = [
    "GraphBuilder",
    "LazyFunction",
    "NumbaKernel",
    "collection_paused",
    "compile_driver",
    "compile_function",
]

#: Builds a function's graph: returns its inputs and outputs. Must be picklable (a module-level
#: function or a functools.partial of one) so that steps pickle into worker processes.
GraphBuilder = Callable[[], tuple[Sequence[Variable], Any]]


#: Estimated seconds of PyTensor's Python linker, per node and call, and per node and row
#: for a node NumPy or SciPy runs as one vectorised call and for an elementwise node without
#: one (a scalar op with no ``nfunc_spec``, ``softplus`` say, which NumPy's ``frompyfunc`` runs
#: as a Python call per element). Measured on the package's set-up graphs on 1e5 to 3e5 rows:
#: 4-8 ns per row and node for the first kind (a Student-t regression's Newton step with its
#: Hessian, 256 nodes), 1.2 us per row for a hierarchy's per-row derivatives (154 nodes, three
#: of them ``softplus`` and its derivatives).
#: On 1e6 rows the logistic regression's rows (2.8 million rows in 253 calls) and search
#: graph (2.4 million in 307) ran 1.9x and 1.7x as long as 2.5e-7 per such row estimated:
#: the per-element Python call costs 0.5 us there.
SECONDS_PER_NODE_CALL = 5e-6
SECONDS_PER_NODE_ROW = 5e-9
SECONDS_PER_PYTHON_LOOP_ROW = 5e-7
#: The rows a set-up function reads while a step is built, in passes over the data: the
#: reference search reads its data two to three times (2.4 and 2.8 passes on 1e6 rows).
SETUP_PASSES = 3
#: Estimated seconds a function runs on PyTensor's Python linker before it is compiled, at
#: least: the seconds compiling one of these graphs costs on a warm cache. On PyTensor 2
#: (PyMC 5) 0: every function compiles at its first call. Its Python linker runs more
#: elementwise nodes as a Python call per element (a ``mul`` of three inputs is ``np.prod``
#: per element), and a memory-mapped search pass ran for minutes there.
INTERPRETED_SECONDS = 2.0 if int(pytensor.__version__.split(".")[0]) >= 3 else 0.0
#: Seconds a cold Numba cache takes to compile a graph, per node of its uncompiled (Python
#: linker) form: a hierarchy's per-row derivatives (154 nodes) took 10.3 s, a Student-t
#: regression's search graph (256 nodes) 16.4 s, on 2 cores.
COLD_COMPILE_SECONDS_PER_NODE = 0.065
#: A large graph runs interpreted for up to this share of its estimated cold compile, when that
#: is more than ``INTERPRETED_SECONDS``: the rent-or-buy rule with the price of buying, so that
#: the set-up's few passes through a large graph never compile it (on 1e6 rows, 13 passes
#: through the per-row derivatives, 2.5 s, against a 10 s compile), while a graph used on
#: every draw is compiled after at most this share of that price is spent interpreting it.
COLD_COMPILE_SHARE = 0.5


#: A function's helper job when it was not sent (``LazyFunction._send_to_helper``).
NOT_SENT = -1


class LazyFunction:
    """A PyTensor function, built at its first call; a set-up function interpreted at first.

    Compiling a graph for Numba (or C) costs about 0.05 s per node on a cold cache, seconds for
    the derivative graphs of a reference search or a hierarchy's sums, which a step calls a few
    dozen times during its set-up. A set-up function (``interpreted_first``) starts on
    PyTensor's Python linker, with the same rewrites but no elementwise fusion (each node one
    NumPy operation over the rows) and is compiled once the time it has run that way, as
    estimated from its graph (``SECONDS_PER_NODE_CALL`` per node and call, and per row
    ``SECONDS_PER_NODE_ROW`` for each node or ``SECONDS_PER_PYTHON_LOOP_ROW`` for an
    elementwise node NumPy loops over in Python), would pass its budget:
    ``INTERPRETED_SECONDS``, or for a large graph ``COLD_COMPILE_SHARE`` of its estimated cold
    compile (``COLD_COMPILE_SECONDS_PER_NODE`` per node). The estimate and the budget depend
    only on the graph and the calls before, never on a clock or on what a cache holds, so a
    seed gives the same draws in every run. The functions of a draw are
    compiled at their first call: they are called thousands of times, and most are also
    Numba kernels (:meth:`numba_kernel`), which are always compiled.

    Parameters
    ----------
    build : callable
        Returns ``(inputs, outputs)``; called once, at the first call.
    compile_kwargs : dict
        Passed to PyTensor's compiler (``mode=`` and so on).
    interpreted_first : bool, default False
        Run on PyTensor's Python linker until the work above is done.
    """

    __slots__ = (
        "_budget",
        "_build",
        "_compile_job",
        "_compile_kwargs",
        "_expected_rows",
        "_function",
        "_interpreted",
        "_interpreted_cost",
        "_interpreted_seconds",
        "_numba_function",
    )

    def __init__(
        self,
        build: GraphBuilder,
        compile_kwargs: dict[str, Any],
        *,
        interpreted_first: bool = False,
    ) -> None:
        self._build = build
        self._compile_kwargs = compile_kwargs
        self._function: Callable[..., Any] | None = None
        self._interpreted: Callable[..., Any] | None = None
        # Estimated seconds per call and per row on the Python linker, known once it is built.
        self._interpreted_cost: tuple[float, float] | None = None
        # Estimated seconds run on the Python linker so far, and the most it may run there
        # (0 for a function compiled at once; set from the graph's size once it is built).
        self._interpreted_seconds = 0.0
        self._budget = INTERPRETED_SECONDS if interpreted_first else 0.0
        self._numba_function: Callable[..., Any] | None = None
        # Rows the set-up is expected to read through this function (expect_rows).
        self._expected_rows = 0
        # The compile helper's job on this function (compile_helper.py; 0: none).
        self._compile_job = 0

    def expect_rows(self, rows: int) -> None:
        """Say how many rows the set-up will read through this function, in all.

        A set-up function whose estimated interpreted time for these rows would pass its
        budget (class docstring) compiles at its first call instead: it would be compiled
        anyway, after spending its budget (on 1e6 rows a logistic regression's build took
        8.7 s with warm caches interpreting first, 2.8 s compiling at once).
        """
        self._expected_rows = int(rows)

    @property
    def built(self) -> bool:
        """Whether the function's graph has been built (interpreted or compiled)."""
        return self._function is not None or self._interpreted is not None

    @property
    def compiled(self) -> bool:
        """Whether the function has been compiled."""
        return self._function is not None

    def __call__(self, *args: Any) -> Any:
        """Evaluate, building it first if needed, interpreted or compiled (class docstring)."""
        function = self._function
        if function is not None:
            return function(*args)
        if self._interpreted_seconds < self._budget:
            first = self._interpreted is None
            interpreted = self._interpreted or self._interpret()
            per_call, per_row = self._interpreted_cost or (0.0, 0.0)
            # At the first call, the rows the set-up will read through it (expect_rows).
            expected = per_row * self._expected_rows if first else 0.0
            seconds = self._interpreted_seconds + per_call + per_row * _rows_of(args)
            if max(seconds, expected) <= self._budget:
                self._interpreted_seconds = seconds
                if not self._compile_job and 2.0 * max(seconds, expected) >= self._budget:
                    self._send_to_helper(args)
                # NumPy's floating-point warnings: compiled code gives the same inf and NaN.
                with np.errstate(all="ignore"):
                    return interpreted(*args)
            self._budget = 0.0
        # The first call loads (or JIT-compiles) the Numba code: many objects as well.
        with collection_paused():
            return self.compile()(*args)

    def _send_to_helper(self, args: tuple[Any, ...]) -> None:
        """Have the compile helper compile it for the types of ``args`` (half its budget spent).

        Likely to be compiled here later, which then loads it from the cache
        (``compile_helper.py``); a function the set-up uses less is never sent, and leaves the
        helper's core to the functions the draws compile. Not sent where Numba cannot type
        ``args``.
        """
        types = _numba_types(args)
        job = 0
        if types is not None:
            job = compile_helper.submit(self._build, self._compile_kwargs, types)
        # Not sent (no helper, or a graph holding data): not tried again at each later call,
        # which would pickle the graph again (0.02 s a call for a hierarchy's per-row
        # derivatives, called a hundred times by a first draw's recentring on 1e6 rows).
        self._compile_job = job or NOT_SENT

    def _interpret(self) -> Callable[..., Any]:
        """Build the function on PyTensor's Python linker (no fusion: NumPy's own loops)."""
        with config.change_flags(traceback__limit=0), collection_paused():
            inputs, outputs = self._build()
            mode = (
                Mode(linker="py", optimizer="fast_run")
                .excluding("fusion")
                .including(PYTHON_LINKER_TAG)
            )
            self._interpreted = compile_function(
                list(inputs), outputs, {**self._compile_kwargs, "mode": mode}
            )
        self._interpreted_cost = _interpreted_cost(self._interpreted)
        nodes = len(cast(Any, self._interpreted).maker.fgraph.apply_nodes)
        self._budget = max(self._budget, COLD_COMPILE_SHARE * COLD_COMPILE_SECONDS_PER_NODE * nodes)
        return self._interpreted

    def prefetch(self, *, from_drivers: bool = True) -> None:
        """Have the compile helper compile this function's Numba code now, if one runs.

        For a function the draws call, known before the set-up reaches it: the helper
        compiles it for C-contiguous arrays of its inputs' types, for calls from Python and,
        ``from_drivers``, from Numba code (``numba_kernel``: what the fused drivers pass),
        while this process searches for its reference point or compiles other functions, and
        the compile here then loads it from the cache (``compile_helper.py``).
        """
        if self._function is None and not self._compile_job:
            self._compile_job = compile_helper.submit(
                self._build, self._compile_kwargs, None, from_drivers=from_drivers
            )

    def compile_numba(
        self, argument_types: tuple[Any, ...] | None, *, from_drivers: bool = False
    ) -> None:
        """Compile the Numba code of :meth:`numba_kernel` for explicit ``argument_types``.

        What the compile helper runs (``compile_helper.py``): for a call from Python and,
        ``from_drivers``, one from Numba code (a driver's). With ``argument_types`` None,
        C-contiguous arrays of the graph's input types. The shared variables' types are those
        of their values.
        """
        from numba import from_dtype, typeof
        from numba.core import types

        kernel = self.numba_kernel()
        if argument_types is None:
            function = self._numba_compiled()
            argument_types = tuple(
                types.Array(from_dtype(np.dtype(spec.variable.type.dtype)), spec.variable.ndim, "C")
                for spec in function.maker.inputs
                if not spec.implicit
            )
        signature = (*argument_types, *(typeof(value) for value in kernel.implicit_values()))
        # PyTensor's Numba function takes its inputs as ``*args``. Numba types them as one
        # tuple in a call from Python (PyTensor's thunk) and as a star-argument tuple in a call
        # from Numba code (a driver's), and compiles each signature on its own: a driver's
        # would not find the Python call's code in the cache, nor the other way round.
        jit_function: Any = kernel.function
        jit_function.compile((types.BaseTuple.from_types(signature),))
        if from_drivers:
            jit_function.compile((types.StarArgTuple(signature),))

    def compile(self) -> Callable[..., Any]:
        """Compile now (idempotent) and return the compiled function."""
        if self._function is None:
            # The derivative graphs have thousands of nodes, and PyTensor records a stack
            # trace at each node's creation (and each rewrite's): 0.1 s of a step's set-up,
            # for tracebacks that would point inside this package, not at the user's model.
            with config.change_flags(traceback__limit=0), collection_paused():
                inputs, outputs = self._build()
                function = compile_function(list(inputs), outputs, self._compile_kwargs)
            # PyTensor's rewrites done (up to a second of a large graph's), the helper's
            # job on it is waited for: the Numba code is compiled or loaded at the first call.
            withdrawn = compile_helper.wait_for(self._compile_job)
            self._compile_job = 0
            self._function = function
            self._interpreted = None
            if isinstance(withdrawn, compile_helper.FunctionJob):
                # Not started by the helper: the signatures it was sent for, compiled here now
                # (a prefetched kernel's for calls from Numba code as well, which the drivers
                # would otherwise compile within their own compile).
                self.compile_numba(withdrawn.argument_types, from_drivers=withdrawn.from_drivers)
        return self._function

    def numba_kernel(self) -> NumbaKernel:
        """Return the function as compiled by PyTensor's Numba backend, for Numba code.

        PyMC 6 compiles with that backend by default, and the function compiled for Python
        callers is reused; otherwise (PyMC 5's C backend, or a ``mode`` in ``compile_kwargs``)
        the graph is compiled once more for Numba.

        Raises
        ------
        RuntimeError
            If PyTensor's Numba backend cannot compile the graph.
        """
        function = self._numba_compiled()
        jit_function = getattr(function.vm, "jit_fn", None)
        if jit_function is None:
            raise RuntimeError("PyTensor's Numba backend did not compile this function.")
        implicit = tuple(
            container
            for container, spec in zip(function.input_storage, function.maker.inputs, strict=True)
            if spec.implicit
        )
        return NumbaKernel(
            function=jit_function,
            n_inputs=len(function.maker.inputs) - len(implicit),
            implicit=implicit,
            cache_key=_numba_cache_key(jit_function),
        )

    def _numba_compiled(self) -> Any:
        """Return the PyTensor function compiled by the Numba backend (:meth:`numba_kernel`)."""
        function: Any = self.compile()
        if getattr(function.vm, "jit_fn", None) is None:
            if self._numba_function is None:
                with config.change_flags(traceback__limit=0), collection_paused():
                    inputs, outputs = self._build()
                    kwargs = {**self._compile_kwargs, "mode": "NUMBA"}
                    self._numba_function = compile_function(list(inputs), outputs, kwargs)
            function = self._numba_function
        return function

    @property
    def recipe(self) -> tuple[GraphBuilder, dict[str, Any]]:
        """What builds it again in another process: its graph builder and compile arguments."""
        return self._build, self._compile_kwargs

    def uncompiled(self) -> LazyFunction:
        """Return a copy that compiles at its first call (what a Dask worker is sent)."""
        return LazyFunction(self._build, self._compile_kwargs)

    @property
    def interpreted_first(self) -> bool:
        """Whether the function still runs on PyTensor's Python linker at its next small call."""
        return self._function is None and self._interpreted_seconds < self._budget

    def __getstate__(self) -> tuple[Any, ...]:
        # A helper's job is this process's: a copy in a worker compiles by itself.
        return tuple(
            0 if name == "_compile_job" else getattr(self, name) for name in self.__slots__
        )

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)


@dataclass(frozen=True)
class NumbaKernel:
    """A compiled PyTensor function's Numba dispatcher and how to call it.

    Attributes
    ----------
    function : callable
        The dispatcher PyTensor's Numba linker built from the function's graph: called with
        the explicit inputs and then the implicit ones (shared variables), it returns a tuple
        of the outputs. Numba code can call it.
    n_inputs : int
        Number of explicit inputs.
    implicit : tuple of Container
        The shared variables' storage, read for their current values at each call.
    cache_key : str or None
        PyTensor's key of the dispatcher's code in its Numba cache (None: not cached).
    """

    function: Callable[..., Any]
    n_inputs: int
    implicit: tuple[Any, ...]
    cache_key: str | None

    def implicit_values(self) -> list[Any]:
        """Return the current values of the implicit inputs (no copy)."""
        return [container.storage[0] for container in self.implicit]


def _numba_cache_key(jit_function: Any) -> str | None:
    try:
        from pytensor.link.numba.cache import CACHED_SRC_FUNCTIONS
    except ImportError:  # pragma: no cover - a PyTensor without Numba caching
        return None
    py_function = getattr(jit_function, "py_func", None)
    return None if py_function is None else CACHED_SRC_FUNCTIONS.get(py_function)


def _interpreted_cost(function: Any) -> tuple[float, float]:
    """Estimate a Python-linker function's seconds per call and per row (``LazyFunction``)."""
    nodes = function.maker.fgraph.apply_nodes
    # Nodes whose outputs are views of their inputs (a transpose, a column, a shape
    # assertion) or have a size fixed by the graph (scalars, the parameters' transforms, a
    # Student-t's trigamma(nu / 2) of shape (1, 1)) cost per call only; the others are
    # counted per row, an overestimate for those on short vectors.
    arrays = [node for node in nodes if _reads_per_row(node)]
    python_loops = sum(1 for node in arrays if _loops_in_python(node))
    per_row = SECONDS_PER_NODE_ROW * len(arrays) + SECONDS_PER_PYTHON_LOOP_ROW * python_loops
    return SECONDS_PER_NODE_CALL * len(nodes), per_row


def _reads_per_row(node: Any) -> bool:
    """Whether ``node`` computes an output whose size the graph leaves open (rows, say)."""
    view_map = getattr(node.op, "view_map", {})
    return any(
        index not in view_map and None in getattr(out.type, "shape", ())
        for index, out in enumerate(node.outputs)
    )


def _loops_in_python(node: Any) -> bool:
    """Whether PyTensor's Python linker runs ``node`` as a Python call per element.

    An elementwise node runs as one NumPy call where its scalar op names a NumPy or SciPy
    function of as many inputs (``nfunc_spec``); otherwise ``Elemwise.perform`` falls back to
    ``np.frompyfunc`` of the scalar op's Python ``impl``: ``softplus``, small composites.
    PyTensor 3 (where the tier is on) runs a ``Cast`` as ``astype`` and folds a ``mul`` or
    ``add`` of three or more inputs with its binary ufunc; PyTensor 2 ran those per element
    (``np.prod``: a search pass on a memory map took minutes).
    """
    if not isinstance(node.op, Elemwise) or isinstance(node.op.scalar_op, Add | Mul | Cast):
        return False
    spec = getattr(node.op.scalar_op, "nfunc_spec", None)
    return not spec or len(node.inputs) != spec[1]


def _numba_types(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Return Numba's types of a call's arguments (those its compiled code is built for).

    None where Numba cannot type one of them: no helper's job is sent then.
    """
    from numba import typeof

    try:
        return tuple(typeof(arg) for arg in args)
    except (TypeError, ValueError):
        return None


def _rows_of(args: tuple[Any, ...]) -> int:
    """Return the length of the longest array among ``args`` (at most the rows a call reads)."""
    return max((len(arg) for arg in args if isinstance(arg, np.ndarray) and arg.ndim), default=0)


def compile_function(
    inputs: list[Variable], outputs: Any, compile_kwargs: dict[str, Any]
) -> Callable[..., Any]:
    """Compile with PyMC's defaults; inputs need not be used, and are trusted (no checks)."""
    # Unused inputs are expected: a step over hyperparameters that only the prior sees has row
    # terms that do not depend on its point (their differences are then exactly 0).
    register_numba_lowerings()
    with numba_fallbacks_silenced(), missing_blas_notice_silenced():
        function = compile_pytensor(
            inputs, outputs, **{"on_unused_input": "ignore", **compile_kwargs}
        )
    function.trust_input = True
    return function


@contextmanager
def collection_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while graphs are built and compiled.

    Building and rewriting a graph allocates hundreds of thousands of small objects, and each
    allocation threshold crossed starts a collection that walks every object of the process
    (PyMC, PyTensor and the user's session: millions); at N = 1e6 those walks were 0.2-0.4 s
    of a step's 2-2.5 s of set-up. Reference counting still frees what is not in a cycle; the
    collector resumes (if it was running) when the block ends and finds any cycles then.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def llvm_optimisation(level: int) -> Iterator[None]:
    """Compile Numba code within the block at LLVM optimisation ``level`` (``NUMBA_OPT``).

    Numba reads its ``OPT`` setting at each compile's LLVM passes (machine code generation
    keeps the process's level). A generated driver is glue around kernels that Numba has
    optimised at their own compile: their code is linked into the driver's and optimised once
    more with it, a large part of a large driver's compile (``docs/architecture.md``,
    "Group effects").
    """
    from numba.core import config

    numba_config: Any = config  # its settings are set at import, from the environment
    saved = numba_config.OPT
    numba_config.OPT = type(saved)(level)
    try:
        yield
    finally:
        numba_config.OPT = saved


def compile_driver(
    source: str,
    name: str,
    environment: dict[str, Any],
    key: str,
    key_parts: Sequence[str | None],
    **options: Any,
) -> Callable[..., Any]:
    """Compile generated Numba source (a driver of PyTensor's kernels), cached on disk.

    The drivers of the fused draw, the group sweep's decisions and hyperparameter walk, and
    the full-data passes are Python source generated per model that calls PyTensor's Numba
    kernels. They are cached in PyTensor's Numba cache under ``pymc_subsample_{key}_`` and a
    digest of ``source`` and ``key_parts`` (the kernels' own cache keys and the source of the
    kernels the driver calls): not cached where any part is None (a kernel PyTensor did not
    cache). ``environment`` must hold ``__name__``: Numba's cache rebuilds it by importing
    that module. ``options`` go to Numba (``nogil=True``).
    """
    from pytensor.link.numba.cache import compile_numba_function_src
    from pytensor.link.numba.dispatch.basic import numba_njit

    cache_key = None
    if all(part is not None for part in key_parts):
        text = "\n".join([source, *(part for part in key_parts if part is not None)])
        cache_key = f"pymc_subsample_{key}_{hashlib.sha256(text.encode()).hexdigest()}"
    function = compile_numba_function_src(source, name, environment, cache_key=cache_key)
    return numba_njit(
        function, cache=cache_key is not None, final_function=True, fastmath=False, **options
    )

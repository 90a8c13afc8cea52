"""Compile the package's own Numba kernels in a helper process while a step is built.

The fused draw and the group sweep (``docs/architecture.md``, "The fused draw") call the
Numba kernels of ``kernels/fused.py``, ``kernels/fused_groups.py``,
``kernels/fused_proposals.py`` and ``kernels/group_newton.py``. They do not depend on the
model, so Numba caches them on disk once per machine (``cache=True``); but a user's first
build pays for compiling them, 4-5 s of a cold first build on 2 cores, after the reference
search and the model's own graphs, one after the other.

:func:`start_kernel_warm_up` starts, at most once per process, a helper process that
compiles them with the signatures the drivers call them with (:data:`KERNEL_SIGNATURES`)
into the same cache, while this process searches for its reference point and compiles the
model's graphs; :func:`wait_for_kernel_warm_up` waits for it before the group sweep's drivers
are compiled, which then load them from the cache, and the fused draw's driver compiles beside
it and then stops it (:func:`stop_kernel_warm_up`). Nothing changes but when the compiling
happens: the kernels and their cache are Numba's own, and where the helper cannot run, has
not finished in time or fails, this process compiles them itself, as it did before.

The helper runs only where it can help: with the kernels not yet cached, Numba's cache
enabled, and at least two cores for this process; for kernels the build calls only at its end
(the fused draw's), at a lower priority, on what the build and the compile helper leave of the
cores.
"""

from __future__ import annotations

import atexit
import importlib
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from numba.core import types

__all__ = [
    "KERNEL_SIGNATURES",
    "compile_kernels",
    "dispatcher_cached",
    "kernels_cached",
    "start_kernel_warm_up",
    "stop_kernel_warm_up",
    "wait_for_kernel_warm_up",
]

_F, _I, _B = types.float64, types.int64, types.boolean
_F1, _F2, _F3 = types.float64[::1], types.float64[:, ::1], types.float64[:, :, ::1]
_I1, _I2, _B1 = types.int64[::1], types.int64[:, ::1], types.boolean[::1]
_FA1 = types.float64[:]
# A grouping factor's quadratic model as proposal_terms reads it: mean, precision, factor.
_FACTOR_MODEL = types.Tuple((_F2, _F3, _F2))

#: The kernels the generated drivers call, by module (the fused draw's, the group sweep's
#: three) and name, with the argument types the
#: drivers call them with (``tests/test_kernel_warm_up.py`` checks them against the kernels
#: a fused draw and a group sweep compile). A kernel's callees are compiled with it.
KERNEL_SIGNATURES: dict[str, dict[str, tuple[tuple[Any, ...], ...]]] = {
    # The fused draw's driver compiles beside this helper (``stop_kernel_warm_up``): the
    # helper compiles them in the reverse of the order the driver's compile reaches them, so
    # that the two meet; seed_generator, called at a chain's first draw, first.
    "fused": {
        "seed_generator": ((_I,),),
        "distance_sq": ((_F1, _F1, _F2),),
        "finish_decision": ((_I, _B, _F, _F, _I, _F, _F1, _I1, _F1, _F1, _F, _F1),),
        "consume_stages": ((_F1, _I, _I, _B, _I, _F, _F, _F1, _F1),),
        "finite_total": ((_F1,),),
        # The data as most models hold them: a design matrix, float and integer columns
        # (another type compiles with the driver). block_rows and block_sums are not here:
        # only a driver over memory maps larger than memory calls them, and compiles them.
        "take_values": ((_F1, _I1), (_I1, _I1)),
        "take_matrix_rows": ((_F2, _I1),),
        "draw_rows": ((_I, _I, _I1, _I1, _I1, _I1),),
        "no_rows": ((),),
        "start_test": ((_I1, _F1),),
        "log_uniform_for": ((_I,),),
        "proxy_difference": ((_F1, _F1, _F1, _F1, _F2, _I),),
        "propose": ((_I, _F1, _F, _F2, _F2, _F1),),
    },
    "fused_groups": {
        "rows_of_groups": ((_I1, _I1, _B1),),
        # PyTensor 2's kernels hand the values over as a strided view; PyTensor 3's in order.
        "add_by_group": ((_F1, _I1, _F1), (_FA1, _I1, _F1)),
        "draw_group_rows": ((_I1, _I1, _I1, _I),),
        "consume_group_stage": (
            (_F1, _I1, _I, _I, _I1, _F2, _F1, _F1, _I, _F1, _F1, _F1, _F, _B1, _B1),
        ),
        "finish_groups": ((_F1, _F1, _F1, _B1, _I, _B1, _I1),),
        "start_decisions": ((_F1, _B1, _B),),
        "all_groups": ((_I,),),
        "no_groups": ((_I,),),
        "new_counts": ((_I1,),),
        "add_sweep_counts": ((_I1, _I1, _B1),),
    },
    "fused_proposals": {
        "fill_sweep_noise": ((_F3, _F2, _F2),),
        "effects_of": ((_F1, _I2),),
        "newton_proposal": ((_F2, _F3, _F2, _F2, _F1),),
        "proposal_terms": (
            (_F2, _F2, _F1, _F1, _FACTOR_MODEL, _FACTOR_MODEL, _F2, _F2, _F3, _F2, _F2),
        ),
        "with_effects": ((_F1, _I2, _F2, _B1),),
        # The sweep carries effects (G, k), Newton means and scales (G, k) and (G,), vectors
        # (G, k, k) and the parts' tables into its next sweep.
        "take_groups": ((_F1, _F1, _B1), (_F2, _F2, _B1), (_F3, _F3, _B1)),
    },
    "group_newton": {
        "small_symmetric_eigen": ((_F3,),),
        "newton_precision": ((_F2, _F3),),
        "newton_mean": ((_F2, _F2, _B1, _F2, _F3),),
        "proposal_log_density": ((_F2, _F2, _F3, _F2),),
        "cell_model_derivatives": ((_F2, _F3, _F2, _F3, _F2, _F2, _F3),),
    },
}

#: The niceness of a helper compiling in the background (``start_kernel_warm_up``).
BACKGROUND_NICENESS = 10
#: The longest a build waits for the helper before compiling the kernels itself (seconds).
WAIT_SECONDS = 120.0
#: The helper processes started and not yet waited for, and the modules asked for.
_helpers: list[subprocess.Popen[bytes]] = []
_requested: set[str] = set()
#: The modules each helper compiles, in its order, by its process id.
_helper_modules: dict[int, tuple[str, ...]] = {}


def _dispatchers(modules: Sequence[str]) -> list[tuple[Any, tuple[tuple[Any, ...], ...]]]:
    """Each kernel of ``modules`` as its Numba dispatcher and signatures (imports them)."""
    found: list[tuple[Any, tuple[tuple[Any, ...], ...]]] = []
    for module_name in modules:
        kernels = KERNEL_SIGNATURES[module_name]
        module = importlib.import_module(f".{module_name}", __package__)
        found.extend((getattr(module, name), signatures) for name, signatures in kernels.items())
    return found


def compile_kernels(modules: Sequence[str]) -> None:
    """Compile (or load from Numba's cache) the kernels of ``modules``."""
    for dispatcher, signatures in _dispatchers(modules):
        for signature in signatures:
            dispatcher.compile(signature)


def kernels_cached(modules: Sequence[str]) -> bool:
    """Whether Numba's cache holds an index for every kernel of ``modules`` (no load)."""
    return all(dispatcher_cached(dispatcher) for dispatcher, _ in _dispatchers(modules))


def dispatcher_cached(dispatcher: Any) -> bool:
    """Whether Numba's cache holds an index for ``dispatcher`` (a signature of it, at least).

    Any Numba dispatcher compiled with ``cache=True``: the package's kernels, or a generated
    driver (``model/compiled.compile_driver``). Nothing is loaded.
    """
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    index = getattr(cache_file, "_index_path", None)
    return index is not None and os.path.exists(index)


def start_kernel_warm_up(modules: Sequence[str], *, in_background: bool = False) -> bool:
    """Start a helper process compiling the kernels of ``modules``, where it helps.

    ``modules`` name entries of :data:`KERNEL_SIGNATURES` (a step's ``warm_kernels``). Each
    module is asked for once per process; a helper starts only for modules whose kernels
    are not cached yet, with Numba's cache on and at least two cores for this process.
    ``in_background``: the build calls the kernels only at its end (the fused draw's, after
    the reference search), and the helper runs at a lower priority (niceness
    :data:`BACKGROUND_NICENESS`), on what the build and the compile helper leave of the
    cores: a Student-t regression's cold first build took 11.0-11.8 s with it, 12.8-14.4 s
    without (the three processes sharing two cores, the compile helper's job on the build's
    critical path slowed). A group step's first draw calls its Newton kernels from the start
    and its warm-up runs at normal priority (in the background, its first build was 0.6-1.9 s
    slower).
    Returns whether a helper of this process now compiles kernels (started now or by an
    earlier step): a first build on this machine, where the model's functions are worth
    sending to the compile helper ahead (``model/compile_helper.py``).
    """
    wanted = [name for name in modules if name not in _requested]
    _requested.update(wanted)
    if not wanted:
        return _warming()
    from numba.core import config

    from pymc_subsample.helper_processes import available_cores, helper_command, helper_environment

    if getattr(config, "DISABLE_JIT", False) or available_cores() < 2 or kernels_cached(wanted):
        return _warming()
    background = in_background and hasattr(os, "nice")
    try:
        helper = subprocess.Popen(
            helper_command(
                (f"import os\nos.nice({BACKGROUND_NICENESS})\n" if background else "")
                + f"from {__name__} import compile_kernels\ncompile_kernels({list(wanted)!r})\n"
            ),
            env=helper_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return _warming()
    if not _helpers:
        atexit.register(_stop_helpers)
    _helpers.append(helper)
    _helper_modules[helper.pid] = tuple(wanted)
    return True


def _stop_helpers() -> None:
    """Stop the helpers still compiling, at exit, and reap them.

    A script that builds a step and ends does not wait for them, and leaves no process
    behind.
    """
    from pymc_subsample.helper_processes import stop_process

    while _helpers:
        stop_process(_helpers.pop())


def wait_for_kernel_warm_up(timeout: float = WAIT_SECONDS) -> None:
    """Wait for the helpers, if any run, for at most ``timeout`` seconds; then go on.

    Rather than wait idle, this process first compiles the kernels a running helper has not
    reached (:func:`_compile_ahead_of`).
    """
    from pymc_subsample.helper_processes import stop_process

    for helper in _helpers:
        _compile_ahead_of(helper)
    deadline = time.monotonic() + timeout
    while _helpers:
        helper = _helpers.pop()
        _helper_modules.pop(helper.pid, None)
        try:
            helper.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            stop_process(helper)


def stop_kernel_warm_up(modules: Sequence[str]) -> None:
    """Stop the helpers compiling only kernels of ``modules``, which this process now has.

    The fused draw's driver compiles beside its helper instead of after it: the compile loads
    each kernel the helper has cached by the time it reaches it and compiles the others, so
    that one core compiles the driver while the other compiles kernels, where a wait for the
    helper left a core idle during the driver's compile (1.1 s on the Student-t regression of
    ``benchmarks/first_build.py``). Once the driver is compiled, what the helper still
    compiles is in this process and its cache already: it is stopped.
    """
    from pymc_subsample.helper_processes import stop_process

    for helper in list(_helpers):
        if set(_helper_modules[helper.pid]).issubset(modules):
            _helpers.remove(helper)
            _helper_modules.pop(helper.pid, None)
            stop_process(helper)


def _compile_ahead_of(helper: subprocess.Popen[bytes]) -> None:
    """Compile here the kernels ``helper`` has not reached, from its last one back.

    The helper compiles its kernels in order; this process takes them from the end, each not
    cached yet, until it meets one the helper has cached or the helper ends: the two share
    what is left, and at most the kernel where they meet is compiled by both (into the same
    cache). A background helper (``start_kernel_warm_up``) that got little of the cores while
    the build ran is not waited for with a core idle.
    """
    for dispatcher, signatures in reversed(_dispatchers(_helper_modules.get(helper.pid, ()))):
        if helper.poll() is not None or dispatcher_cached(dispatcher):
            return
        for signature in signatures:
            dispatcher.compile(signature)


def _warming() -> bool:
    """Whether a helper this process started may still be compiling the package's kernels."""
    return any(helper.poll() is None for helper in _helpers)

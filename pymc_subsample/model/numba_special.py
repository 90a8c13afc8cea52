"""Numba lowerings of special functions that PyTensor's Numba backend runs in object mode.

PyTensor compiles a scalar op for Numba from its own lowering or, failing that, from the
``scipy.special.cython_special`` function its ``nfunc_spec`` names. ``tri_gamma`` (the
trigamma function, the second derivative of ``gammaln``) has neither, so PyTensor runs it
through its Python ``perform`` method in Numba's object mode. Every Newton or Hessian graph of a
model with a free ``gammaln`` argument reads it, a Student-t likelihood's free ``nu`` for one
(``d2/dnu2 gammaln((nu + 1) / 2)``). Object mode there cost three ways: the graph is not
cacheable (each new process compiled it again: a Student-t regression's step took 11 s to
build with warm caches against NUTS's 1.7 s), its first compile took longer, and each row paid
a Python call.

:func:`register_numba_lowerings` registers a compiled lowering with PyTensor's own dispatch
(``register_funcify_and_cache_key``, the route of PyTensor's ``GammaLn``), so the graphs are
compiled and cached as any other. PyTensor's C backend has its own C code for the op and is
unaffected. The lowering is registered once per process, before the package compiles a graph
for Numba (``compiled.compile_function``); it applies to every graph compiled after it
in the process, where it gives the values SciPy's ``polygamma(1, x)`` gives (within 1e-13
relative for positive arguments, Numba's fastmath aside; near the poles of negative ones both
lose digits to ``sin(pi x)``; ``tests/test_compiled_functions.py``).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

__all__ = ["register_numba_lowerings", "trigamma"]

#: Below this argument the recurrence psi1(x) = psi1(x + 1) + 1 / x**2 moves x up first.
_ASYMPTOTIC_FROM = 8.0


def trigamma(x: float) -> float:
    """Return ``psi_1(x) = d^2/dx^2 log Gamma(x)``, as SciPy's ``polygamma(1, x)`` does.

    For ``x > 0``: the recurrence ``psi_1(x) = psi_1(x + 1) + 1 / x^2`` up to ``x >= 8``, then
    the asymptotic series ``1/x + 1/(2 x^2) + sum_k B_2k / x^(2k + 1)`` to ``B_14`` (Abramowitz
    and Stegun 6.4.12 and 6.4.6; its first omitted term is below 3e-14 relative at ``x = 8``).
    For ``x < 0`` not an integer, the reflection ``psi_1(1 - x) + psi_1(x) = pi^2 / sin^2(pi x)``
    (A&S 6.4.7); at zero, the negative integers (the poles) and ``-inf``, ``inf``; at ``nan``,
    ``nan``.
    Plain Python arithmetic with no calls of its own, so that Numba compiles it as it is.
    """
    reflected = 0.0
    sign = 1.0
    if x <= 0.0:
        if math.isinf(x) or x == math.floor(x):
            return math.inf
        reflected = math.pi / math.sin(math.pi * x)
        reflected *= reflected
        sign = -1.0
        x = 1.0 - x
    value = 0.0
    while x < _ASYMPTOTIC_FROM:
        value += 1.0 / x / x
        x += 1.0
    y = 1.0 / x / x
    # B_2 ... B_14 = 1/6, -1/30, 1/42, -1/30, 5/66, -691/2730, 7/6, by Horner's rule in y.
    series = 1.0 / 6.0 + y * (
        -1.0 / 30.0
        + y
        * (
            1.0 / 42.0
            + y * (-1.0 / 30.0 + y * (5.0 / 66.0 + y * (-691.0 / 2730.0 + y * 7.0 / 6.0)))
        )
    )
    value += 1.0 / x + 0.5 * y + y / x * series
    return reflected + sign * value


@cache
def register_numba_lowerings() -> bool:
    """Register the lowerings with PyTensor's Numba backend, once per process.

    Returns whether they were registered (False where this PyTensor has no Numba backend or
    registers lowerings another way).
    """
    try:
        from pytensor.link.numba.dispatch import basic as numba_basic
        from pytensor.link.numba.dispatch.basic import register_funcify_and_cache_key
        from pytensor.link.numba.dispatch.scalar import scalar_op_cache_key
        from pytensor.scalar.math import TriGamma
    except ImportError:  # pragma: no cover - a PyTensor without these parts
        return False

    @register_funcify_and_cache_key(TriGamma)
    def _numba_funcify_trigamma(op: Any, node: Any, **kwargs: Any) -> tuple[Any, str]:
        return numba_basic.numba_njit(trigamma), scalar_op_cache_key(
            op, lowering="pymc_subsample", version=1
        )

    return True

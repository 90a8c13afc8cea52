"""PyMC step methods: argument checks, per-chain state and stats around the kernels.

The step classes are imported at their first use (PEP 562, :func:`__getattr__`): the package's
``__init__`` imports them all, while a helper process that unpickles a job defined in one of
these modules (a group sweep's drivers, ``group_sweep_drivers.py``) imports that module and
what it needs, not every step (0.4 s of a hierarchy's cold build, in the helper's job that
ends it).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pymc_subsample.step_methods.austerity import AusterityMH
    from pymc_subsample.step_methods.barker import MinibatchBarkerMH
    from pymc_subsample.step_methods.gibbs import AusterityGibbs
    from pymc_subsample.step_methods.group_effects import GroupEffectsMH
    from pymc_subsample.step_methods.reversible_jump import ReversibleJumpMH
    from pymc_subsample.step_methods.sgfs import SGFS, PolynomialStepSize

# A literal list: static tools read the package's names from it and the imports above.
__all__ = [
    "SGFS",
    "AusterityGibbs",
    "AusterityMH",
    "GroupEffectsMH",
    "MinibatchBarkerMH",
    "PolynomialStepSize",
    "ReversibleJumpMH",
]

#: The module of each name of ``__all__``.
_MODULES = {
    "SGFS": "sgfs",
    "AusterityGibbs": "gibbs",
    "AusterityMH": "austerity",
    "GroupEffectsMH": "group_effects",
    "MinibatchBarkerMH": "barker",
    "PolynomialStepSize": "sgfs",
    "ReversibleJumpMH": "reversible_jump",
}


def __getattr__(name: str) -> Any:
    """Import a step class from its module at its first use."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

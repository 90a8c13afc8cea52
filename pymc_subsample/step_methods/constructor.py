"""How a step class is made from a test: its test built from the settings, its constructor.

``SubsampleMH.__init_subclass__`` gives a class made with ``test=`` a constructor whose
signature lists the test's settings (:func:`give_constructor`); the constructor builds the
test from the keyword arguments left over (:func:`build_test`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from pymc_subsample.step_methods.acceptance_tests import (
    AcceptanceTest,
    setting_parameters,
)

__all__ = ["build_test", "give_constructor"]


def build_test(step_class: type[Any], settings: dict[str, Any]) -> AcceptanceTest:
    """Build the step class's test from the constructor's remaining keyword arguments."""
    test = step_class.test_class
    if test is None:
        raise TypeError(
            f"{step_class.__name__} has no acceptance test: use pms.AusterityMH or "
            "pms.MinibatchBarkerMH, or make a step with class MyMH(pms.SubsampleMH, test=MyTest)."
        )
    known = {parameter.name for parameter in setting_parameters(test)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(
            f"{step_class.__name__} got unexpected keyword argument(s) {unknown}; its test "
            f"{test.__name__} takes {sorted(known) or 'none'}."
        )
    return test(**settings)


def give_constructor(
    step_class: type[Any], test: type[AcceptanceTest], base_init: Callable[..., None]
) -> None:
    """Give ``step_class`` a constructor whose signature names the test's settings too.

    The constructor is ``base_init`` (``SubsampleMH.__init__``); only its signature (what
    ``help``, IDEs and the API docs show) gains the test's keyword arguments after ``vars``.
    """

    def __init__(self: Any, vars: Any = None, **settings: Any) -> None:
        base_init(self, vars, **settings)

    base = list(inspect.signature(base_init).parameters.values())
    own = [p for p in base if p.kind is not inspect.Parameter.VAR_KEYWORD]
    signature = inspect.Signature([*own[:2], *setting_parameters(test), *own[2:]])
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{step_class.__qualname__}.__init__"
    __init__.__doc__ = f"Build the step; see :class:`{step_class.__name__}` for the arguments."
    setattr(step_class, "__init__", __init__)  # noqa: B010

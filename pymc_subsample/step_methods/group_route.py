"""The default steps' route for hierarchies: ``AusterityMH()`` on a hierarchy samples it by group.

``pms.AusterityMH()`` and ``pms.MinibatchBarkerMH()`` left at their defaults (no setting but
``vars``, the test's error and the model, generator, row dimension and compiler options) build
a :class:`~pymc_subsample.GroupEffectsMH` with their own test where the model, or the
variables in ``vars`` (a hierarchy's effects and hyperparameters beside PyMC's steps in a
compound step), is a hierarchy whose structure that step takes (``model/group_effects.py``),
and say so once on PyMC's logger; elsewhere, or with ``group_effects=False``, they are the
one-block steps they always were. ``docs/architecture.md``, "Group effects", "Chosen by the
defaults".
"""

from __future__ import annotations

import logging
from typing import Any

import pymc as pm

from pymc_subsample.kernels.group_tests import BARKER, T_TEST
from pymc_subsample.model.checks import discrete_names
from pymc_subsample.model.group_effects import NO_GROUP_INDEX
from pymc_subsample.model.grouped_rows import reads_a_group_index
from pymc_subsample.step_methods.arguments import free_value_vars, step_value_vars
from pymc_subsample.step_methods.group_effects import GroupEffectsMH, NotGroupEffects

__all__ = ["AUTO_GROUPS", "GROUP_ROUTE_MARK", "group_route"]

#: ``group_effects``'s default: take the group route where the model allows it.
AUTO_GROUPS = "auto"
#: Keyword the route leaves in a one-block step's pickled arguments, so that a worker
#: process rebuilding the step does not look for the route again.
GROUP_ROUTE_MARK = "_group_route_checked"
#: The settings each test's route passes on to GroupEffectsMH (besides the shared ones).
_TEST_SETTINGS = {T_TEST: ("error_tolerance",), BARKER: ("correction_sd",)}
_SHARED_SETTINGS = ("model", "rng", "obs_dim", "compile_kwargs", "fused")

#: PyMC's logger, where ``pm.sample`` says which step samples which variables.
_log = logging.getLogger("pymc")


def group_route(
    step_name: str, test: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> GroupEffectsMH | None:
    """Return the group step that ``step_name(*args, **kwargs)`` stands for, or None.

    Parameters
    ----------
    step_name : str
        The step class's name, as the user wrote it (in the message).
    test : {"t", "barker"}
        The step's test, which the group step's sampled decisions use.
    args, kwargs
        The step's arguments.

    Returns
    -------
    GroupEffectsMH or None
        None where the one-block step applies: arguments the group step does not take
        (``proposal``, ...), ``group_effects=False``, discrete variables among those sampled,
        or a model (or ``vars``) that is not a hierarchy the group step takes (then logged,
        with the reason).

    Raises
    ------
    TypeError, ValueError
        With ``group_effects=True``, where the route does not apply, and why.
    """
    choice = kwargs.get("group_effects", AUTO_GROUPS)
    if choice not in (AUTO_GROUPS, True, False):
        raise ValueError(f"group_effects must be 'auto', True or False, got {choice!r}.")
    if choice is False or kwargs.get(GROUP_ROUTE_MARK):
        return None
    allowed = {*_SHARED_SETTINGS, *_TEST_SETTINGS[test], "group_effects", "blocked"}
    others = sorted(set(kwargs) - allowed - {"vars"})
    if len(args) > 1:
        others.insert(0, "positional arguments after vars")
    chosen = args[0] if args else kwargs.get("vars")
    if kwargs.get("blocked", True) is not True:
        others.append("blocked")
    tolerance = kwargs.get("error_tolerance")
    if tolerance is not None and not isinstance(tolerance, int | float):
        others.append("error_tolerance (a design)")
    if others:
        if choice is True:
            raise TypeError(
                f"{step_name}(group_effects=True) samples the hierarchy group by group and "
                f"takes no {', '.join(others)}: leave them out, or pass group_effects=False."
            )
        return None
    model = pm.modelcontext(kwargs.get("model"))
    values = free_value_vars(model) if chosen is None else step_value_vars(model, chosen)
    discrete = discrete_names(values)
    if discrete:
        if choice is True:
            raise ValueError(
                f"{step_name}(group_effects=True) samples continuous variables, and the model "
                f"has discrete ones {discrete}: give them their own step in pm.sample(step=[...])."
            )
        return None
    observed = model.logp(vars=model.observed_RVs, sum=False) if model.observed_RVs else []
    if not reads_a_group_index(observed, values):  # no hierarchy: build nothing more
        if choice is True:
            raise NotGroupEffects(", ".join(repr(v.name) for v in values), NO_GROUP_INDEX)
        return None
    settings = {
        name: kwargs[name] for name in (*_SHARED_SETTINGS, *_TEST_SETTINGS[test]) if name in kwargs
    }
    try:
        step = GroupEffectsMH(chosen, test=test, **settings)
    except NotGroupEffects as refusal:
        if choice is True:
            raise
        if refusal.reason != NO_GROUP_INDEX:
            _say_one_block(step_name, refusal.names, refusal.reason)
        return None
    except (ValueError, TypeError, NotImplementedError) as error:
        # A model the group step cannot build on (the one-block step raises what is wrong
        # with the input itself, if anything is).
        if choice is True:
            raise
        _say_one_block(step_name, ", ".join(repr(v.name) for v in values), str(error))
        return None
    _log.info(
        "%s: the model is a hierarchy (%s); sampling it group by group with "
        "pms.GroupEffectsMH(test=%r): each group's effects tested on their own rows, the "
        "hyperparameters with no row. Pass group_effects=False to sample every variable in "
        "one block.",
        step_name,
        step.describe_groups(),
        test,
    )
    return step


def _say_one_block(step_name: str, names: str, reason: str) -> None:
    _log.info(
        "%s: the likelihood reads a variable through a group index, but the model cannot be "
        "sampled group by group (%s); sampling %s in one block.",
        step_name,
        reason,
        names,
    )

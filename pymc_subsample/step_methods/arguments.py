"""The steps' argument checks: each setting checked, with the fix in the message.

Functions of the values they check (no step): ``SubsampleMH``, ``AusterityGibbs`` and ``SGFS``
call them before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.util import get_value_vars_from_user_vars
from pymc.vartypes import discrete_types
from pytensor.compile.mode import Mode
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.imputation import imputed_value_vars
from pymc_subsample.step_methods.defaults import (
    AUTO,
)
from pymc_subsample.step_methods.proposal_parts import ProposalPart, proposal_names
from pymc_subsample.step_methods.proposal_parts.user import USER_PROPOSAL
from pymc_subsample.warnings import warn_user

__all__ = [
    "check_choice",
    "check_discrete_request",
    "check_int",
    "check_proposal",
    "check_scaling",
    "check_temperature",
    "free_value_vars",
    "step_value_vars",
    "warn_row_length_deterministics",
]


def step_value_vars(
    model: pm.Model | None,
    vars: Sequence[TensorVariable] | None,
    *,
    discrete: bool = False,
) -> list[TensorVariable]:
    """Return the value variables a step samples: ``vars``, else the model's continuous ones.

    With no ``vars`` a step takes what PyMC's NUTS takes: the continuous free variables
    (every free variable with ``discrete=True``, for a proposal function that moves discrete
    ones); ``pm.sample`` assigns its own steps to the rest, as it does beside NUTS. A model
    with no continuous variable gives its discrete ones, for the step to refuse with its fix.
    Imputed missing values (``y_unobserved``) are left to PyMC's own step by default.
    """
    model = pm.modelcontext(model)
    if vars is None:
        imputed = imputed_value_vars(model)
        values = [value for value in model.value_vars if value not in imputed]
        if discrete:
            return values
        continuous = [value for value in values if value.dtype not in discrete_types]
        return continuous or values
    return list(get_value_vars_from_user_vars(vars, model))


def free_value_vars(model: pm.Model | None) -> list[TensorVariable]:
    """Return every free value variable a step could sample, discrete ones included."""
    return step_value_vars(model, None, discrete=True)


def check_discrete_request(names: list[str], proposal: str, control_variate: str | None) -> None:
    """Refuse discrete variables unless a proposal function moves them, without control variate."""
    if proposal != USER_PROPOSAL:
        raise ValueError(
            f"Discrete variables {names} cannot be moved by proposal={proposal!r}, which is "
            "continuous. Pass only continuous variables in `vars` and let pm.sample assign "
            "another step to the discrete ones (pms.AusterityGibbs for pm.Bernoulli, "
            "pm.CategoricalGibbsMetropolis, pm.Metropolis), or use pms.ReversibleJumpMH for "
            "variable selection, or give a proposal function that keeps them on their support."
        )
    if control_variate not in (AUTO, None):
        raise ValueError(
            f"control_variate={control_variate!r} needs gradients, and the step samples discrete "
            f"variables {names}: pass control_variate=None."
        )


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """Return ``value`` as an int, or raise unless it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def check_proposal(proposal: Any, proposal_cov: ArrayLike | None) -> str:
    """Return the requested proposal's name, ``USER_PROPOSAL`` for a function."""
    if isinstance(proposal, str) or not callable(proposal):
        if not isinstance(proposal, str):
            raise TypeError(
                f"proposal must be one of {proposal_names()} or a function (rng, q, scaling) -> "
                f"(q_new, log_proposal_ratio), got {proposal!r}."
            )
        return str(check_choice("proposal", proposal, proposal_names()))
    if proposal_cov is not None:
        raise ValueError(
            "proposal_cov shapes the package's own proposals; a proposal function draws with "
            "its own spread: leave proposal_cov out (the function gets the tuned `scaling`)."
        )
    return USER_PROPOSAL


def check_choice(name: str, value: Any, options: tuple[Any, ...]) -> Any:
    """Return ``value``, or raise unless it is one of ``options``."""
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}.")
    return value


def check_temperature(temperature: float) -> float:
    """Return the temperature as a float, or raise unless it is positive and finite."""
    value = float(temperature)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(
            f"temperature must be a positive finite number, got {temperature!r}. It divides "
            "the log-likelihood: 1 is the untempered posterior."
        )
    return value


def check_scaling(scaling: float | None, n_params: int, part: ProposalPart) -> float:
    """Return the initial scale: ``scaling``, or the part's default; raise if invalid."""
    if scaling is None:
        return part.default_scaling(n_params)
    value = float(scaling)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"scaling must be a positive finite number, got {scaling!r}.")
    return value


def warn_row_length_deterministics(
    model: pm.Model, initial_point: dict[str, np.ndarray], n_rows: int
) -> None:
    """Warn about deterministics with one entry per row: PyMC evaluates them at every draw."""
    if not model.deterministics:
        return
    shape_graphs = model.replace_rvs_by_values([det.shape for det in model.deterministics])
    # PyTensor's Python linker: the rewrites reduce a shape to its inputs' shapes, and one
    # call needs no compile (a Numba compile here was 1 s of a cold first build).
    shapes = model.compile_fn(
        shape_graphs,
        inputs=model.value_vars,
        point_fn=True,
        on_unused_input="ignore",
        mode=Mode(linker="py", optimizer="fast_run"),
    )(initial_point)
    long = [
        det.name
        for det, shape in zip(model.deterministics, shapes, strict=True)
        if len(shape) > 0 and shape[0] == n_rows
    ]
    if long:
        warn_user(
            f"Deterministics {long} have one entry per row; PyMC evaluates them in full at every "
            "recorded draw, which costs O(N) whatever the step does. Leave them out with "
            "pm.sample(var_names=[...]) and compute them afterwards if needed.",
        )

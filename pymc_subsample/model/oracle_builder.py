"""Build a model's oracles: read the model once, compile lazily, check the rows.

:func:`build_oracles` is how every step and the reference search get their
:class:`~pymc_subsample.model.oracles.ModelOracles`. A model's functions are kept per
(variables, row dimension, compile options) and shared within a process, so each compiles
at most once (``docs/architecture.md``, "Model layer").
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytensor
from pymc.model import Model
from pymc.vartypes import discrete_types
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.checks import check_continuous
from pymc_subsample.model.compiled import collection_paused
from pymc_subsample.model.functions import ModelFunctions, initial_q, model_functions
from pymc_subsample.model.identification import warn_if_unidentified
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.model.parallel_pass import PARALLEL_ROWS
from pymc_subsample.model.row_data import DataTracker
from pymc_subsample.model.self_check import self_check

__all__ = ["build_oracles"]

#: Each model's functions, per (variables, row dimension, compile options); dropped with the
#: model. See :func:`build_oracles`.
_FUNCTIONS: weakref.WeakKeyDictionary[Model, dict[tuple[Any, ...], ModelFunctions]] = (
    weakref.WeakKeyDictionary()
)


def build_oracles(
    model: Model,
    vars: Sequence[TensorVariable],
    *,
    initial_point: dict[str, np.ndarray],
    obs_dim: str | None = None,
    compile_kwargs: dict[str, Any] | None = None,
    with_gradients: bool = False,
    proxy_order: int = 0,
    discrete: bool = False,
) -> ModelOracles:
    """Read the model once and return its per-row and prior functions for ``vars``.

    The functions compile at their first call and are shared, within a process, by every call
    with the same model, variables, ``obs_dim`` and ``compile_kwargs`` (a reference search
    and the steps built after it compile each function once). Each call gets its own view of
    the data (:meth:`ModelOracles.refresh_data`).

    Parameters
    ----------
    model : pymc.Model
        The user's model.
    vars : sequence of TensorVariable
        Value variables sampled by the step.
    initial_point : dict
        A point of the model (``model.initial_point()``), used for shapes and the self-check.
    obs_dim : str, optional
        Name of the row dimension; see :func:`pymc_subsample.model.rows.find_row_layout`.
    compile_kwargs : dict, optional
        Passed to PyTensor's compiler, e.g. ``{"mode": "NUMBA"}`` or ``{"mode": "JAX"}``.
    with_gradients : bool, default False
        The caller needs per-row gradients: refuse now if no row depends on ``vars``.
    proxy_order : {0, 1, 2}, default 0
        Order of the Taylor proxies of ``residual_ratio_rows`` (control variates), which
        implies ``with_gradients``.
    discrete : bool, default False
        Accept discrete variables in ``vars`` (a step whose moves keep them on their support:
        the binary Gibbs step, a reversible-jump proposal). ``q`` then holds their values as
        floats, cast back to the variables' dtypes inside the graphs; there are no gradients.

    Returns
    -------
    ModelOracles

    Raises
    ------
    ValueError
        If the per-row values on a few rows differ from the full model's (a reduction over rows
        inside the model), or the initial point has a non-finite log-density, or gradients are
        asked for variables that no row depends on.

    """
    if proxy_order not in (0, 1, 2):
        raise ValueError(f"proxy_order must be 0, 1 or 2, got {proxy_order!r}.")
    if not discrete:
        check_continuous(model, vars)
    elif with_gradients or proxy_order > 0:
        raise ValueError("Discrete variables have no gradients: with_gradients must be False.")
    key = (
        tuple(vars),
        tuple(model.basic_RVs),
        tuple(model.potentials),
        obs_dim,
        repr(sorted((compile_kwargs or {}).items())),
    )
    per_model = _FUNCTIONS.setdefault(model, {})
    functions = per_model.get(key)
    new = functions is None
    if functions is None:
        # No stack trace per node created (as in LazyFunction.compile): 0.05-0.1 s.
        with pytensor.config.change_flags(traceback__limit=0), collection_paused():
            functions = per_model[key] = model_functions(
                model, vars, initial_point, obs_dim, dict(compile_kwargs or {})
            )
    if (with_gradients or proxy_order > 0) and not functions.rows_depend_on_q:
        names = ", ".join(str(v.name) for v in vars)
        raise ValueError(
            f"No row of the likelihood depends on {names} (only the prior sees them), so there "
            "are no per-row gradients for SGFS, proposal='langevin' or control_variate. Sample "
            "them with pms.AusterityMH or pms.MinibatchBarkerMH, random-walk proposal and no "
            "control variate, in a compound step: pm.sample(step=[..., that_step]). Such a "
            "step reads one batch per draw."
        )
    q0 = initial_q(initial_point, vars)
    oracles = ModelOracles(
        initial_q=q0,
        _functions=functions,
        proxy_order=proxy_order,
        _data=DataTracker(functions.row_data, functions.data),
    )
    functions.expect_rows(oracles.n_rows)
    continuous = np.concatenate(
        [
            np.full(int(np.size(initial_point[str(v.name)])), v.dtype not in discrete_types)
            for v in vars
        ]
    )
    # From PARALLEL_ROWS rows, the start's finiteness check (a pass over every row) waits for
    # the first such pass the step makes anyway (ModelOracles.ensure_rows_finite).
    deferred = oracles.n_rows >= PARALLEL_ROWS
    self_check(oracles, functions.full_rows, q0, continuous, check_finite=not deferred)
    if deferred:
        oracles._tracker.finite_pending = q0
    if new and not discrete:
        warn_if_unidentified(functions.flat, oracles.score_rows, oracles.n_rows, q0)
    return oracles

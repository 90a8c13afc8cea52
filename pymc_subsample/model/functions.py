"""The compiled functions of one model and set of step variables (:class:`ModelFunctions`).

:func:`model_functions` reads the model's graphs once and wraps each function of ``q`` to
compile at its first call; ``oracles.py`` keeps them per model and gives each caller its own
view (``ModelOracles``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import numpy as np
import pytensor
import pytensor.tensor as pt
from pymc.model import Model
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.replace import clone_replace
from pytensor.graph.traversal import ancestors
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.model.checks import check_no_per_row_latents
from pymc_subsample.model.compiled import (
    SETUP_PASSES,
    GraphBuilder,
    LazyFunction,
    collection_paused,
)
from pymc_subsample.model.gradients import with_static_length
from pymc_subsample.model.graphs import (
    full_sums_graph,
    given,
    posterior_gradient_graph,
    prior_gradient_graph,
    prior_hessian_graph,
    remainder_gradient_graph,
    residual_graph,
    score_graph,
    search_graph,
    sums_graph,
)
from pymc_subsample.model.group_effects import GroupEffectFunctions, group_effect_functions
from pymc_subsample.model.grouped_sums import GroupedSums, grouped_sums
from pymc_subsample.model.identification import (
    flat_prior_coordinates,
    refuse_flat_priors_outside_the_likelihood,
)
from pymc_subsample.model.likelihood_space import LikelihoodSpace, likelihood_space
from pymc_subsample.model.row_data import shared_data
from pymc_subsample.model.rows import (
    RowLayout,
    find_row_layout,
    gather_missing_rows,
    row_loglik_graph,
)

__all__ = ["ModelFunctions", "initial_q", "model_functions"]


@dataclass(frozen=True)
class ModelFunctions:
    """The compiled functions of one model and set of step variables, shared by every user.

    Built once per (model, variables, row dimension, compile options) and process by
    :func:`build_oracles`; each function compiles at its first call (:class:`LazyFunction`).

    Attributes
    ----------
    layout : RowLayout
        Which observed variables were subsampled and which are evaluated in full.
    shared : dict
        Shared variables standing for model variables the step does not sample.
    rows_depend_on_q : bool
        Whether some row's log-likelihood depends on the sampled variables (per-row gradients
        exist only then).
    other_variables_in_rows : tuple of str
        Free variables the step does not sample that the row log-likelihood reads.
    """

    layout: RowLayout
    shared: dict[Variable, Variable]
    rows_depend_on_q: bool
    other_variables_in_rows: tuple[str, ...]
    prior: LazyFunction
    prior_ratio: LazyFunction
    setup_prior: LazyFunction
    setup_prior_ratio: LazyFunction
    rows: LazyFunction
    loglik_sum: LazyFunction
    ratio: LazyFunction
    full_rows: LazyFunction
    score: LazyFunction
    prior_grad: LazyFunction
    posterior_gradient: LazyFunction
    remainder_gradient: LazyFunction
    residual: dict[int, LazyFunction]
    sums: LazyFunction
    search: dict[bool, LazyFunction]
    full_sums: LazyFunction
    prior_hessian: LazyFunction
    row_data: tuple[Variable, ...]
    data: tuple[SharedVariable, ...]
    frozen: tuple[tuple[SharedVariable, SharedVariable], ...]
    flat: dict[str, np.ndarray]
    #: Builds (once, at first call) the functions in the likelihood's parameters; None when
    #: the rows' graph has no usable cut (``likelihood_parameters``).
    likelihood_space: Callable[[], LikelihoodSpace | None]
    #: The rows' sums by group (``grouped_sums.py``) for the reference search (rows at the
    #: live values of other variables) and for the control variates (at their frozen
    #: values); None where the rows read no table of parameters by a group index.
    grouped_search: Callable[[], GroupedSums | None]
    grouped_sums: Callable[[], GroupedSums | None]
    #: What a per-group update of the step's variables reads (``group_effects.py``), or why
    #: their conditional posterior does not factorise over groups.
    group_effects: Callable[[], GroupEffectFunctions | str]
    #: Reference points found on these functions, by data, start and settings (reference.py).
    references: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def expect_rows(self, n_rows: int) -> None:
        """Tell the set-up functions that read rows how many a build reads (``SETUP_PASSES``).

        Those whose interpreted passes would pass their budget compile at their first call
        (:meth:`LazyFunction.expect_rows`); the prior's Hessian reads no row.
        """
        for function in (
            self.rows,
            self.loglik_sum,
            self.sums,
            self.full_sums,
            *self.search.values(),
        ):
            function.expect_rows(SETUP_PASSES * n_rows)


def model_functions(
    model: Model,
    vars: Sequence[TensorVariable],
    initial_point: dict[str, np.ndarray],
    obs_dim: str | None,
    kwargs: dict[str, Any],
) -> ModelFunctions:
    """Read the model's graphs and wrap each function of ``q`` to compile at first use."""
    layout = find_row_layout(model, obs_dim)
    check_no_per_row_latents(model, layout.row_rvs, initial_point, layout.n_rows, layout.obs_dim)
    graph = row_loglik_graph(model, layout)
    prior = model.logp(vars=[*model.free_RVs, *model.potentials, *layout.full_rvs])
    # Missing values' density (a free variable's) reads only their rows, not all N.
    prior = gather_missing_rows(model, prior, layout)

    shared = make_shared_replacements(initial_point, vars, model)
    [rows_q, full_q, prior_q], q = join_nonshared_inputs(
        initial_point, [graph.rows_logp, graph.full_logp, prior], vars, shared
    )
    if q.dtype != "float64":
        # Only discrete variables: PyMC joins them into an integer vector; the steps pass q as
        # float64 (PyMC 5's compiled functions refuse it), so cast inside the graph instead.
        q_float = pt.vector("q", dtype="float64")
        [rows_q, full_q, prior_q] = clone_replace(
            [rows_q, full_q, prior_q], replace={q: q_float.astype(q.dtype)}
        )
        q = q_float
    # dims models leave q's length symbolic, and PyTensor 2.x's rewrites of the Hessians stall.
    q_size = sum(int(np.size(initial_point[str(v.name)])) for v in vars)
    [rows_q, full_q, prior_q], q = with_static_length([rows_q, full_q, prior_q], q, q_size)
    q_old = q.type("q_old")
    rows_q_old, prior_q_old = clone_replace([rows_q, prior_q], replace={q: q_old})

    row_inputs = list(graph.row_inputs)
    flat = flat_prior_coordinates(model, vars, initial_point)
    rows_ancestors = set(ancestors([rows_q]))
    depends_on_q = q in rows_ancestors
    if not depends_on_q:
        refuse_flat_priors_outside_the_likelihood(flat)
    others = tuple(
        str(model.values_to_rvs[value].name)
        for value, live in shared.items()
        if live in rows_ancestors and value in model.values_to_rvs
    )
    frozen = tuple(
        (live, pytensor.shared(np.array(live.get_value(), copy=True), name=f"{live.name}_frozen"))
        for live in shared.values()
        if isinstance(live, SharedVariable)
    )
    q_ref = q.type("q_ref")
    rows_ref = cast(TensorVariable, clone_replace(rows_q, replace={q: q_ref, **dict(frozen)}))

    def lazy(build: GraphBuilder) -> LazyFunction:
        return LazyFunction(build, kwargs)

    def setup(build: GraphBuilder) -> LazyFunction:
        # Called a few dozen times while a step is built: run on PyTensor's Python linker.
        return LazyFunction(build, kwargs, interpreted_first=True)

    def fixed(inputs: list[Variable], outputs: Any) -> LazyFunction:
        return lazy(partial(given, inputs, outputs))

    residual_inputs = (rows_q, rows_q_old, rows_ref, q, q_old, q_ref, [q, q_old], row_inputs)
    space = partial(
        likelihood_space, rows_q, rows_q_old, prior_q, q, q_old, row_inputs, frozen, kwargs
    )
    q0 = initial_q(initial_point, vars)
    return ModelFunctions(
        layout=layout,
        shared=shared,
        rows_depend_on_q=depends_on_q,
        other_variables_in_rows=others,
        # Compiled at its first call: a non-centred hierarchy's hyperparameter walk calls it
        # several times a draw from Python, where interpreted calls cost 0.1 ms or more each.
        prior=fixed([q], prior_q),
        prior_ratio=fixed([q, q_old], prior_q - prior_q_old),
        # The same two for the set-up's few dozen calls (the self-check, the reference search's
        # line search and Laplace check): interpreted, so that a cold set-up does not compile
        # a prior the draws never call from Python (a fused draw reads the prior ratio's Numba
        # kernel, compiled by the compile helper meanwhile): 0.7-0.9 s of a logistic
        # regression's cold build, 1.5 s of a 200-group hierarchy's.
        setup_prior=setup(partial(given, [q], prior_q)),
        setup_prior_ratio=setup(partial(given, [q, q_old], prior_q - prior_q_old)),
        # The self-check and the search line search call it a few dozen times; a draw that
        # reads it is fused (its Numba kernel) or compiles it after some 500 calls.
        rows=setup(partial(given, [q, *row_inputs], rows_q)),
        loglik_sum=setup(partial(given, [q, *row_inputs], [rows_q.sum()])),
        ratio=fixed([q, q_old, *row_inputs], rows_q - rows_q_old),
        # Called once, by the self-check only: PyTensor's Python linker skips the rewrites and
        # the JIT (0.3-0.5 s of set-up) and is fast enough for one vectorised pass.
        full_rows=LazyFunction(partial(given, [q], full_q), {**kwargs, "mode": "FAST_COMPILE"}),
        score=lazy(partial(score_graph, rows_q, q, row_inputs)),
        prior_grad=lazy(partial(prior_gradient_graph, prior_q, q)),
        posterior_gradient=lazy(partial(posterior_gradient_graph, prior_q, rows_q, q, row_inputs)),
        remainder_gradient=lazy(
            partial(remainder_gradient_graph, prior_q, rows_q, rows_ref, q, q_ref, row_inputs)
        ),
        residual={
            order: lazy(partial(residual_graph, *residual_inputs, order)) for order in (1, 2)
        },
        sums=setup(partial(sums_graph, rows_ref, q_ref, row_inputs)),
        search={
            hessian: setup(partial(search_graph, rows_q, q, row_inputs, hessian))
            for hessian in (False, True)
        },
        full_sums=setup(partial(full_sums_graph, rows_q, q, row_inputs)),
        prior_hessian=setup(partial(prior_hessian_graph, prior_q, q)),
        row_data=graph.row_data,
        data=shared_data([rows_q, prior_q, *graph.row_data], set(shared.values()) | set(shared)),
        frozen=frozen,
        flat=flat,
        likelihood_space=_OnFirstCall(partial(space, q0)),
        grouped_search=_OnFirstCall(partial(grouped_sums, rows_q, q, row_inputs, q0, kwargs)),
        grouped_sums=_OnFirstCall(partial(grouped_sums, rows_ref, q_ref, row_inputs, q0, kwargs)),
        group_effects=_OnFirstCall(
            partial(
                _group_effects,
                model,
                vars,
                shared,
                initial_point,
                rows_q,
                q,
                row_inputs,
                prior_q,
                frozen,
                q0,
                kwargs,
            )
        ),
    )


def _group_effects(
    model: Model,
    vars: Sequence[TensorVariable],
    shared: dict[Variable, Variable],
    initial_point: dict[str, np.ndarray],
    rows_q: TensorVariable,
    q: TensorVariable,
    row_inputs: list[TensorVariable],
    prior_q: TensorVariable,
    frozen: tuple[tuple[SharedVariable, SharedVariable], ...],
    q0: np.ndarray,
    kwargs: dict[str, Any],
) -> GroupEffectFunctions | str:
    """Build the group-effect functions (``group_effects.py``) with the step's prior terms."""
    terms = _step_prior_terms(model, vars, shared, q, initial_point)
    layout = [(str(v.name), tuple(np.shape(initial_point[str(v.name)]))) for v in vars]
    return group_effect_functions(rows_q, q, row_inputs, terms, prior_q, layout, frozen, q0, kwargs)


def _step_prior_terms(
    model: Model,
    vars: Sequence[TensorVariable],
    shared: dict[Variable, Variable],
    q: TensorVariable,
    initial_point: dict[str, np.ndarray],
) -> list[TensorVariable]:
    """Each step variable's elementwise log-density (with its Jacobian) as a graph of ``q``."""
    terms = model.logp(vars=[model.values_to_rvs[v] for v in vars], sum=False)
    replace: dict[Variable, Variable] = dict(shared)
    start = 0
    for value in vars:
        shape = tuple(np.shape(initial_point[str(value.name)]))
        size = int(np.prod(shape, dtype=int))
        replace[value] = q[start : start + size].reshape(shape).astype(value.dtype)
        start += size
    return cast(list[TensorVariable], clone_replace(terms, replace=replace))


class _OnFirstCall:
    """A value built at the first call and kept (and pickled with what was built)."""

    __slots__ = ("_build", "_built", "_value")

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._built = False
        self._value: Any = None

    def __call__(self) -> Any:
        if not self._built:
            with pytensor.config.change_flags(traceback__limit=0), collection_paused():
                self._value = self._build()
            self._built = True
        return self._value

    def __getstate__(self) -> tuple[Any, ...]:
        return (self._build, self._built, self._value)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._build, self._built, self._value = state


def initial_q(initial_point: dict[str, np.ndarray], vars: Sequence[TensorVariable]) -> np.ndarray:
    """Return the raveled ``q`` of ``vars`` at ``initial_point``, as float64."""
    return np.concatenate([np.ravel(initial_point[str(v.name)]) for v in vars]).astype("float64")

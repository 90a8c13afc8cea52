"""A group sweep in one compiled call (``docs/architecture.md``, "Group effects").

:class:`~pymc_subsample.GroupEffectsMH` sweeps a factor by proposing every group's new effects
(a Newton step on the factor's parts at the current and proposed effects) and then deciding
each group on its own rows (``kernels/group_effects.group_effects_sweep``): the groups read
whole, the stages of the sampled groups, the groups the test was not sure of, the exact
decisions. In Python that is a few calls of the model's compiled functions per sweep and some
fifty NumPy operations around them, most of a draw's time on a hierarchy of a hundred groups.
:class:`FusedGroupSweep` runs the same sweep as one Numba function per factor: generated
drivers (their source names the model's tables, data arrays and the shared variables its
functions read, cached on disk with PyTensor's Numba cache under a key made of theirs and the
kernels' source) call PyTensor's Numba kernels of the factor's parts and of the rows' change
and residual functions; the numeric parts are in ``kernels/fused_proposals.py`` (the
proposals) and ``kernels/fused_groups.py`` (the decisions).

Where the sweep cannot be fused, :func:`fused_group_obstacle` says why, and the step's
``draw_path`` attribute says which path its sweeps take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import stdtrit

from pymc_subsample.kernels import fused_groups, fused_proposals, group_newton
from pymc_subsample.kernels.group_effects import (
    DecisionCounts,
    GroupParts,
    GroupQuadratic,
    GroupRows,
    GroupSweepInfo,
)
from pymc_subsample.kernels.group_tests import BARKER, STAGE_GROWTH, GroupTest
from pymc_subsample.kernels.warm_up import wait_for_kernel_warm_up
from pymc_subsample.model.compiled import compile_driver

if TYPE_CHECKING:
    from pymc_subsample.model.compiled import NumbaKernel
    from pymc_subsample.model.group_effects import GroupEffectFunctions
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.group_expansion import GroupExpansion

__all__ = ["FusedGroupSweep", "fused_group_obstacle"]

#: The compiled parts of ``kernels/group_newton.py`` the sweep calls.
_NEWTON_KERNELS = (
    "cell_model_derivatives",
    "lapack_symmetric_eigen",
    "newton_mean",
    "newton_precision",
    "small_symmetric_eigen",
)
#: Bump when a generated driver's source changes (the key of its disk cache includes it).
DRIVER_VERSION = 5


def fused_group_obstacle(oracles: ModelOracles) -> str | None:
    """Why a group sweep cannot run as one compiled call; None if it can."""
    if oracles.rows_on_dask:
        return "the rows are read from Dask, fetched ahead of the draws in Python"
    return None


class FusedGroupSweep:
    """A group step's sweep of each factor as one compiled call.

    Parameters
    ----------
    functions : GroupEffectFunctions
        The step's functions (each factor's ``parts`` and the rows' ``change`` and
        ``residual`` are compiled for Numba).
    oracles : ModelOracles
        The rows' arrays, read at each call (``pm.set_data`` replaces them).
    expansion : GroupExpansion
        The control variate's reference point and tables, read at each call.
    test : GroupTest
        The test of every sampled decision.

    Raises
    ------
    RuntimeError
        If PyTensor's Numba backend cannot compile the model's functions.
    """

    def __init__(
        self,
        functions: GroupEffectFunctions,
        oracles: ModelOracles,
        expansion: GroupExpansion,
        test: GroupTest,
    ) -> None:
        self._oracles = oracles
        self._expansion = expansion
        self._test = test
        self._change = functions.change.numba_kernel()
        self._residual = functions.residual.numba_kernel()
        self._shapes: dict[str, Any] = {
            "n_tables": len(functions.cell_shapes),  # every gather's table
            "n_data": len(oracles.row_arrays()),
            "n_change_shared": len(self._change.implicit),
            "n_residual_shared": len(self._residual.implicit),
        }
        self._decisions_source = _source(_DECISIONS_TEMPLATE, **self._shapes, n_parts_shared=0)
        # The drivers call the package's kernels: load them from the cache the helper process
        # filled while this one built the step (kernels/warm_up.py), if one runs.
        wait_for_kernel_warm_up()
        self._decisions = compile_driver(
            self._decisions_source,
            "group_decisions",
            self._environment(),
            f"group_decisions_{DRIVER_VERSION}",
            [_kernel_source(), self._change.cache_key, self._residual.cache_key],
        )
        self._parts = [function.numba_kernel() for function in functions.parts]
        self._coordinates = [factor.coordinates for factor in functions.factors]
        self._sweeps = [
            self._sweep_driver(parts, factor.size)
            for parts, factor in zip(self._parts, functions.factors, strict=True)
        ]
        correction = test.correction
        self._correction = (
            (np.zeros(1), np.ones(1), 1.0)
            if correction is None
            else (
                np.asarray(correction.support, dtype=np.float64),
                np.asarray(correction.cumulative, dtype=np.float64),
                float(correction.sigma),
            )
        )
        self._critical: dict[tuple[int, int], np.ndarray] = {}
        # The last layout's test arguments after reference_q (they change with the layout).
        self._layout_arguments: tuple[GroupRows, int, tuple[Any, ...]] | None = None
        self._last_quadratic: tuple[GroupQuadratic, tuple[np.ndarray, ...]] | None = None
        #: Each factor's and number of sweeps' noise buffers, filled by the driver's calls.
        self._noise: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    def sweep(
        self,
        f: int,
        rows: GroupRows,
        batch_size: int,
        q: np.ndarray,
        quadratic: GroupQuadratic,
        noise: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        sweeps: int = 1,
    ) -> tuple[np.ndarray, GroupSweepInfo]:
        """Sweep factor ``f`` ``sweeps`` times from ``q`` in one call (``group_effects_sweep``).

        ``rows`` are the factor's rows by group, ``batch_size`` the rows of a first stage and
        ``quadratic`` its expansion, which holds for every sweep: it reads the other factors
        and the shared coefficients, which these sweeps leave as they are. ``noise`` is each
        sweep's normals, scales and ``log u``, ``(sweeps, G, k)``, ``(sweeps, G)`` and
        ``(sweeps, G)`` (:func:`~.fused_proposals.fill_sweep_noise`, drawn from Numba's
        generator inside the call where not given; where given, its first axis is the number
        of sweeps). The counts are summed over the sweeps.
        """
        coordinates = self._coordinates[f]
        draw_noise = noise is None
        buffers: tuple[np.ndarray, ...]
        if noise is None:  # filled by the call: buffers kept from call to call
            buffers = self._noise.get((f, sweeps)) or ()
            if not buffers:
                n_groups, k = coordinates.shape
                buffers = self._noise[f, sweeps] = (
                    np.empty((sweeps, n_groups, k)),
                    np.empty((sweeps, n_groups)),
                    np.empty((sweeps, n_groups)),
                )
        else:
            buffers = tuple(np.ascontiguousarray(values, dtype=np.float64) for values in noise)
        counts = np.zeros(len(fused_groups.COUNT_FIELDS) + 1, dtype=np.int64)
        result = self._sweeps[f](
            q,
            coordinates,
            *self._quadratic_arguments(quadratic),
            *buffers,
            draw_noise,
            *self._test_arguments(rows, batch_size),
            counts,
            *self._expansion.reference_tables,
            *self._oracles.row_arrays(),
            *self._parts[f].implicit_values(),
            *self._change.implicit_values(),
            *self._residual.implicit_values(),
        )
        n_data, n_full_groups, n_nonfinite, n_accepted = counts.tolist()
        return result, GroupSweepInfo(n_data, n_accepted, n_full_groups, n_nonfinite)

    def decisions(
        self, rows: GroupRows, batch_size: int, q: np.ndarray
    ) -> Callable[..., tuple[np.ndarray, DecisionCounts]]:
        """Return one factor's decisions alone (``kernels/group_effects.GroupDecisions``) at ``q``.

        ``rows`` are the factor's rows by group, ``batch_size`` the rows of a first stage.
        """

        def decide(
            old: GroupParts,
            new: GroupParts,
            rest: np.ndarray,
            known: np.ndarray,
            log_u: np.ndarray,
        ) -> tuple[np.ndarray, DecisionCounts]:
            accept = np.zeros(rest.size, dtype=np.bool_)
            counts = np.zeros(len(fused_groups.COUNT_FIELDS), dtype=np.int64)
            expansion = self._expansion
            arguments = self._test_arguments(rows, batch_size)
            self._decisions(
                q,
                *arguments[:5],
                np.ascontiguousarray(rest, dtype=np.float64),
                np.ascontiguousarray(known, dtype=np.float64),
                np.ascontiguousarray(log_u, dtype=np.float64),
                *arguments[5:],
                accept,
                counts,
                *old.tables,
                *new.tables,
                *expansion.reference_tables,
                *self._oracles.row_arrays(),
                *self._change.implicit_values(),
                *self._residual.implicit_values(),
            )
            return accept, DecisionCounts(*(int(count) for count in counts))

        return decide

    def _quadratic_arguments(self, quadratic: GroupQuadratic) -> tuple[np.ndarray, ...]:
        """Return the expansion's reference cells, gradient and Hessian as the drivers read them.

        Kept for the last expansion given: one factor's is the same object from draw to draw
        (``GroupExpansion.shifted``), until the expansion moves.
        """
        cached = self._last_quadratic
        if cached is None or cached[0] is not quadratic:
            arrays = tuple(
                np.ascontiguousarray(values, dtype=np.float64)
                for values in (quadratic.reference_cells, quadratic.gradient, quadratic.hessian)
            )
            cached = self._last_quadratic = (quadratic, arrays)
        return cached[1]

    def _test_arguments(self, rows: GroupRows, batch_size: int) -> tuple[Any, ...]:
        """Return the drivers' arguments from ``reference_q`` to the correction's sd."""
        cached = self._layout_arguments
        if cached is None or cached[0] is not rows or cached[1] != batch_size:
            test = self._test
            arguments = (
                rows.order,
                rows.starts,
                rows.sizes,
                rows.whole,
                batch_size,
                test.exact,
                fused_groups.BARKER if test.kind == BARKER else fused_groups.AUSTERITY,
                self._critical_values(rows, batch_size),
                *self._correction,
            )
            cached = self._layout_arguments = (rows, batch_size, arguments)
        return (self._expansion.reference_q, *cached[2])

    def _environment(self) -> dict[str, Any]:
        return {
            # Numba's cache rebuilds a function's environment by importing its module by name.
            "__name__": __name__,
            "np": np,
            "change": self._change.function,
            "residual": self._residual.function,
            **{name: getattr(fused_groups, name) for name in fused_groups.__all__},
            **{name: getattr(fused_proposals, name) for name in fused_proposals.__all__},
            **{name: getattr(group_newton, name) for name in _NEWTON_KERNELS},
        }

    def _sweep_driver(self, parts: NumbaKernel, k: int) -> Callable[..., Any]:
        """Generate, compile (or load from the cache) the sweep of a factor with ``parts``.

        ``k`` is the factor's effects per group: up to two, their Newton precisions are
        diagonalised in closed form, and LAPACK's ``eigh`` is not compiled.
        """
        eigen = "small_symmetric_eigen" if k <= 2 else "lapack_symmetric_eigen"
        source = _source(
            _SWEEP_TEMPLATE, **self._shapes, n_parts_shared=len(parts.implicit), eigen=eigen
        )
        return compile_driver(
            source,
            "group_sweep",
            {**self._environment(), "parts": parts.function, "decisions": self._decisions},
            f"group_sweep_{DRIVER_VERSION}",
            [
                _kernel_source(),
                self._decisions_source,
                parts.cache_key,
                self._change.cache_key,
                self._residual.cache_key,
            ],
        )

    def _critical_values(self, rows: GroupRows, batch_size: int) -> np.ndarray:
        """Return the t-test's ``t_{m-1}`` quantile ``1 - epsilon`` at each stage's count ``m``.

        ``stdtr(m - 1, -|t|) < epsilon`` (Korattikara et al. 2014, Algorithm 1, line 7) holds
        exactly when ``|t|`` exceeds it; computed once per layout of the rows.
        """
        largest = int(rows.sizes.max(initial=0))
        key = (largest, batch_size)
        values = self._critical.get(key)
        if values is None:
            counts = fused_groups.stage_rows(batch_size, max(largest, 1))
            epsilon = self._test.error_tolerance
            with np.errstate(all="ignore"):
                values = np.asarray(
                    stdtrit((counts - 1).astype(np.float64), 1.0 - epsilon), dtype=np.float64
                )
            self._critical[key] = values
        return values


_DECISIONS_TEMPLATE = """
def group_decisions(
    q, reference_q, order, starts, sizes, whole, rest, known, log_u, batch_size, exact_only,
    test, critical, correction_support, correction_cumulative, correction_sd, accept,
    counts{old}{new}{reference}{data}{change_shared}{residual_shared}
):
    n_groups = rest.size
    live = np.isfinite(rest)
    likelihood = np.zeros(n_groups)
    on_all_rows = whole & live
    read = 0
    rows, owners = rows_of_groups(order, starts, on_all_rows)
    if rows.size:
        values = change(q, q{old}{new}{gathered}{change_shared})[0]
        add_by_group(values, owners, likelihood)
        read += rows.size
    unsure = np.zeros(n_groups, dtype=np.bool_)
    active = np.flatnonzero(live & ~whole)
    if exact_only:  # the t-test at epsilon 0: every group on all its rows
        for g in active:
            unsure[g] = True
        active = active[:0]
    statistics = np.zeros((n_groups, 4))
    draw = batch_size
    stage = np.int64(0)  # a literal 0 compiled consume_group_stage twice (Literal[int](0))
    while active.size:
        rows = draw_group_rows(order, starts, active, draw)
        values = residual(q, q, reference_q{old}{new}{reference}{gathered}{residual_shared})[0]
        read += rows.size
        active = consume_group_stage(
            values, active, draw, stage, sizes, statistics, known, log_u, test, critical,
            correction_support, correction_cumulative, correction_sd, accept, unsure,
        )
        draw *= {growth}
        stage += 1
    rows, owners = rows_of_groups(order, starts, unsure)
    if rows.size:
        values = change(q, q{old}{new}{gathered}{change_shared})[0]
        add_by_group(values, owners, likelihood)
        read += rows.size
    finish_groups(likelihood, rest, log_u, on_all_rows | unsure, test, accept, counts)
    counts[0] = read
"""


_SWEEP_TEMPLATE = """
def group_sweep(
    q, coordinates, reference_cells, cell_gradient, cell_hessian, normals, scales, log_u,
    draw_noise, reference_q, order, starts, sizes, whole, batch_size, exact_only, test,
    critical, correction_support, correction_cumulative, correction_sd,
    counts{reference}{data}{parts_shared}{change_shared}{residual_shared}
):
    if draw_noise:
        fill_sweep_noise(normals, scales, log_u)
    every_group = np.ones(coordinates.shape[0], dtype=np.bool_)
    sweep_counts = np.zeros(counts.size, dtype=np.int64)
    # The parts, effects and Newton proposal at q; a sweep's accepted groups carry theirs at
    # the proposed effects into the next sweep (a group's parts read its own effects alone).
    raw = parts(q{parts_shared})
    old = ({contiguous_parts})
    x = effects_of(q, coordinates)
    gradient, hessian = cell_model_derivatives(
        old[1], old[2], old[3], old[4], reference_cells, cell_gradient, cell_hessian
    )
    precision, finite = newton_precision(gradient, hessian)
    values, vectors = {eigen}(precision)
    forward = (newton_mean(x, gradient, finite, values, vectors), vectors, values)
    for s in range(normals.shape[0]):
        x_new = newton_proposal(forward[0], forward[1], forward[2], normals[s], scales[s])
        raw = parts(with_effects(q, coordinates, x_new, every_group){parts_shared})
        new = ({contiguous_parts})
        gradient, hessian = cell_model_derivatives(
            new[1], new[2], new[3], new[4], reference_cells, cell_gradient, cell_hessian
        )
        precision, finite = newton_precision(gradient, hessian)
        values, vectors = {eigen}(precision)
        backward = (newton_mean(x_new, gradient, finite, values, vectors), vectors, values)
        rest, known = proposal_terms(
            x, x_new, old[0], new[0], forward, backward, reference_cells, cell_gradient,
            cell_hessian, old[3], new[3],
        )
        accept = np.zeros(rest.size, dtype=np.bool_)
        decisions(
            q, reference_q, order, starts, sizes, whole, rest, known, log_u[s], batch_size,
            exact_only, test, critical, correction_support, correction_cumulative,
            correction_sd, accept,
            sweep_counts{old_tables}{new_tables}{reference}{data}{change_shared}{residual_shared}
        )
        for field in range(3):
            counts[field] += sweep_counts[field]
        counts[3] += accept.sum()
        q = with_effects(q, coordinates, x_new, accept)
        if s + 1 < normals.shape[0]:
            old = ({old_taken})
            x = take_groups(x, x_new, accept)
            forward = (
                take_groups(forward[0], backward[0], accept),
                take_groups(forward[1], backward[1], accept),
                take_groups(forward[2], backward[2], accept),
            )
    return q
"""


def _source(
    template: str,
    *,
    n_tables: int,
    n_data: int,
    n_parts_shared: int,
    n_change_shared: int,
    n_residual_shared: int,
    eigen: str = "",
) -> str:
    """Write a driver's source for a model's numbers of tables, data arrays and shared inputs.

    ``eigen`` names the sweep's eigen-decomposition (``kernels/group_newton.py``).
    """

    def arguments(prefix: str, count: int) -> str:
        return "".join(f", {prefix}_{k}" for k in range(count))

    return template.format(
        old=arguments("old", n_tables),
        new=arguments("new", n_tables),
        old_tables="".join(f", old[{5 + k}]" for k in range(n_tables)),
        new_tables="".join(f", new[{5 + k}]" for k in range(n_tables)),
        contiguous_parts=_parts_tuple("np.ascontiguousarray(raw[{k}])", n_tables),
        old_taken=_parts_tuple("take_groups(old[{k}], new[{k}], accept)", n_tables),
        reference=arguments("reference", n_tables),
        data=arguments("data", n_data),
        parts_shared=arguments("parts_shared", n_parts_shared),
        change_shared=arguments("change_shared", n_change_shared),
        residual_shared=arguments("residual_shared", n_residual_shared),
        gathered="".join(f", data_{k}[rows]" for k in range(n_data)),
        growth=STAGE_GROWTH,
        eigen=eigen,
    )


def _parts_tuple(element: str, n_tables: int) -> str:
    """Write a tuple of ``element`` for each of a factor's parts (``GroupParts``, flattened)."""
    # Every field but the tables, then each table.
    n_parts = len(GroupParts._fields) - 1 + n_tables
    return "".join(element.format(k=k) + ", " for k in range(n_parts))


@cache
def _kernel_source() -> str:
    """Return the source of the kernels the drivers call, part of their cache keys."""
    return "\n".join(
        inspect.getsource(module) for module in (fused_groups, fused_proposals, group_newton)
    )

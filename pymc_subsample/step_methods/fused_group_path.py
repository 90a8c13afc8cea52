"""A group sweep's decisions in one compiled call (``docs/architecture.md``, "Group effects").

:class:`~pymc_subsample.GroupEffectsMH` proposes every group's new effects in NumPy and then
decides each group on its own rows (``kernels/group_effects.decide_on_rows``): the groups read
whole, the stages of the sampled groups, the groups the test was not sure of, the exact
decisions. In Python that is a few calls of the model's compiled row functions per draw and
some twenty NumPy operations around each, most of a draw's time on a hierarchy of a hundred
groups. :class:`FusedGroupDecisions` runs the same decisions as one Numba function: the
generated driver (its source names the model's tables, data arrays and the shared variables
its functions read, cached on disk with PyTensor's Numba cache under a key made of theirs and
the kernels' source) calls PyTensor's Numba kernels of the rows' change and residual
functions; the numeric parts are in ``kernels/fused_groups.py``.

Where the decisions cannot be fused, :func:`fused_group_obstacle` says why, and the step's
``draw_path`` attribute says which path its sweeps take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import stdtrit

from pymc_subsample.kernels import fused_groups
from pymc_subsample.kernels.group_effects import DecisionCounts, GroupParts, GroupRows
from pymc_subsample.kernels.group_tests import BARKER, STAGE_GROWTH, GroupTest
from pymc_subsample.model.compiled import compile_driver

if TYPE_CHECKING:
    from pymc_subsample.model.compiled import NumbaKernel
    from pymc_subsample.model.group_effects import GroupEffectFunctions
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.group_expansion import GroupExpansion

__all__ = ["FusedGroupDecisions", "fused_group_obstacle"]

#: Bump when the generated driver's source changes (the key of its disk cache includes it).
DRIVER_VERSION = 1


def fused_group_obstacle(oracles: ModelOracles) -> str | None:
    """Why a group sweep's decisions cannot run as one compiled call; None if they can."""
    if oracles.rows_on_dask:
        return "the rows are read from Dask, fetched ahead of the draws in Python"
    return None


class FusedGroupDecisions:
    """A group step's decisions as one compiled call per factor and sweep.

    Parameters
    ----------
    functions : GroupEffectFunctions
        The step's functions (their ``change`` and ``residual`` are compiled for Numba).
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
        n_tables = len(functions.cell_shapes)  # every gather's table
        self._driver = _driver(
            n_tables=n_tables,
            n_data=len(oracles.row_arrays()),
            n_change_shared=len(self._change.implicit),
            n_residual_shared=len(self._residual.implicit),
            change=self._change,
            residual=self._residual,
        )
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

    def decisions(
        self, rows: GroupRows, batch_size: int, q: np.ndarray
    ) -> Callable[..., tuple[np.ndarray, DecisionCounts]]:
        """Return one factor's decisions (``kernels/group_effects.GroupDecisions``) at ``q``.

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
            test = self._test
            self._driver(
                q,
                expansion.reference_q,
                rows.order,
                rows.starts,
                rows.sizes,
                rows.whole,
                np.ascontiguousarray(rest, dtype=np.float64),
                np.ascontiguousarray(known, dtype=np.float64),
                np.ascontiguousarray(log_u, dtype=np.float64),
                batch_size,
                test.exact,
                fused_groups.BARKER if test.kind == BARKER else fused_groups.AUSTERITY,
                self._critical_values(rows, batch_size),
                *self._correction,
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


_DRIVER_TEMPLATE = """
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
    stage = 0
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


def _driver(
    *,
    n_tables: int,
    n_data: int,
    n_change_shared: int,
    n_residual_shared: int,
    change: NumbaKernel,
    residual: NumbaKernel,
) -> Callable[..., Any]:
    """Generate, compile (or load from PyTensor's Numba cache) the model's decisions driver."""

    def arguments(prefix: str, count: int) -> str:
        return "".join(f", {prefix}_{k}" for k in range(count))

    source = _DRIVER_TEMPLATE.format(
        old=arguments("old", n_tables),
        new=arguments("new", n_tables),
        reference=arguments("reference", n_tables),
        data=arguments("data", n_data),
        change_shared=arguments("change_shared", n_change_shared),
        residual_shared=arguments("residual_shared", n_residual_shared),
        gathered="".join(f", data_{k}[rows]" for k in range(n_data)),
        growth=STAGE_GROWTH,
    )
    environment = {
        # Numba's cache rebuilds a function's environment by importing its module by name.
        "__name__": __name__,
        "np": np,
        "change": change.function,
        "residual": residual.function,
        **{name: getattr(fused_groups, name) for name in fused_groups.__all__},
    }
    return compile_driver(
        source,
        "group_decisions",
        environment,
        f"group_decisions_{DRIVER_VERSION}",
        [_kernel_source(), change.cache_key, residual.cache_key],
    )


@cache
def _kernel_source() -> str:
    """Return the source of ``kernels/fused_groups.py``, part of the driver's cache key."""
    return inspect.getsource(fused_groups)

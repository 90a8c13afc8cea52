"""A group sweep in one compiled call (``docs/architecture.md``, "Group effects").

:class:`~pymc_subsample.GroupEffectsMH` sweeps a factor by proposing every group's new effects
(a Newton step on the factor's parts at the current and proposed effects) and then deciding
each group on its own rows (``kernels/group_effects.group_effects_sweep``): the groups read
whole, the stages of the sampled groups, the groups the test was not sure of, the exact
decisions. In Python that is a few calls of the model's compiled functions per sweep and some
fifty NumPy operations around them, most of a draw's time on a hierarchy of a hundred groups.
:class:`FusedGroupSweep` runs the same sweep as one Numba function per factor: generated
drivers (``step_methods/group_sweep_drivers.py``) call PyTensor's Numba kernels of the
factor's parts and of the rows' change and residual functions; the numeric parts are in
``kernels/fused_proposals.py`` (the proposals) and ``kernels/fused_groups.py`` (the
decisions). At a chain's first draw the drivers are sent to the compile helper, which
compiles them into the cache while the chain's start moves the expansion
(:meth:`FusedGroupSweep.send_to_helper`).

Where the sweep cannot be fused, :func:`fused_group_obstacle` says why, and the step's
``draw_path`` attribute says which path its sweeps take.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import stdtrit

from pymc_subsample.kernels import fused_groups
from pymc_subsample.kernels.group_effects import (
    DecisionCounts,
    GroupParts,
    GroupQuadratic,
    GroupRows,
    GroupSweepInfo,
)
from pymc_subsample.kernels.group_tests import BARKER, GroupTest
from pymc_subsample.kernels.warm_up import dispatcher_cached, wait_for_kernel_warm_up
from pymc_subsample.model import compile_helper
from pymc_subsample.model.compiled import llvm_optimisation
from pymc_subsample.step_methods.group_sweep_drivers import (
    SWEEP_LLVM_OPT,
    GroupSweepDrivers,
    GroupSweepJob,
)

if TYPE_CHECKING:
    from pymc_subsample.model.group_effects import GroupEffectFunctions
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.group_expansion import GroupExpansion

__all__ = ["FusedGroupSweep", "fused_group_obstacle"]


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
        self._functions = functions
        self._oracles = oracles
        self._expansion = expansion
        self._test = test
        self._change = functions.change.numba_kernel()
        self._residual = functions.residual.numba_kernel()
        self._parts = [function.numba_kernel() for function in functions.parts]
        self._coordinates = [factor.coordinates for factor in functions.factors]
        #: What the drivers' source depends on besides the functions (``GroupSweepDrivers``).
        self._driver_shapes: dict[str, Any] = {
            "n_tables": len(functions.cell_shapes),
            "n_data": len(oracles.row_arrays()),
            "factor_sizes": tuple(factor.size for factor in functions.factors),
        }
        # Compiled (or loaded from the cache) at their first call (wait_for_helpers first).
        drivers = GroupSweepDrivers(
            self._change, self._residual, self._parts, **self._driver_shapes
        )
        self._decisions = drivers.decisions
        self._sweeps = drivers.sweeps
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
        #: The factors whose sweep has been called (compiled, or loaded from the cache).
        self._called: set[int] = set()

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
        arguments = self._sweep_arguments(
            f, rows, batch_size, q, quadratic, buffers, draw_noise, counts
        )
        if f in self._called:
            result = self._sweeps[f](*arguments)
        else:  # compiled here where the helper did not (group_sweep_drivers.SWEEP_LLVM_OPT)
            with llvm_optimisation(SWEEP_LLVM_OPT):
                result = self._sweeps[f](*arguments)
            self._called.add(f)
        n_data, n_full_groups, n_nonfinite, n_accepted = counts.tolist()
        return result, GroupSweepInfo(n_data, n_accepted, n_full_groups, n_nonfinite)

    def _sweep_arguments(
        self,
        f: int,
        rows: GroupRows,
        batch_size: int,
        q: np.ndarray,
        quadratic: GroupQuadratic,
        buffers: tuple[np.ndarray, ...],
        draw_noise: bool,
        counts: np.ndarray,
        reference: tuple[np.ndarray, Sequence[np.ndarray]] | None = None,
    ) -> tuple[Any, ...]:
        """Return factor ``f``'s sweep driver's arguments (``group_sweep_drivers.py``).

        ``reference`` is the expansion's point and tables, the expansion's own where None.
        """
        test_arguments = self._test_arguments(rows, batch_size)
        tables: Sequence[np.ndarray] = self._expansion.reference_tables
        if reference is not None:
            test_arguments = (reference[0], *test_arguments[1:])
            tables = reference[1]
        return (
            q,
            self._coordinates[f],
            *self._quadratic_arguments(quadratic),
            *buffers,
            draw_noise,
            *test_arguments,
            counts,
            *tables,
            *self._oracles.row_arrays(),
            *self._parts[f].implicit_values(),
            *self._change.implicit_values(),
            *self._residual.implicit_values(),
        )

    def send_to_helper(self, layouts: Sequence[GroupRows], batch_size: int, q: np.ndarray) -> int:
        """Have the compile helper compile the sweep drivers for these calls; return its job.

        Called at a chain's first draw, before its start moves the expansion, so that the
        helper compiles them meanwhile while this process interprets the rows' derivatives
        (on 1e6 rows both take about 5 s cold). Each factor's driver is compiled for the
        types of its call from ``q`` with ``layouts[f]`` and ``batch_size``, with an
        expansion at ``q`` (the factors' parts there: the types of the expansion's cells and
        tables, ``GroupExpansion.expand``), and loaded from the cache here
        (:meth:`wait_for_helpers`). 0 where none was sent (no helper).
        """
        from numba import typeof

        parts = [self._expansion.parts(f, q) for f in range(len(self._coordinates))]
        reference = (q.copy(), parts[0].tables)
        signatures = []
        for f, (coordinates, layout) in enumerate(zip(self._coordinates, layouts, strict=True)):
            n_groups, k = coordinates.shape
            buffers = (np.empty((1, n_groups, k)), np.empty((1, n_groups)), np.empty((1, n_groups)))
            counts = np.zeros(len(fused_groups.COUNT_FIELDS) + 1, dtype=np.int64)
            cells = parts[f].cells
            quadratic = GroupQuadratic(cells, cells, cells[..., None] * cells[..., None, :])
            arguments = self._sweep_arguments(
                f, layout, batch_size, q, quadratic, buffers, True, counts, reference
            )
            signatures.append(tuple(typeof(argument) for argument in arguments))
        functions = self._functions
        return compile_helper.submit_job(
            GroupSweepJob(
                change=functions.change.recipe,
                residual=functions.residual.recipe,
                parts=tuple(function.recipe for function in functions.parts),
                signatures=tuple(signatures),
                **self._driver_shapes,
            )
        )

    def drivers_cached(self) -> bool:
        """Whether Numba's cache holds the sweep drivers already (a model built before).

        A warm build loads them in a fraction of a second; a helper's job would start a
        helper process and build the model's functions there first (about 1 s).
        """
        return all(dispatcher_cached(sweep) for sweep in self._sweeps)

    def wait_for_helpers(self, job: int) -> None:
        """Wait for the helpers' code before the drivers' first call, to load it from the cache.

        The package's kernels (``kernels/warm_up.py``) and the drivers of the compile
        helper's ``job`` (:meth:`send_to_helper`; 0: none), if it has started them: this
        process takes back none of the helper's other jobs meanwhile.
        """
        wait_for_kernel_warm_up()
        compile_helper.wait_for(job, take_back=False)

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

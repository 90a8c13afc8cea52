"""A hierarchy's group sweep drivers: generated Numba source per model, compiled and cached.

:class:`~pymc_subsample.step_methods.fused_group_path.FusedGroupSweep` runs a factor's sweep as
one call of a generated driver (``docs/architecture.md``, "Group effects"). The drivers' source
names the model's tables, data arrays and the shared variables its functions read, and calls
PyTensor's Numba kernels of the factor's parts and of the rows' change and residual functions,
and the package's kernels (``kernels/fused_proposals.py``: the proposals;
``kernels/fused_groups.py``: the decisions; ``kernels/group_newton.py``). They are cached on
disk with PyTensor's Numba cache, under a key made of the kernels' keys and source.
:class:`GroupSweepDrivers` builds them the same way in the sampling process and in the compile
helper (:class:`GroupSweepJob`, ``model/compile_helper.py``), which compiles them ahead, so
that both write and read the same cache entries.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from pymc_subsample.kernels import fused_groups, fused_proposals, group_newton
from pymc_subsample.kernels.group_effects import GroupParts
from pymc_subsample.kernels.group_tests import STAGE_GROWTH
from pymc_subsample.model.compiled import LazyFunction, compile_driver, llvm_optimisation

if TYPE_CHECKING:
    from pymc_subsample.model.compiled import NumbaKernel

__all__ = ["DRIVER_VERSION", "SWEEP_LLVM_OPT", "GroupSweepDrivers", "GroupSweepJob"]

#: The compiled parts of ``kernels/group_newton.py`` the sweep calls.
_NEWTON_KERNELS = (
    "cell_model_derivatives",
    "lapack_symmetric_eigen",
    "newton_mean",
    "newton_precision",
    "small_symmetric_eigen",
)
#: Bump when a generated driver's source changes (the key of its disk cache includes it).
DRIVER_VERSION = 7
#: LLVM's optimisation level of a sweep's compile (``compiled.llvm_optimisation``). The sweep
#: links the kernels it calls, each optimised at Numba's default level at its own compile; at
#: level 1 the 200-group benchmark hierarchy's sweep compiled in 5.5 s against 6.3 s, at the
#: same time per draw (1.0 ms); at level 0 in 4.5 s, but 20% slower per draw.
SWEEP_LLVM_OPT = 1


class GroupSweepDrivers:
    """A model's generated group sweep drivers, compiled at their first call.

    Built the same way in the process that samples and in the compile helper
    (:class:`GroupSweepJob`), so that both write and read the same cache entries.

    Parameters
    ----------
    change, residual : NumbaKernel
        The rows' change and residual functions.
    parts : sequence of NumbaKernel
        Each factor's parts.
    n_tables, n_data : int
        The model's gathers' tables and row arrays.
    factor_sizes : sequence of int
        Each factor's effects per group: up to two, their Newton precisions are diagonalised
        in closed form, and LAPACK's ``eigh`` is not compiled.
    """

    def __init__(
        self,
        change: NumbaKernel,
        residual: NumbaKernel,
        parts: Sequence[NumbaKernel],
        *,
        n_tables: int,
        n_data: int,
        factor_sizes: Sequence[int],
    ) -> None:
        self._change = change
        self._residual = residual
        self._shapes: dict[str, Any] = {
            "n_tables": n_tables,  # every gather's table
            "n_data": n_data,
            "n_change_shared": len(change.implicit),
            "n_residual_shared": len(residual.implicit),
        }
        self._decisions_source = _source(_DECISIONS_TEMPLATE, **self._shapes, n_parts_shared=0)
        #: The decisions alone, called from Python (``FusedGroupSweep.decisions``).
        self.decisions = compile_driver(
            self._decisions_source,
            "group_decisions",
            self._environment(),
            f"group_decisions_{DRIVER_VERSION}",
            [_kernel_source(), change.cache_key, residual.cache_key],
        )
        #: Each factor's sweep.
        self.sweeps = [
            self._sweep_driver(kernel, size)
            for kernel, size in zip(parts, factor_sizes, strict=True)
        ]

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
        """Generate and return the sweep of a factor with ``parts`` and ``k`` effects a group."""
        eigen = "small_symmetric_eigen" if k <= 2 else "lapack_symmetric_eigen"
        source = _source(
            _SWEEP_TEMPLATE, **self._shapes, n_parts_shared=len(parts.implicit), eigen=eigen
        )
        return compile_driver(
            source,
            "group_sweep",
            {**self._environment(), "parts": parts.function, "decisions": self.decisions},
            f"group_sweep_{DRIVER_VERSION}",
            [
                _kernel_source(),
                self._decisions_source,
                parts.cache_key,
                self._change.cache_key,
                self._residual.cache_key,
            ],
        )


class GroupSweepJob(NamedTuple):
    """The compile helper's job of a model's sweep drivers (``FusedGroupSweep.send_to_helper``).

    The functions travel as their graph builders and compile arguments (never the data);
    the helper compiles them (or loads them from the cache), builds the drivers as the
    sampling process does (:class:`GroupSweepDrivers`) and compiles each factor's sweep for
    ``signatures[f]``, Numba's types of its call: the sweep's decisions are compiled with it.
    """

    change: tuple[Any, dict[str, Any]]
    residual: tuple[Any, dict[str, Any]]
    parts: tuple[tuple[Any, dict[str, Any]], ...]
    n_tables: int
    n_data: int
    factor_sizes: tuple[int, ...]
    signatures: tuple[tuple[Any, ...], ...]

    def run(self) -> None:
        """Compile the drivers into the cache (``compile_helper.CompileJob``)."""
        drivers = GroupSweepDrivers(
            LazyFunction(*self.change).numba_kernel(),
            LazyFunction(*self.residual).numba_kernel(),
            [LazyFunction(*recipe).numba_kernel() for recipe in self.parts],
            n_tables=self.n_tables,
            n_data=self.n_data,
            factor_sizes=self.factor_sizes,
        )
        with llvm_optimisation(SWEEP_LLVM_OPT):
            for sweep, signature in zip(drivers.sweeps, self.signatures, strict=True):
                cast(Any, sweep).compile(signature)


_DECISIONS_TEMPLATE = """
def group_decisions(
    q, reference_q, order, starts, sizes, whole, rest, known, log_u, batch_size, exact_only,
    test, critical, correction_support, correction_cumulative, correction_sd, accept,
    counts{old}{new}{reference}{data}{change_shared}{residual_shared}
):
    likelihood, on_all_rows, unsure, active, statistics = start_decisions(rest, whole, exact_only)
    read = 0
    rows, owners = rows_of_groups(order, starts, on_all_rows)
    if rows.size:
        values = change(q, q{old}{new}{gathered}{change_shared})[0]
        add_by_group(values, owners, likelihood)
        read += rows.size
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
    every_group = all_groups(coordinates.shape[0])
    sweep_counts = new_counts(counts)
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
        accept = no_groups(rest.size)
        decisions(
            q, reference_q, order, starts, sizes, whole, rest, known, log_u[s], batch_size,
            exact_only, test, critical, correction_support, correction_cumulative,
            correction_sd, accept,
            sweep_counts{old_tables}{new_tables}{reference}{data}{change_shared}{residual_shared}
        )
        add_sweep_counts(counts, sweep_counts, accept)
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

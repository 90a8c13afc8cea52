"""The shell every subsampling step shares: oracles, rows, RNG hooks and PyMC's point mapping.

``SubsampleStepBase`` compiles the model's per-row terms (``model/oracles.py``), maps PyMC's
points to the raveled vector and back, and starts each chain with its generator and the
model's current data; ``SubsampleMH`` (``base.py``), ``AusterityGibbs`` and ``SGFS`` build on it.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, PointType, RaveledVars, StatsType
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence
from pymc.util import RandomGenerator, get_random_generator
from pytensor.graph.basic import Variable
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.warm_up import start_kernel_warm_up
from pymc_subsample.model import compile_helper
from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.reference import funnel_explanation
from pymc_subsample.step_methods.arguments import (
    check_int,
    step_value_vars,
    warn_row_length_deterministics,
)
from pymc_subsample.step_methods.warning_relay import (
    WARNING_STAT,
    relay_if_worker,
    relayed_warnings,
)

__all__ = ["SubsampleStepBase"]


class SubsampleStepBase(ArrayStepShared):
    """A step on the raveled unconstrained vector that reads rows through compiled oracles.

    Every subclass's ``stats_dtypes_shapes`` gains the ``warning`` stat, which carries the
    warnings of a chain run in a worker process to the parent (``warning_relay``).
    """

    default_blocked = True
    #: The modules of package kernels (``kernels/warm_up.py``) its draws call, compiled in a
    #: helper process while the step is built.
    warm_kernels: ClassVar[tuple[str, ...]] = ()
    #: Whether the build calls them only at its end, so that the helper compiles them at a
    #: lower priority (``start_kernel_warm_up``'s ``in_background``).
    warm_kernels_late: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "stats_dtypes_shapes" in cls.__dict__:
            cls.stats_dtypes_shapes = {**cls.stats_dtypes_shapes, **WARNING_STAT}

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None,
        *,
        batch_size: int | None,
        obs_dim: str | None,
        model: pm.Model | None,
        rng: RandomGenerator,
        compile_kwargs: dict[str, Any] | None,
        blocked: bool,
        with_gradients: bool = False,
        proxy_order: int = 0,
        discrete: bool = False,
    ) -> None:
        model = pm.modelcontext(model)
        # A first build on this machine: the package's kernels compile in another process
        # meanwhile (kernels/warm_up.py), and the helper that compiles the model's functions
        # (model/compile_helper.py) starts now, to have imported PyTensor by its first job;
        # the subclasses then send it the draws' functions ahead.
        self._first_build = start_kernel_warm_up(
            self.warm_kernels, in_background=self.warm_kernels_late
        )
        if self._first_build:
            compile_helper.start_helper()
        vars = step_value_vars(model, vars)
        # None: the subclass chooses once it knows whether a control variate applies.
        self.batch_size = (
            0 if batch_size is None else check_int("batch_size", batch_size, minimum=2)
        )
        if compile_kwargs is not None and not isinstance(compile_kwargs, dict):
            raise TypeError(
                "compile_kwargs must be a dict such as {'mode': 'NUMBA'}, "
                f"got {compile_kwargs!r}."
            )
        initial_point = model.initial_point()
        self.oracles: ModelOracles = build_oracles(
            model,
            vars,
            initial_point=initial_point,
            obs_dim=obs_dim,
            compile_kwargs=compile_kwargs,
            with_gradients=with_gradients,
            proxy_order=proxy_order,
            discrete=discrete,
        )
        self._initial_point = initial_point
        #: Why the model has no mode in these variables (a centred hierarchy), or "".
        self._funnel = funnel_explanation(model, vars)
        #: Draws after tuning of the current chain, when PyMC says (PyMC 6's setup_chain).
        self._chain_draws: int | None = None
        #: The process that built the step; chains elsewhere relay their warnings to it.
        self._home_pid = os.getpid()
        warn_row_length_deterministics(model, initial_point, self.oracles.n_rows)
        super().__init__(vars, self.oracles.shared, blocked=blocked, rng=rng)

    @property
    def n_rows(self) -> int:
        """Number of rows N on the row axis."""
        return self.oracles.n_rows

    # PyMC 6 calls setup_chain, PyMC 5 calls set_rng, at the start of every chain (in the worker
    # process too): both seed the chain's generator and re-read data changed by pm.set_data.
    def setup_chain(self, rng: RandomGenerator, tune: int, draws: int) -> None:
        """Use the chain's random generator and the model's current data (PyMC 6 hook)."""
        relay_if_worker(self._home_pid)
        self.oracles.ensure_rows_finite()  # O(1) once checked (``ModelOracles``)
        self.rng = get_random_generator(rng, copy=False)
        self._chain_draws = draws
        self._sync_data()
        self._start_chain(tune=tune > 0)

    def set_rng(self, rng: RandomGenerator) -> None:
        """Use the chain's random generator and the model's current data (PyMC 5 hook)."""
        relay_if_worker(self._home_pid)
        self.oracles.ensure_rows_finite()  # O(1) once checked (``ModelOracles``)
        self.rng = get_random_generator(rng, copy=False)
        self._sync_data()
        # PyMC 5 does not say whether the chain tunes; its loops call stop_tuning() at draw
        # ``tune``, at once when tune=0, and the sequential loop sets ``tune`` after this call.
        self._start_chain(tune=True)

    def step(self, point: PointType) -> tuple[PointType, StatsType]:
        """Take a step; the ``warning`` stat carries a worker process's warnings to the parent.

        The same mapping as PyMC's ``ArrayStepShared.step`` (``DictToArrayBijection``), made
        cheaper for the draw it wraps (about 3 us of a 30 us draw): a single variable is
        raveled without a copy and the new point's arrays are views of the step's result
        (cast only where the variable's dtype differs). Nothing here or in ``astep`` writes
        into the arrays it is given.
        """
        own = point
        if self.shared:
            for name, shared_var in self.shared.items():
                shared_var.set_value(point[name], borrow=True)
            own = {name: point[name] for name in self.var_names}
        if len(own) == 1:
            ((name, value),) = own.items()
            value = np.asarray(value)
            q = RaveledVars(value.ravel(), ((name, value.shape, value.size, value.dtype),))
        else:
            q = DictToArrayBijection.map(own)
        moved, stats = self.astep(q)
        new_point = point.copy() if self.shared else {}
        data, start = moved.data, 0
        for name, shape, size, dtype in moved.point_map_info:
            value = data[start : start + size].reshape(shape)
            new_point[name] = value if value.dtype == dtype else value.astype(dtype)
            start += size
        stats[0]["warning"] = relayed_warnings()
        return new_point, stats

    def _sync_data(self) -> None:
        if self.oracles.refresh_data():
            self._rebuild_for_data()

    def _rebuild_for_data(self) -> None:
        """Rebuild what depends on the data after ``pm.set_data`` (a subclass extends this)."""

    def _start_chain(self, tune: bool) -> None:
        """Start a chain from the step's initial tuning state, as a fresh step would.

        PyMC's sequential loop calls ``reset_tuning`` after ``setup_chain``, but its parallel
        path does not: a step reused after an earlier ``pm.sample`` (``tune`` off, scale
        adapted, warnings given) would otherwise be pickled into the workers in that state and
        sample a new chain without tuning.
        """
        self.tune = tune
        self.reset_tuning()

    @abstractmethod
    def reset_tuning(self) -> None:
        """Return to the step's state before any tuning, for a new chain."""

    @staticmethod
    def competence(var: Variable, has_grad: bool) -> Competence:
        """Never assigned automatically: the step is approximate and must be chosen knowingly."""
        return Competence.INCOMPATIBLE

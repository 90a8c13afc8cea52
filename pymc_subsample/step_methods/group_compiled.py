"""Which parts of a group sweep run compiled, built when first used (``docs/architecture.md``).

:class:`CompiledSweepParts` is a mixin of :class:`~pymc_subsample.GroupEffectsMH`: it chooses
the step's ``draw_path`` and builds, at a chain's first sweep, the fused sweep
(``step_methods/fused_group_path.py``) and the compiled hyperparameter walk
(``step_methods/fused_hyper_walk.py``), keeping them out of the pickles sent to worker
processes (a worker loads them from the disk cache). It reads the members it declares and
nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pymc_subsample.kernels.group_tests import GroupTest
from pymc_subsample.kernels.hyper_walk import HyperWalk
from pymc_subsample.model import compile_helper
from pymc_subsample.step_methods.fused_group_path import FusedGroupSweep, fused_group_obstacle
from pymc_subsample.step_methods.fused_hyper_walk import CompiledHyperWalk
from pymc_subsample.step_methods.fused_path import seed_fused_draws

if TYPE_CHECKING:
    from pymc_subsample.kernels.group_effects import GroupRows
    from pymc_subsample.model.group_effects import GroupEffectFunctions
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.group_expansion import GroupExpansion

__all__ = ["CompiledSweepParts"]


class CompiledSweepParts:
    """The group step's compiled sweep and hyperparameter walk, and its ``draw_path``."""

    # What the mixin reads of the step.
    functions: GroupEffectFunctions
    oracles: ModelOracles
    expansion: GroupExpansion
    test: GroupTest
    rng: np.random.Generator
    hyperparameters: HyperWalk | None
    layouts: list[GroupRows]
    batch_size: int

    def _choose_compiled_paths(self, fused: bool) -> None:
        """Set ``draw_path`` from the ``fused`` argument and the rows; nothing is built yet."""
        obstacle = "fused=False" if not fused else fused_group_obstacle(self.oracles)
        #: "fused" where each factor's sweep is one compiled call, else "python: " and why
        #: (``step_methods/fused_group_path.py``).
        self.draw_path = "fused" if obstacle is None else f"python: {obstacle}"
        self._fused: FusedGroupSweep | None = None
        #: Whether the fused sweep has waited for the helpers' code (its first call is next).
        self._fused_ready = False
        #: The compile helper's job on the fused sweep's drivers (0: none).
        self._sweep_job = 0
        self._seed_fused = True
        self._walk: CompiledHyperWalk | None = None
        #: Whether the hyperparameters' walk may be compiled (False once it failed to).
        self._walk_compiles = self.hyperparameters is not None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the compiled code (a worker loads it from the disk cache)."""
        state = self.__dict__.copy()
        state["_fused"] = state["_walk"] = None
        state["_fused_ready"], state["_sweep_job"] = False, 0  # the helper's job is this process's
        return state

    def _compiled_walk(self) -> CompiledHyperWalk | None:
        """Return the hyperparameters' walk as one compiled call, or None to walk in Python.

        Compiled with the sweep (``draw_path == "fused"``), and used by
        ``_move_hyperparameters`` where the target is the prior itself (a centred hierarchy);
        where PyTensor's Numba backend cannot compile the prior, the walk stays in Python.
        """
        if self.draw_path != "fused" or not self._walk_compiles:
            return None
        if self._walk is None:
            try:
                self._walk = CompiledHyperWalk(
                    self.oracles.numba_prior(), self.functions.free_coordinates
                )
            except Exception:
                self._walk_compiles = False
                return None
        return self._walk

    def _built_fused_sweep(self) -> FusedGroupSweep | None:
        """Return the fused sweep where the step uses it, built (not compiled) at the first call.

        Where PyTensor's Numba backend cannot compile the model's row functions, the step
        decides in Python from then on, and ``draw_path`` says why.
        """
        if self.draw_path != "fused":
            return None
        if self._fused is None:
            try:
                self._fused = FusedGroupSweep(
                    self.functions, self.oracles, self.expansion, self.test
                )
            except Exception as error:
                self.draw_path = (
                    f"python: PyTensor's Numba backend could not compile the sweep ({error})"
                )
                return None
        return self._fused

    def _compile_sweep_ahead(self, q: np.ndarray) -> None:
        """Send the fused sweep's drivers to the compile helper, before their first call.

        Called at a chain's first draw from ``q``, before its start moves the expansion: the
        helper compiles them meanwhile (``FusedGroupSweep.send_to_helper``). Not where the
        cache holds them already (a warm build loads them here).
        """
        if self._fused_ready or self._sweep_job or not compile_helper.helper_available():
            return
        fused = self._built_fused_sweep()
        if fused is not None and not fused.drivers_cached():
            self._sweep_job = fused.send_to_helper(self.layouts, self.batch_size, q)

    def _fused_sweep(self, q: np.ndarray) -> FusedGroupSweep | None:
        """Return the fused sweep where the step uses it, ready for its call from ``q`` (or None).

        Built at the first call (:meth:`_built_fused_sweep`), which first waits for the
        helpers' code. Where the helper compiles the drivers, this process first compiles
        the prior, which the draw's moves of the hyperparameters and shared coefficients
        after the sweep evaluate from Python (a cold compile of a second or more, otherwise
        paid after the wait). At a chain's first sweep
        Numba's generator is seeded from the chain's, so that a chain is reproducible.
        """
        fused = self._built_fused_sweep()
        if fused is None:
            return None
        if not self._fused_ready:
            functions = self.functions
            if self._sweep_job and (
                functions.free_coordinates.size or functions.direct_coordinates.size
            ):
                self.oracles.log_prior(q)
            fused.wait_for_helpers(self._sweep_job)
            self._fused_ready, self._sweep_job = True, 0
        if self._seed_fused:
            seed_fused_draws(self.rng)
            self._seed_fused = False
        return fused

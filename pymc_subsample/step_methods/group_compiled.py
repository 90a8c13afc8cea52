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
from pymc_subsample.step_methods.fused_group_path import FusedGroupSweep, fused_group_obstacle
from pymc_subsample.step_methods.fused_hyper_walk import CompiledHyperWalk
from pymc_subsample.step_methods.fused_path import seed_fused_draws

if TYPE_CHECKING:
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

    def _choose_compiled_paths(self, fused: bool) -> None:
        """Set ``draw_path`` from the ``fused`` argument and the rows; nothing is built yet."""
        obstacle = "fused=False" if not fused else fused_group_obstacle(self.oracles)
        #: "fused" where each factor's sweep is one compiled call, else "python: " and why
        #: (``step_methods/fused_group_path.py``).
        self.draw_path = "fused" if obstacle is None else f"python: {obstacle}"
        self._fused: FusedGroupSweep | None = None
        self._seed_fused = True
        self._walk: CompiledHyperWalk | None = None
        #: Whether the hyperparameters' walk may be compiled (False once it failed to).
        self._walk_compiles = self.hyperparameters is not None

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the compiled code (a worker loads it from the disk cache)."""
        state = self.__dict__.copy()
        state["_fused"] = state["_walk"] = None
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

    def _fused_sweep(self) -> FusedGroupSweep | None:
        """Return the fused sweep where the step uses it, built at the first call.

        Where PyTensor's Numba backend cannot compile the model's row functions, the step
        decides in Python from then on, and ``draw_path`` says why. At a chain's first sweep
        Numba's generator is seeded from the chain's, so that a chain is reproducible.
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
        if self._seed_fused:
            seed_fused_draws(self.rng)
            self._seed_fused = False
        return self._fused

"""The moves of a group sweep beside the groups' own: ridges, hyperparameters, shared coefficients.

:class:`~pymc_subsample.GroupEffectsMH` updates a hierarchy in a Gibbs sweep
(``docs/architecture.md``, "Group effects"): every group's effects on their own rows
(``kernels/group_effects.py``), then the three moves here, each a Metropolis-Hastings kernel
(the first two exact, the third decided by a subsampled test, as the groups' own are):

- :meth:`GroupMoves._move_ridges`: exact moves along each intercept ridge (a shared
  coefficient up, a factor's cells down), which change no row;
- :meth:`GroupMoves._move_hyperparameters`: exact moves of the coordinates no row reads
  directly, the groups' cells held fixed (``kernels/hyper_walk.py``);
- :meth:`GroupMoves._move_shared`: one move of the coefficients every row reads, decided on a
  stratified sample of rows (``kernels/stratified.py``);

and :meth:`GroupMoves._row_terms`, the rows' log-likelihood changes (or their residuals from
the control variate) that the group sweep's tests and the shared move's read.

:class:`GroupMoves` is a mixin of the step: it reads the members it declares and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from pymc_subsample.kernels.austerity import AusterityDecision
from pymc_subsample.kernels.barker import BarkerDecision
from pymc_subsample.kernels.group_effects import (
    GroupParts,
    SharedMoveInfo,
    draw_proposal,
    newton_gaussian,
    proposal_log_density,
)
from pymc_subsample.kernels.group_tests import GroupTest
from pymc_subsample.kernels.hyper_walk import HyperWalk, HyperWalkInfo
from pymc_subsample.kernels.stratified import (
    Strata,
    resolution_for,
    stratified_barker_test,
    stratified_mh_test,
)

if TYPE_CHECKING:
    from pymc_subsample.model.group_effects import GroupEffectFunctions, GroupFactor
    from pymc_subsample.model.oracles import ModelOracles
    from pymc_subsample.step_methods.fused_hyper_walk import CompiledHyperWalk
    from pymc_subsample.step_methods.group_expansion import GroupExpansion

__all__ = ["GroupMoves"]


class GroupMoves:
    """The ridge, hyperparameter and shared moves of :class:`GroupEffectsMH`, and its row terms."""

    # What the moves read of the step.
    expansion: GroupExpansion
    functions: GroupEffectFunctions
    oracles: ModelOracles
    rng: np.random.Generator
    tune: bool
    test: GroupTest
    error_tolerance: float
    batch_size: int
    strata: Strata | None
    hyperparameters: HyperWalk | None
    _ridge_walks: list[HyperWalk]
    #: The hyperparameters' walk as one compiled call where the step has one, else None.
    _compiled_walk: Callable[[], CompiledHyperWalk | None]  # (step_methods/group_compiled.py)

    @property
    def factors(self) -> tuple[GroupFactor, ...]:
        """The grouping factors whose effects the step updates."""
        return self.functions.factors

    def _row_terms(
        self,
        f: int | None,
        q: np.ndarray,
        q_new: np.ndarray,
        old: GroupParts,
        new: GroupParts,
        rows: np.ndarray,
        residual: bool,
    ) -> np.ndarray:
        """Return the rows' log-likelihood differences, or with ``residual`` their residuals.

        ``f`` is the factor whose effects moved, or None for a move of the shared coefficients.
        """
        arrays = self.oracles.rows_at(rows)
        with np.errstate(invalid="ignore", over="ignore"):
            if not residual:
                return np.asarray(
                    self.functions.change(q, q_new, *old.tables, *new.tables, *arrays)
                )
            return np.asarray(
                self.functions.residual(
                    q,
                    q_new,
                    self.expansion.reference_q,
                    *old.tables,
                    *new.tables,
                    *self.expansion.reference_tables,
                    *arrays,
                )
            )

    def _move_ridges(self, q: np.ndarray) -> np.ndarray:
        """Exact moves along each ridge: a shared coefficient up, a factor's cells down.

        Where the rows read a shared coefficient ``v_d`` and a factor's cell entry ``c_j`` only
        through ``v_d + c_j`` (an intercept and random intercepts), moving ``v_d`` by ``delta``
        and every group's ``c_j`` by ``-delta`` leaves every row unchanged, so the move's
        acceptance is the prior's ratio alone; the blocked updates cross that ridge only by
        steps of the conditional sds. The effects follow the cells through the factor's
        Jacobian (a translation, volume-preserving); a move whose cells do not follow exactly
        (a table not affine in the effects) is rejected.
        """
        for (d, f, j), walk in zip(self.expansion.ridges, self._ridge_walks, strict=True):
            q = self._ridge_move(q, d, f, j, walk)
        return q

    def _ridge_move(self, q: np.ndarray, d: int, f: int, j: int, walk: HyperWalk) -> np.ndarray:
        """One ridge's random-walk moves (``_move_ridges``)."""
        coordinates = self.factors[f].coordinates
        shared = self.functions.direct_coordinates[d]
        parts = self.expansion.parts(f, q)
        unit = np.zeros(parts.cells.shape[1])
        unit[j] = 1.0
        try:
            direction = np.linalg.solve(
                parts.jacobian, np.broadcast_to(unit, parts.cells.shape)[..., None]
            )[..., 0]
        except np.linalg.LinAlgError:
            return q

        def moved(delta: np.ndarray) -> np.ndarray:
            point = q.copy()
            point[shared] += float(delta[0])
            point[coordinates] = q[coordinates] - float(delta[0]) * direction
            return point

        def log_target(delta: np.ndarray) -> float:
            point = moved(delta)
            expected = parts.cells.copy()
            expected[:, j] -= float(delta[0])
            # np.allclose(rtol=atol=1e-9) written out: its generality cost 30 us a move.
            gap = np.abs(self.expansion.parts(f, point).cells - expected)
            if not np.all(gap <= 1e-9 * (1.0 + np.abs(expected))):
                return -np.inf
            return self.oracles.log_prior(point)

        delta, _ = walk(self.rng, np.zeros(1), log_target, self.tune)
        return moved(delta)

    def _move_shared(self, q: np.ndarray) -> tuple[np.ndarray, SharedMoveInfo]:
        """One Metropolis-Hastings move of the shared coefficients, the groups held.

        A Student-t Newton proposal on the quadratic model (``_shared_model``), decided on
        every row's residual by the stratified test of ``kernels/stratified.py`` (the first
        factor's groups by size class as strata), exact on every row where it is not. The
        test also decides once its estimate's standard error is at most
        ``resolution_for(error_tolerance)``, so that a draw whose ``u`` falls near the
        acceptance ratio does not read all N rows (the error this adds to the acceptance
        probability is at most ``error_tolerance``; ``kernels/stratified.py``).
        """
        direct = self.functions.direct_coordinates
        x = q[direct][None, :]
        mean, vectors, values = newton_gaussian(
            x, *(a[None] for a in self.expansion.shared_model(q))
        )
        x_new = draw_proposal(self.rng, mean, vectors, values)
        if not np.all(np.isfinite(x_new)):
            return q, SharedMoveInfo(0, False, False)
        q_new = q.copy()
        q_new[direct] = x_new[0]
        back = newton_gaussian(x_new, *(a[None] for a in self.expansion.shared_model(q_new)))
        with np.errstate(invalid="ignore", over="ignore"):
            rest = (
                self.oracles.log_prior(q_new)
                - self.oracles.log_prior(q)
                + float(proposal_log_density(x, *back)[0])
                - float(proposal_log_density(x_new, mean, vectors, values)[0])
            )
        if not np.isfinite(rest):
            return q, SharedMoveInfo(0, False, False)
        gradient, hessian = self.expansion.shared
        old = q[direct] - self.expansion.reference_q[direct]
        new = q_new[direct] - self.expansion.reference_q[direct]
        known = float(gradient @ (new - old) + 0.5 * (new @ hessian @ new - old @ hessian @ old))
        for f, quadratic in enumerate(self.expansion.quadratics or []):
            moved = self.expansion.parts(f, q).cells - quadratic.reference_cells
            known += float(np.einsum("gcd,gc->d", self.expansion.crosses[f], moved) @ (new - old))
        assert self.strata is not None
        parts = self.expansion.parts(0, q)

        # The rows' residuals sum with the known part to the exact change, so the residuals
        # are the test's values and the known part joins the prior and proposal ratio.
        def residuals(rows: np.ndarray) -> np.ndarray:
            return self._row_terms(None, q, q_new, parts, parts, rows, True)

        decision: AusterityDecision | BarkerDecision
        if self.test.correction is None:
            decision = stratified_mh_test(
                self.rng,
                residuals,
                self.strata,
                rest + known,
                self.error_tolerance,
                self.batch_size,
                resolution=resolution_for(self.error_tolerance),
            )
        else:
            decision = stratified_barker_test(
                self.rng,
                residuals,
                self.strata,
                rest + known,
                self.batch_size,
                1.0,
                self.test.correction,
            )
        accepted = decision.accepted and not decision.nonfinite_proposal
        info = SharedMoveInfo(decision.n_data, accepted, decision.full_data)
        return (q_new if accepted else q), info

    def _move_hyperparameters(self, q: np.ndarray) -> tuple[np.ndarray, HyperWalkInfo]:
        """Exact moves of the coordinates no row reads directly, the groups' cells held fixed.

        ``kernels/hyper_walk.py``: where a factor's cells read them (``c = A(h) + B(h) x``,
        a non-centred hierarchy), the effects follow, ``x = B(h)^-1 (c - A(h))``, and the
        target gains ``-log |det B(h)|`` per group.
        """
        assert self.hyperparameters is not None
        free = self.functions.free_coordinates
        held = {
            f: self.expansion.parts(f, q).cells
            for f, factor in enumerate(self.factors)
            if factor.reads_hyperparameters
        }

        def point_at(h: np.ndarray) -> tuple[np.ndarray, float]:
            point = q.copy()
            point[free] = h
            log_jacobian = 0.0
            for f, cells in held.items():
                coordinates = self.factors[f].coordinates
                point[coordinates] = 0.0
                parts = self.expansion.parts(f, point)
                sign, log_det = np.linalg.slogdet(parts.jacobian)
                if not np.all(sign != 0) or not np.all(np.isfinite(log_det)):
                    return point, np.inf
                offset = (cells - parts.cells)[..., None]
                point[coordinates] = np.linalg.solve(parts.jacobian, offset)[..., 0]
                log_jacobian += float(log_det.sum())
            return point, log_jacobian

        def log_target(h: np.ndarray) -> float:
            point, log_jacobian = point_at(h)
            if not np.isfinite(log_jacobian):
                return -np.inf
            return self.oracles.log_prior(point) - log_jacobian

        compiled = None if held else self._compiled_walk()
        moves = None if compiled is None else compiled.moves(q)
        h, info = self.hyperparameters(self.rng, q[free], log_target, self.tune, moves)
        return point_at(h)[0], info

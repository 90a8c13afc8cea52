"""GroupEffectsMH: a hierarchy's group effects, each group tested on its own rows."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.group_effects import (
    GroupParts,
    GroupRows,
    GroupSweepInfo,
    SharedMoveInfo,
    group_effects_sweep,
    group_rows,
)
from pymc_subsample.kernels.group_tests import BARKER, T_TEST, GroupTest
from pymc_subsample.kernels.hyper_walk import HyperWalk, HyperWalkInfo
from pymc_subsample.kernels.stratified import (
    Strata,
    build_strata,
)
from pymc_subsample.model.group_effects import GroupEffectFunctions
from pymc_subsample.model.row_data import row_chunks
from pymc_subsample.step_methods.acceptance_tests import StatSpec
from pymc_subsample.step_methods.acceptance_tests.barker import BarkerTest
from pymc_subsample.step_methods.acceptance_tests.sequential_t import _check_error_tolerance
from pymc_subsample.step_methods.arguments import check_choice, check_int
from pymc_subsample.step_methods.diagnostics import RowCost
from pymc_subsample.step_methods.group_compiled import CompiledSweepParts
from pymc_subsample.step_methods.group_expansion import PASS_ROWS, GroupExpansion
from pymc_subsample.step_methods.group_moves import GroupMoves
from pymc_subsample.step_methods.group_recentring import START_NEWTON_STEPS, GroupRecentring
from pymc_subsample.step_methods.step_base import SubsampleStepBase
from pymc_subsample.step_methods.stratification import WHOLE_GROUP_ROWS
from pymc_subsample.warnings import warn_user

if TYPE_CHECKING:
    from pymc_subsample.step_methods.fused_group_path import FusedGroupSweep

__all__ = ["GroupEffectsMH", "NotGroupEffects"]

#: Default epsilon of each group's t-test (Korattikara et al. 2014, Algorithm 1).
DEFAULT_ERROR_TOLERANCE = 0.01
#: Default rows per sampled group at a test's first stage, by test; groups of at most this
#: many rows are read whole. The t-test decides at a threshold, from the tails of its
#: estimate's t distribution (``|t|`` near 2.3 at epsilon 0.01), which needs rows enough for a
#: CLT: on the benchmark hierarchies (``benchmarks/hierarchical_groups.py``) 25 rows gave
#: 1.16x (centred Poisson), 1.32x (non-centred logistic) and 1.03x (crossed) the min-ESS per
#: second of 50. The Barker test reads only its estimate's variance: it adds noise of sd
#: ``sigma = 1`` and more, so a non-Gaussian error of variance ``s^2`` moves its acceptance
#: probability by at most ``max|h''| |s^2 - s_hat^2| / 2 + O(s^3)`` (``h`` the smoothed
#: logistic CDF it applies, ``|h''| <= 0.1``; ``docs/architecture.md``, "Group effects"),
#: about 1e-5 at the ``s`` of 0.01-0.02 the control variate gives a group's estimate. Eight
#: rows measure ``s`` well enough: with three sweeps, 1.24x the min-ESS per second (set-up
#: included, fresh processes) of 25 rows and two sweeps on the centred Poisson model.
DEFAULT_BATCH_SIZE = {T_TEST: 25, BARKER: 8}
#: Default sweeps per draw by test: Barker's acceptance ``1 / (1 + e^-Delta)`` is about half of
#: Metropolis-Hastings' on the groups' near-independence proposals (its lag-one
#: autocorrelation about 1/2 per sweep, ``1/8`` after three), so the group effects move half
#: as often per sweep. With eight rows a group, three sweeps gave 1.2x the min-ESS per second
#: of two on the centred Poisson benchmark model; a fourth gave no more (the hyperparameters
#: then mix slowest).
DEFAULT_SWEEPS = {T_TEST: 1, BARKER: 3}
#: The stats of a draw without hyperparameters, and without shared coefficients.
NO_HYPER_MOVES = HyperWalkInfo(float("nan"), float("nan"))
NO_SHARED_MOVE = SharedMoveInfo(0, False, False)
#: Tuning draws after which the expansion moves to the chain's current point (each an O(N)
#: pass): the start is often far from the posterior, and the proposal's quadratic model and
#: the residuals' spread are best where the chain is.
RECENTRE_AT = (10, 50, 200)
#: From this tuning draw on, each expansion is at the mean of the draws since the last one,
#: not at the chain's current point: a small group's conditional is broad, one draw of it can
#: lie in its tail, and an expansion there misjudges the group's curvature, which the Newton
#: proposal then reads (too narrow a proposal holds a chain; on the centred Poisson benchmark
#: model the expansion at the mean raised the min ESS of ``MinibatchBarkerMH()`` on 3 seeds
#: from 304-934 to 1,002-1,070 in 2 x 2,000 draws, of ``AusterityMH()`` from 2,168-2,243 to
#: 2,646-2,707).
MEAN_FROM = RECENTRE_AT[1]


class NotGroupEffects(ValueError):
    """The step's variables are not a hierarchy's group effects (raised before sampling)."""

    def __init__(self, names: str, reason: str) -> None:
        super().__init__(
            f"GroupEffectsMH updates a hierarchy's group effects, and {names} are not group "
            f"effects: {reason}. Give it only the variables indexed by a group index "
            "(vars=[a, b] for a[group_idx], b[group_idx]) and sample the others "
            "(hyperparameters, shared coefficients) with pms.AusterityMH in the same "
            "pm.sample(step=[...])."
        )
        #: The variables, quoted and joined.
        self.names = names
        #: Why, in the user's words (``model/group_effects.py``).
        self.reason = reason


@dataclass_state
class GroupEffectsState(StepMethodState):
    """Adaptive state restored before each sequential chain."""

    tune: bool


class GroupEffectsMH(CompiledSweepParts, GroupMoves, GroupRecentring, SubsampleStepBase):
    r"""Sample a hierarchical model by its structure: one test per group, on its own rows.

    In a hierarchical model the group effects (``a`` in ``a = pm.Normal("a", mu, sd,
    dims="group")``, or ``z`` in ``a = mu + sd * z``, read by the rows as ``a[group_idx]``)
    are independent given every other variable, and group g's conditional reads only group
    g's rows. A draw is a Gibbs sweep:

    1. every group's effects are proposed at once, by a Newton step on a quadratic model of
       its conditional (the prior's derivatives, and the likelihood's second-order expansion
       in the group's parameters summed exactly over its rows), and each group is accepted
       or rejected on its own: small groups on all their rows, larger ones on a batch of
       rows with the expansion as a control variate and the sequential t-test of
       :class:`AusterityMH` (Korattikara et al. 2014, Algorithm 1, the group as the
       population); one factor after the other where the rows have crossed factors;
    2. coefficients the rows read only through their sum with a group's parameters (an
       intercept beside random intercepts) move along that ridge, exactly;
    3. hyperparameters (the groups' mean and scale) move with the groups' parameters held
       fixed, which reads no row (Yu and Meng 2011's sufficient-augmentation update; a
       non-centred model's effects follow);
    4. coefficients shared by every row move by one Newton proposal, decided on a sample of
       rows stratified by group with the expansion as a control variate (every row where
       that test is not confident).

    Each sampled decision is the sequential t-test (``test="t"``) or the minibatch Barker
    test of :class:`MinibatchBarkerMH` (``test="barker"``: Seita et al. 2018, Algorithm 1, the
    group, or the strata of rows, as the population); moves 2 and 3 read no row and are exact
    Metropolis-Hastings. ``docs/architecture.md``, "Group effects", gives the estimators and
    the proposals. ``pm.sample`` never assigns it, but ``pms.AusterityMH()`` and
    ``pms.MinibatchBarkerMH()`` build it, with their test, when given a hierarchy and no
    setting of their own (their ``group_effects`` argument).

    Parameters
    ----------
    vars : list of variables, optional
        The variables to sample (default: every continuous free variable). Each must be a
        group effect (its first axis the groups' axis, read through a group index), a
        hyperparameter (read by no row, or only inside the groups' parameters), or a
        coefficient the rows read directly.
    test : {"t", "barker"}, default "t"
        The test of each sampled decision: the sequential t-test of :class:`AusterityMH`, or
        the minibatch Barker test of :class:`MinibatchBarkerMH` (whose acceptance
        probability is Barker's ``1 / (1 + exp(-Delta))``, below Metropolis-Hastings', so
        the groups move less often per draw).
    error_tolerance : float, default 0.01
        The t-test's probability of a wrong decision in each sampled test, in [0, 0.5); 0
        reads every row (exact Metropolis-within-Gibbs). The shared coefficients' test also
        decides once its estimate is precise enough that the error this adds to the
        acceptance probability is at most ``error_tolerance`` (averaged over ``u``), so a
        draw never reads all N rows for them. Unused by the Barker test.
    correction_sd : float, default 1.0
        The Barker test's sigma (:class:`MinibatchBarkerMH`): a sampled decision is made
        once its estimate's variance is below ``correction_sd**2``. Unused by the t-test.
    batch_size : int, optional
        Rows read per group whose test is sampled at its first stage (each stage after reads
        twice as many); groups of at most this many rows are decided exactly on all of them.
        By default 25 with the t-test, which needs them for the t distribution of its
        estimate, and 8 with the Barker test, which reads only the estimate's variance.
    obs_dim : str, optional
        Name of the row dimension when it cannot be inferred (see ``docs/guide.md``).
    model : pymc.Model, optional
    rng : int or numpy.random.Generator, optional
        Replaced by the chain's generator inside ``pm.sample``.
    compile_kwargs : dict, optional
        Passed to PyTensor's compiler.
    fused : bool, default True
        Decide each sweep's groups in one compiled call (PyTensor's Numba kernels of the
        model's row functions, called from a generated Numba driver) where the rows are in
        this process; ``False`` decides them in Python. Both make the same decisions; the
        fused ones draw their rows and noise from Numba's generator (seeded from the
        chain's), so draws differ between the two for the same seed. Attribute
        ``draw_path`` says ``"fused"``, or ``"python: "`` and why.
    sweeps : int, optional
        Sweeps of every grouping factor per draw, each proposing and testing every group
        once: by default 1 with the t-test and 3 with the Barker test. Barker's test accepts
        a proposal at ``1 / (1 + e^-Delta)``, about half of what Metropolis-Hastings accepts
        of the groups' Newton proposals (0.48 against 0.9), so one sweep moves the group
        effects half as often; with its first stage of 8 rows a sweep reads a third of the
        t-test's rows (and costs about two thirds of its time).

    Raises
    ------
    ValueError
        If the model has no group index, or the variables' conditional posterior does not
        factorise over groups: a prior or group parameter that couples groups, another
        variable whose prior reads them, a variable read both directly and inside the
        groups' parameters, or group parameters that read hyperparameters without being
        affine in the effects.

    Notes
    -----
    Sample statistics per draw: ``n_data`` (rows read by every test of the draw),
    ``n_groups`` (groups updated), ``n_accepted`` and ``accept_rate`` (group proposals
    accepted over the draw's sweeps, and their share), ``n_full_groups`` (group decisions
    on all their rows), ``n_nonfinite`` (proposals that gave a non-finite value, rejected),
    ``hyper_accept_rate`` and ``hyper_scale`` (the hyperparameters' moves),
    ``shared_n_data``, ``shared_accepted`` and ``shared_full_data`` (the shared
    coefficients' move), ``error_tolerance`` (NaN with the Barker test) and ``batch_size``.

    Where the draws after tuning read more than half of the rows on average (most rows in
    groups of at most ``batch_size`` rows, which are read whole), a ``SubsampleWarning`` says
    so once per chain: full-data NUTS is then likely the faster sampler.

    Examples
    --------
    >>> import numpy as np, pymc as pm, pymc_subsample as pms
    >>> rng = np.random.default_rng(0)
    >>> group = rng.integers(0, 20, 20_000)
    >>> y = rng.poisson(np.exp(rng.normal(0.5, 0.5, 20)[group]))
    >>> with pm.Model(coords={"group": range(20)}):
    ...     mu = pm.Normal("mu", 0.0, 2.0)
    ...     sd = pm.HalfNormal("sd", 1.0)
    ...     a = pm.Normal("a", mu, sd, dims="group")
    ...     _ = pm.Poisson("y", pm.math.exp(a[group]), observed=y)
    ...     idata = pm.sample(draws=300, tune=200, chains=1, step=pms.GroupEffectsMH(),
    ...                       progressbar=False, random_seed=1, compute_convergence_checks=False)
    >>> log_rates = np.log(np.bincount(group, y) / np.bincount(group))
    >>> bool(abs(float(idata.posterior["mu"].mean()) - log_rates.mean()) < 0.1)
    True
    """

    name = "group_effects_mh"
    #: The package kernels its sweeps call, compiled ahead (``kernels/warm_up.py``).
    # In the order the first draw calls them: the Newton steps of the recentring first.
    warm_kernels: ClassVar[tuple[str, ...]] = ("group_newton", "fused_groups", "fused_proposals")
    _state_class = GroupEffectsState
    stats_dtypes_shapes: ClassVar[dict[str, StatSpec]] = {
        **{field: (np.int64, []) for field in GroupSweepInfo._fields},
        "n_groups": (np.int64, []),
        **{field: (np.float64, []) for field in HyperWalkInfo._fields},
        "shared_n_data": (np.int64, []),
        "shared_accepted": (bool, []),
        "shared_full_data": (bool, []),
        "accept_rate": (np.float64, []),
        "error_tolerance": (np.float64, []),
        "batch_size": (np.int64, []),
    }

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None = None,
        *,
        test: str = T_TEST,
        error_tolerance: float = DEFAULT_ERROR_TOLERANCE,
        correction_sd: float = 1.0,
        batch_size: int | None = None,
        obs_dim: str | None = None,
        model: pm.Model | None = None,
        rng: RandomGenerator = None,
        compile_kwargs: dict[str, Any] | None = None,
        fused: bool = True,
        sweeps: int | None = None,
    ) -> None:
        self.error_tolerance = _check_error_tolerance(error_tolerance)
        if not isinstance(fused, bool):
            raise ValueError(f"fused must be True or False, got {fused!r}.")
        kind = check_choice("test", test, (T_TEST, BARKER))
        #: The test of every sampled decision (``kernels/group_tests.py``).
        self.test = GroupTest(
            kind,
            self.error_tolerance,
            BarkerTest(correction_sd=correction_sd).correction if kind == BARKER else None,
        )
        batch_size = check_int(
            "batch_size", DEFAULT_BATCH_SIZE[kind] if batch_size is None else batch_size, minimum=2
        )
        #: Sweeps of every factor per draw (``sweeps``).
        self.sweeps = check_int(
            "sweeps", DEFAULT_SWEEPS[kind] if sweeps is None else sweeps, minimum=1
        )
        super().__init__(
            vars,
            batch_size=batch_size,
            obs_dim=obs_dim,
            model=model,
            rng=rng,
            compile_kwargs=compile_kwargs,
            blocked=True,
        )
        functions = self.oracles.group_effects()
        if isinstance(functions, str):
            raise NotGroupEffects(", ".join(repr(name) for name in self.var_names), functions)
        self.functions: GroupEffectFunctions = functions
        if fused and self._first_build:
            # A machine's first build: the group sweep's functions compile in a helper during
            # the set-up (elsewhere compiling them here is quicker, model/compile_helper.py).
            # The prior (group_compiled.py) and its gradient (the start's Newton rounds,
            # group_recentring.py), which the first draw calls from Python, compile here while
            # the helper compiles the sweep's drivers.
            for function in (functions.change, functions.residual, *functions.parts):
                function.prefetch()
        self.strata: Strata | None = None
        self.layouts = self._layouts()
        self._n_groups = sum(factor.n_groups for factor in self.factors)
        free = self.functions.free_coordinates
        self.hyperparameters = HyperWalk(int(free.size)) if free.size else None
        self.tune = True
        self._draws = 0
        #: The sum and number of the tuning draws since the last expansion (``MEAN_FROM``).
        self._tuning_sum, self._tuning_count = np.zeros(0), 0
        self.expansion = GroupExpansion(functions, self.oracles)
        #: Rows per draw after tuning, judged once per chain (``_check_cost``).
        self.cost = RowCost(self.oracles.n_rows)
        #: One exact random walk per ridge the expansion finds (``_move_ridges``).
        self._ridge_walks: list[HyperWalk] = []
        self.oracles.ensure_rows_finite()
        self._choose_compiled_paths(fused)

    def describe_groups(self) -> str:
        """Name the group effects and count their groups (``"'a': 200 groups"``)."""
        sizes = [int(np.prod(self._initial_point[name].shape)) for name in self.var_names]
        ends = np.cumsum(sizes)
        parts = []
        for factor in self.factors:
            owners = np.searchsorted(ends, np.unique(factor.coordinates), side="right")
            names = ", ".join(repr(self.var_names[k]) for k in np.unique(owners))
            parts.append(f"{names}: {factor.n_groups} groups")
        return "; ".join(parts)

    def _check_cost(self, n_data: int) -> None:
        """Warn once per chain where the draws after tuning read most of the rows."""
        mean_rows = self.cost.record(n_data)
        if mean_rows is None:
            return
        n_rows = self.oracles.n_rows
        read_whole = sum(int(layout.whole_rows.size) for layout in self.layouts)
        share_whole = read_whole / max(n_rows * len(self.layouts), 1)
        if share_whole > 0.5:
            why = (
                f"{share_whole:.0%} of the rows are in groups of at most batch_size="
                f"{self.batch_size} rows, which every draw reads whole to decide their effects"
            )
        else:
            why = (
                "the groups' sampled tests were not sure and read their groups whole (stat "
                "'n_full_groups'): their residuals are large, the expansion far from the chain"
            )
        warn_user(
            f"Draws after tuning read {mean_rows:.0f} of the N={n_rows} rows on average "
            f"({mean_rows / n_rows:.0%}, stat 'n_data'): {why}. The draws are right, but each "
            "costs about as much as a full-data evaluation: on this model full-data NUTS "
            "(pm.sample() without step=, or nutpie) is likely the faster sampler.",
            topic="GroupEffectsMH.cost",
        )

    def _layouts(self) -> list[GroupRows]:
        """Each factor's rows by group, from one pass over the rows' group indices."""
        pieces: list[list[np.ndarray]] = [[] for _ in self.factors]
        for chunk in row_chunks(self.oracles.n_rows, PASS_ROWS):
            indices = self.functions.indices(*self.oracles.rows_at(chunk))
            for f, factor in enumerate(self.factors):
                pieces[f].append(np.asarray(indices[factor.gathers[0]], np.int64))
        layouts = []
        for factor, piece in zip(self.factors, pieces, strict=True):
            groups = np.concatenate(piece)
            if groups.size and (groups.min() < -factor.n_groups or groups.max() >= factor.n_groups):
                raise IndexError(
                    f"A group index of the rows is outside -{factor.n_groups}.."
                    f"{factor.n_groups - 1}, the length of the group effects it indexes."
                )
            groups %= factor.n_groups
            layouts.append(group_rows(groups, factor.n_groups, self.batch_size))
            if not layouts[1:]:
                # The shared coefficients' test reads the first factor's groups as strata.
                self.strata = build_strata(groups, WHOLE_GROUP_ROWS)
        return layouts

    def _rebuild_for_data(self) -> None:
        self.layouts = self._layouts()
        self.cost = RowCost(self.oracles.n_rows)
        self.expansion.quadratics = None

    def reset_tuning(self) -> None:
        """Start the chain's expansion afresh (at its first draw)."""
        self._seed_fused = True
        self._draws = 0
        self._tuning_sum, self._tuning_count = np.zeros(0), 0
        self.cost.reset(self._chain_draws)
        self.expansion.quadratics = None
        if self.hyperparameters is not None:
            self.hyperparameters.reset()
        for walk in self._ridge_walks:
            walk.reset()

    def _sweep_in_turns(
        self, q: np.ndarray, fused: FusedGroupSweep | None
    ) -> tuple[np.ndarray, GroupSweepInfo]:
        """Sweep every factor :attr:`sweeps` times, the factors taking turns sweep by sweep.

        Each factor's compiled sweep where ``fused`` is given, else the Python one; the
        counts are summed over the sweeps.
        """
        totals = np.zeros(len(GroupSweepInfo._fields), dtype=np.int64)
        for _ in range(self.sweeps):
            for f, (factor, layout) in enumerate(zip(self.factors, self.layouts, strict=True)):
                quadratic = self.expansion.shifted(f, q)
                if fused is not None:
                    q, info = fused.sweep(f, layout, self.batch_size, q, quadratic)
                else:

                    def terms(
                        old: GroupParts,
                        new: GroupParts,
                        rows: np.ndarray,
                        _groups: np.ndarray,
                        residual: bool,
                        f: int = f,
                        point: np.ndarray = q,
                    ) -> np.ndarray:
                        return self._row_terms(f, point, point, old, new, rows, residual)

                    q, info = group_effects_sweep(
                        self.rng,
                        q,
                        factor.coordinates,
                        partial(self.expansion.parts, f),
                        quadratic,
                        layout,
                        terms,
                        self.batch_size,
                        self.test,
                    )
                totals += info
        return q, GroupSweepInfo(*totals.tolist())

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """One sweep: every group of every factor proposed and tested once."""
        q = np.array(q0.data, dtype=np.float64)
        if self.expansion.quadratics is None:
            # The fused sweep's drivers compile in the helper while the start moves.
            self._compile_sweep_ahead(q)
            self._recentre(q, newton_steps=START_NEWTON_STEPS)
        elif self.tune and self._draws in RECENTRE_AT:
            if self._draws > MEAN_FROM and self._tuning_count:
                self._recentre(self._tuning_sum / self._tuning_count)
            else:
                self._recentre(q)
        if self.tune and MEAN_FROM <= self._draws < RECENTRE_AT[-1]:
            if self._draws in RECENTRE_AT:
                self._tuning_sum, self._tuning_count = np.zeros_like(q), 0
            self._tuning_sum += q
            self._tuning_count += 1
        assert self.expansion.quadratics is not None
        self._draws += 1
        fused = self._fused_sweep(q)
        if fused is not None and len(self.factors) == 1:
            # One factor's sweeps leave its expansion as it is (it reads the other factors):
            # the compiled path makes them in one call. (Kept short: Python run after the
            # compiled sweep is slow, its code and data out of the caches.)
            quadratic = self.expansion.shifted(0, q)
            layout = self.layouts[0]
            q, info = fused.sweep(0, layout, self.batch_size, q, quadratic, sweeps=self.sweeps)
            n_data, n_accepted, n_full_groups, n_nonfinite = info
        else:
            q, (n_data, n_accepted, n_full_groups, n_nonfinite) = self._sweep_in_turns(q, fused)
        if self.expansion.ridges:
            q = self._move_ridges(q)
        hyper = NO_HYPER_MOVES
        if self.hyperparameters is not None:
            q, hyper = self._move_hyperparameters(q)
        shared = NO_SHARED_MOVE
        if self.functions.direct_coordinates.size:
            q, shared = self._move_shared(q)
            n_data += shared.shared_n_data
        if not self.tune and not self.test.exact:  # exact decisions read every row, as asked
            self._check_cost(n_data)
        n_groups = self._n_groups
        stats: dict[str, Any] = {
            "n_data": n_data,
            "n_accepted": n_accepted,
            "n_full_groups": n_full_groups,
            "n_nonfinite": n_nonfinite,
            "hyper_accept_rate": hyper.hyper_accept_rate,
            "hyper_scale": hyper.hyper_scale,
            "shared_n_data": shared.shared_n_data,
            "shared_accepted": shared.shared_accepted,
            "shared_full_data": shared.shared_full_data,
            "n_groups": n_groups,
            "accept_rate": n_accepted / max(n_groups * self.sweeps, 1),
            "error_tolerance": self.error_tolerance if self.test.kind == T_TEST else np.nan,
            "batch_size": self.batch_size,
        }
        return RaveledVars(q, q0.point_map_info), [stats]

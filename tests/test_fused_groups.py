"""The fused group sweep makes the Python path's proposals and decisions, group by group.

``step_methods/fused_group_path.py`` runs a factor's sweep as one compiled call, drawing its
rows and noise from Numba's generator, so its chains differ from the Python path's for a seed;
the posterior tests of ``tests/test_group_effects.py`` run both. Here both decide the same
proposals, and sweep from the same point with the same noise, where their decisions do not
depend on which rows they draw:

- every group read whole (the t-test at ``error_tolerance=0``): ``Delta_g > log u`` on all of
  a group's rows, the same numbers in both;
- a Normal likelihood, whose rows' second-order expansion is exact: every residual is zero up
  to rounding, so each sampled group is decided at its first stage on ``known_g`` alone,
  whichever rows were drawn.

Each compares the accepted groups and the counts (rows read, groups read whole, non-finite
proposals) over several proposals (checked when written: the t-test's threshold without
``known_g`` fails the Normal case), and the sweeps' new points (checked when written: a
proposal drawn with the precision's square root in place of its inverse fails, and so does
a proposal ratio of the wrong sign). Which rows a stage reads is checked on its own: every
row drawn is one of its group's, each equally likely.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pymc as pm
import pytest

from pymc_subsample import GroupEffectsMH
from pymc_subsample.kernels.fused import seed_generator
from pymc_subsample.kernels.fused_groups import draw_group_rows
from pymc_subsample.kernels.fused_proposals import take_groups
from pymc_subsample.kernels.group_effects import decide_on_rows, group_effects_sweep, group_rows
from pymc_subsample.kernels.hyper_walk import walk
from pymc_subsample.step_methods.fused_group_path import FusedGroupSweep

SIZES = [0, 1, 3, 20, 50, 51, 80, 200, 400, 1_500, 6, 120, 900]


def _groups(seed: int = 0) -> tuple[np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    return np.repeat(np.arange(len(SIZES)), SIZES), rng


def _poisson_step(error_tolerance: float) -> GroupEffectsMH:
    group, rng = _groups()
    y = rng.poisson(np.exp(rng.normal(0.5, 1.0, len(SIZES))[group]))
    with pm.Model(coords={"group": range(len(SIZES))}) as model:
        a = pm.Normal("a", 0.5, 1.0, dims="group")
        pm.Poisson("y", pm.math.exp(a[pm.Data("g", group)]), observed=y)
        return GroupEffectsMH([model["a"]], error_tolerance=error_tolerance)


def _three_effects_step() -> GroupEffectsMH:
    """Poisson rows with a varying intercept and two varying slopes, decided exactly."""
    group, rng = _groups()
    x = rng.normal(size=(group.size, 2))
    y = rng.poisson(np.exp(0.5 + 0.3 * x[:, 0] - 0.2 * x[:, 1]))
    with pm.Model(coords={"group": range(len(SIZES))}) as model:
        a = pm.Normal("a", 0.5, 1.0, dims="group")
        b = pm.Normal("b", 0.0, 1.0, dims="group")
        c = pm.Normal("c", 0.0, 1.0, dims="group")
        g = pm.Data("g", group)
        pm.Poisson("y", pm.math.exp(a[g] + b[g] * x[:, 0] + c[g] * x[:, 1]), observed=y)
        return GroupEffectsMH([model["a"], model["b"], model["c"]], error_tolerance=0.0)


def _normal_step() -> GroupEffectsMH:
    group, rng = _groups()
    y = rng.normal(rng.normal(0.0, 1.0, len(SIZES))[group], 2.0)
    with pm.Model(coords={"group": range(len(SIZES))}) as model:
        a = pm.Normal("a", 0.0, 1.0, dims="group")
        pm.Normal("y", a[pm.Data("g", group)], 2.0, observed=y)
        return GroupEffectsMH([model["a"]])


def _compare(step: GroupEffectsMH, seed: int, spoil: int | None = None) -> tuple:
    """Decide one sweep's proposals both ways; return both (accepted, counts)."""
    q = np.asarray(step.oracles.initial_q, dtype=float)
    step._recentre(q, newton_steps=3)
    q = step.expansion.reference_q + 0.1 * np.random.default_rng(seed).standard_normal(q.size)
    layout = step.layouts[0]
    fused = FusedGroupSweep(step.functions, step.oracles, step.expansion, step.test)
    both = {}

    def terms(old, new, rows, groups, residual):
        return step._row_terms(0, q, q, old, new, rows, residual)

    def decide(old, new, rest, known, log_u):
        # log u raised by up to 2: about half the decisions are rejections, both compared.
        log_u = log_u + np.random.default_rng(seed + 200).uniform(0.0, 2.0, log_u.size)
        if spoil is not None:
            rest = rest.copy()
            rest[spoil] = np.nan
        both["python"] = decide_on_rows(
            np.random.default_rng(seed),
            layout,
            terms,
            step.batch_size,
            step.test,
            old,
            new,
            rest,
            known,
            log_u,
        )
        both["fused"] = fused.decisions(layout, step.batch_size, q)(old, new, rest, known, log_u)
        return both["python"]

    group_effects_sweep(
        np.random.default_rng(seed + 100),
        q,
        step.factors[0].coordinates,
        partial(step.expansion.parts, 0),
        step.expansion.shifted(0, q),
        layout,
        terms,
        step.batch_size,
        step.test,
        decide,
    )
    return both["python"], both["fused"]


@pytest.mark.parametrize("model", ["poisson_exact", "normal_sampled"])
def test_fused_decisions_are_the_python_decisions(model):
    step = _poisson_step(0.0) if model == "poisson_exact" else _normal_step()
    accepted = rejected = 0
    for seed in range(6):
        (python, python_counts), (fused, fused_counts) = _compare(step, seed)
        np.testing.assert_array_equal(fused, python)
        assert fused_counts == python_counts
        accepted += int(python.sum())
        rejected += int((~python).sum())
    # Both outcomes were compared, and the Normal case decided every group of more than
    # batch_size rows on its first stage's sample.
    assert accepted > 10 and rejected > 10
    if model == "normal_sampled":
        small = [size for size in SIZES if size <= step.batch_size]
        assert python_counts.n_full_groups == len(small)
        assert python_counts.n_data == sum(small) + step.batch_size * (len(SIZES) - len(small))


class _ScriptedNoise:
    """A generator whose sweep noise is given (the rows it draws come from ``rng``)."""

    def __init__(self, rng, normals, scales, log_u):
        self._rng = rng
        self._normals, self._scales, self._log_u = normals, scales, log_u

    def standard_normal(self, shape):
        assert shape == self._normals.shape
        return self._normals

    def chisquare(self, df, size):
        # The Python path scales its normals by sqrt(df / chi2).
        return (df / self._scales**2).reshape(size)

    def uniform(self, size):
        return np.exp(self._log_u)

    def random(self, *args, **kwargs):
        return self._rng.random(*args, **kwargs)


@pytest.mark.parametrize("model", ["poisson_exact", "normal_sampled", "three_effects"])
def test_the_fused_sweeps_are_the_python_sweeps(model):
    """Two sweeps in one compiled call against two Python sweeps, the second from the first's
    point; also with three effects per group, where the sweep diagonalises by LAPACK."""
    steps = {"poisson_exact": lambda: _poisson_step(0.0), "three_effects": _three_effects_step}
    step = steps.get(model, _normal_step)()
    assert step.factors[0].size == (3 if model == "three_effects" else 1)
    q0 = np.asarray(step.oracles.initial_q, dtype=float)
    step._recentre(q0, newton_steps=3)
    fused = FusedGroupSweep(step.functions, step.oracles, step.expansion, step.test)
    coordinates, layout = step.factors[0].coordinates, step.layouts[0]
    accepted = rejected = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        q = step.expansion.reference_q + 0.1 * rng.standard_normal(q0.size)
        normals = rng.standard_normal((2, *coordinates.shape))
        scales = np.sqrt(7.0 / rng.chisquare(7.0, (2, coordinates.shape[0])))
        # log u raised by up to 2: about half the decisions are rejections, both compared.
        log_u = np.log(rng.uniform(size=scales.shape)) + rng.uniform(0.0, 2.0, scales.shape)
        quadratic = step.expansion.shifted(0, q)
        python, totals = q, np.zeros(4, dtype=np.int64)
        for sweep in range(2):

            def terms(old, new, rows, groups, residual, q=python):
                return step._row_terms(0, q, q, old, new, rows, residual)

            start = python
            python, python_info = group_effects_sweep(
                _ScriptedNoise(rng, normals[sweep], scales[sweep], log_u[sweep]),
                python,
                coordinates,
                partial(step.expansion.parts, 0),
                quadratic,
                layout,
                terms,
                step.batch_size,
                step.test,
            )
            totals += np.asarray(python_info)
            moved = python[coordinates[:, 0]] != start[coordinates[:, 0]]
            accepted += int(moved.sum())
            rejected += int((~moved).sum())
        compiled, compiled_info = fused.sweep(
            0, layout, step.batch_size, q, quadratic, noise=(normals, scales, log_u), sweeps=2
        )
        np.testing.assert_allclose(compiled, python, rtol=1e-10, atol=1e-12)
        assert tuple(compiled_info) == tuple(totals)
    assert accepted > 10 and rejected > 10


def test_a_nonfinite_proposal_is_rejected_and_counted_by_both():
    step = _normal_step()
    big = SIZES.index(1_500)
    (python, python_counts), (fused, fused_counts) = _compare(step, 0, spoil=big)
    assert not python[big] and not fused[big]
    assert fused_counts == python_counts and fused_counts.n_nonfinite == 1


def test_a_stage_draws_each_groups_own_rows_uniformly():
    # Rows of 4 groups (sizes 3, 1, 0, 5) in shuffled order; groups 0, 1 and 3 drawn.
    row_groups = np.random.default_rng(0).permutation(np.repeat([0, 1, 3], [3, 1, 5]))
    layout = group_rows(row_groups, 4, batch_size=2)
    seed_generator(0)
    draw = 9_000
    rows = draw_group_rows(layout.order, layout.starts, np.array([0, 1, 3]), draw)
    for k, g in enumerate([0, 1, 3]):
        picked = rows[k * draw : (k + 1) * draw]
        assert np.all(row_groups[picked] == g)
        counts = np.bincount(picked, minlength=row_groups.size)[row_groups == g]
        share = 1.0 / counts.size
        # Each row's count is Binomial(draw, share): within 5 sds (false failure < 1e-5).
        assert np.all(np.abs(counts - draw * share) <= 5 * np.sqrt(draw * share * (1 - share)))


def _centred_normal_step():
    """A centred Normal hierarchy's default group step (its walk compiles), and the generator."""
    group, rng = _groups()
    y = rng.normal(rng.normal(0.3, 0.8, len(SIZES))[group], 1.0)
    with pm.Model(coords={"group": range(len(SIZES))}):
        mu = pm.Normal("mu", 0.0, 1.0)
        sd = pm.HalfNormal("sd", 1.0)
        a = pm.Normal("a", mu, sd, dims="group")
        pm.Normal("y", a[pm.Data("g", group)], 1.0, observed=y)
        return GroupEffectsMH(), rng


def test_the_compiled_hyperparameter_walk_makes_the_python_walks_moves():
    step, rng = _centred_normal_step()
    compiled = step._compiled_walk()
    assert compiled is not None and step.draw_path == "fused"
    free = step.functions.free_coordinates
    q = np.asarray(step.oracles.initial_q, dtype=float)
    q[step.factors[0].coordinates[:, 0]] = rng.normal(0.3, 0.8, len(SIZES))

    def log_target(h):
        point = q.copy()
        point[free] = h
        return step.oracles.log_prior(point)

    # Steps of several sizes: small ones mostly accepted, large ones mostly rejected.
    increments = rng.normal(size=(40, free.size)) * np.repeat([0.05, 0.5, 3.0, 10.0], 10)[:, None]
    uniforms = rng.uniform(size=40)
    h_python, acceptances_python = walk(q[free], log_target, increments, uniforms)
    h_compiled, acceptances_compiled = compiled.given_moves(q, q[free], increments, uniforms)
    np.testing.assert_allclose(acceptances_compiled, acceptances_python, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(h_compiled, h_python, rtol=1e-12)
    accepted = uniforms < acceptances_python
    assert 5 < accepted.sum() < 35


def test_the_compiled_hyperparameter_walk_draws_its_increments_from_the_proposal_covariance():
    """The compiled walk's own noise: increments ``scale * factor @ z``, ``z`` standard normal.

    At a tiny scale every move is accepted (acceptance ``exp(-|change|)`` with a change of
    order 1e-8), so a call's end point less its start is the sum of its 16 increments, normal
    with covariance ``16 scale^2 F F^T`` (``F F^T = [[4, 3], [3, 2.5]]``). Over 2,000 calls
    each entry of the rescaled sample covariance has a standard error of at most 0.13: the
    tolerance, 0.8, is six of them (false failure under 1e-8); a walk that drops the factor
    (identity) or transposes it (``F^T F = [[6.25, 0.75], [0.75, 0.25]]``) is off by 2.25 or
    more.
    """
    step, _ = _centred_normal_step()
    compiled = step._compiled_walk()
    assert compiled is not None
    free = step.functions.free_coordinates
    assert free.size == 2
    q = np.asarray(step.oracles.initial_q, dtype=float)
    factor = np.array([[2.0, 0.0], [1.5, 0.5]])
    scale = 1e-9
    seed_generator(7)
    moves = compiled.moves(q)
    sums, accepted = [], []
    for _ in range(2000):
        end, acceptances, n_accepted = moves(q[free], factor, scale)
        assert acceptances.shape == (16,)
        sums.append((end - q[free]) / scale)
        accepted.append(n_accepted)
    assert min(accepted) == 16
    sums = np.asarray(sums)
    covariance = np.cov(sums, rowvar=False) / 16
    expected = factor @ factor.T
    np.testing.assert_allclose(covariance, expected, atol=0.2 * np.max(np.diag(expected)))
    assert np.all(np.abs(sums.mean(axis=0)) < 5 * np.sqrt(16 * np.diag(expected) / 2000))


def test_a_sweep_carries_the_accepted_groups_rows_and_leaves_another_factors_table():
    # Between sweeps the compiled sweep carries each accepted group's parts, effects and
    # proposal at its proposed effects: row g of every (G, ...) array; a table of another
    # factor (another row count) is not this factor's and is kept as it is.
    take = np.array([True, False, True])
    rng = np.random.default_rng(0)
    for shape in [(3,), (3, 2), (3, 2, 2)]:
        current, proposed = rng.normal(size=shape), rng.normal(size=shape)
        carried = take_groups(current, proposed, take)
        np.testing.assert_array_equal(carried[take], proposed[take])
        np.testing.assert_array_equal(carried[~take], current[~take])
        assert carried is not current and carried.flags.c_contiguous
    other = rng.normal(size=(5, 1))
    np.testing.assert_array_equal(take_groups(other, rng.normal(size=(5, 1)), take), other)
    # A transposed (not C-contiguous) array is carried by its rows all the same.
    current, proposed = rng.normal(size=(2, 3)).T, rng.normal(size=(2, 3)).T
    carried = take_groups(current, proposed, take)
    np.testing.assert_array_equal(carried[take], proposed[take])
    np.testing.assert_array_equal(carried[~take], current[~take])

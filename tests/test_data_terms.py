"""Summands of a row's log-likelihood that read only the data are dropped from its differences.

``model/data_terms.without_data_terms`` replaces them by zeros: every difference between two
points must be the original's, exactly where both are finite and with the same infinities
where not. Each test compares the differences at random points, including the rows where
PyMC's Poisson takes its special branch (``mu == 0`` and ``y == 0``), and checks what was
dropped; the guarded cases keep a summand whose dropping would change a difference (checked:
dropping through every switch, or ignoring the guards' values, fails them).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import graph_inputs

from pymc_subsample.model.data_terms import without_data_terms


def _differences(rows_logp, parameter, data, values, data_values):
    """``F(theta_k) - F(theta_0)`` for each row of parameters after the first."""
    function = pytensor.function([parameter, data], rows_logp)
    base = function(values[0], data_values)
    with np.errstate(invalid="ignore"):
        return np.array([function(value, data_values) - base for value in values[1:]])


def _gammalns(variable) -> int:
    """``gammaln`` evaluations left in the compiled graph (a dropped summand's shape stays)."""
    inputs = [root for root in graph_inputs([variable]) if not isinstance(root, Constant)]
    function = pytensor.function(inputs, variable, mode="FAST_RUN")
    return pytensor.dprint(function, file="str", print_type=False).lower().count("gammaln")


def test_poisson_drops_log_factorial_and_keeps_every_difference():
    mu = pt.vector("mu")
    y = pt.vector("y", dtype="int64")
    logp = pm.logp(pm.Poisson.dist(mu), y)
    stripped = without_data_terms(logp, [y])
    assert _gammalns(logp) >= 1 and _gammalns(stripped) == 0
    counts = np.array([0, 0, 1, 3, 7, 20])
    rates = np.abs(np.random.default_rng(0).normal(2.0, 2.0, (6, counts.size)))
    rates[1, :2] = 0.0  # mu == 0: the special branch on the rows with y == 0
    rates[2, 2] = 0.0  # mu == 0 where y == 1: log-likelihood -inf
    expected = _differences(logp, mu, y, rates, counts)
    np.testing.assert_allclose(_differences(stripped, mu, y, rates, counts), expected, rtol=1e-12)


def test_normal_constants_are_dropped_and_differences_kept():
    mu = pt.vector("mu")
    y = pt.vector("y")
    logp = pm.logp(pm.Normal.dist(mu, 2.0), y)
    stripped = without_data_terms(logp, [y])
    assert stripped is not logp
    data = np.random.default_rng(1).normal(size=5)
    means = np.random.default_rng(2).normal(size=(4, 5))
    np.testing.assert_allclose(
        _differences(stripped, mu, y, means, data),
        _differences(logp, mu, y, means, data),
        rtol=1e-12,
    )


def test_a_switch_between_two_finite_branches_is_kept_whole():
    theta = pt.vector("theta")
    y = pt.vector("y")
    # Rows with theta > 0 take the constant 1, the others theta - gammaln(y + 1): the summand
    # enters only on one branch, so it does not cancel between two sides on different ones.
    logp = pt.switch(theta > 0.0, 1.0, theta - pt.gammaln(y + 1.0))
    assert without_data_terms(logp, [y]) is logp


def test_a_guard_keeps_a_summand_that_is_not_zero_where_the_constant_branch_is_taken():
    theta = pt.vector("theta")
    y = pt.vector("y")
    # Where theta == 0 and y == 1 the row is 0, elsewhere theta * y - gammaln(y + 2), which is
    # -log 2 (not 0) at y == 1: dropping it would change the rows crossing the branch.
    kept = pt.switch(pt.eq(theta, 0.0) & pt.eq(y, 1.0), 0.0, theta * y - pt.gammaln(y + 2.0))
    assert without_data_terms(kept, [y]) is kept
    # With gammaln(y + 1), 0 at y == 1, it is dropped, and the differences are unchanged.
    dropped = pt.switch(pt.eq(theta, 0.0) & pt.eq(y, 1.0), 0.0, theta * y - pt.gammaln(y + 1.0))
    stripped = without_data_terms(dropped, [y])
    assert _gammalns(stripped) == 0
    data = np.array([1.0, 1.0, 2.0, 5.0])
    thetas = np.array([[0.0, 0.5, 0.0, 1.0], [0.7, 0.0, 0.0, 2.0], [0.0, 0.0, 0.3, 0.0]])
    np.testing.assert_allclose(
        _differences(stripped, theta, y, thetas, data),
        _differences(dropped, theta, y, thetas, data),
        rtol=1e-12,
    )

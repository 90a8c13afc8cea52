"""Sums over rows that read their groups' parameters (``grouped_rows.py``, ``grouped_sums.py``).

The reference search and the control variates' sums take the rows' summed gradient, scores'
outer products and Hessian. Where the rows read a table of parameters by a group index they
are summed by the chain rule through the table (O(N m^2) for m entries per row) instead of
from per-row d-vectors (O(N d^2)). These checks are deterministic: each compares the grouped
sums with the dense ones of the same rows (``graphs.search_graph``, ``graphs.sums_graph``)
at random points, to 1e-9 relative, on hierarchies of every shape the detection accepts.
Dropping the tables' curvature term (``table_curvature_graph``), the cross terms between a
row's cells and its direct coordinates, or a group's offset each fails them.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
from pymc_subsample.model.oracle_builder import build_oracles

N_ROWS = 900


def _groups(rng: np.random.Generator, n_groups: int) -> np.ndarray:
    # Uneven sizes (Dirichlet shares), every group present.
    shares = rng.dirichlet(np.full(n_groups, 0.7))
    group = rng.choice(n_groups, size=N_ROWS - n_groups, p=shares)
    return rng.permutation(np.concatenate([np.arange(n_groups), group]))


def noncentred_logistic() -> pm.Model:
    """Varying intercepts ``mu + sigma * z``, pm.Data index, dims, logistic rows."""
    rng = np.random.default_rng(0)
    group = _groups(rng, 30)
    X = rng.normal(size=(N_ROWS, 3))
    y = rng.binomial(1, 0.4, N_ROWS)
    with pm.Model(coords={"group": np.arange(30), "obs": np.arange(N_ROWS)}) as model:
        index = pm.Data("index", group, dims="obs")
        features = pm.Data("X", X, dims=("obs", "feature_dim"))
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        effect = mu + sigma * z
        pm.Bernoulli("y", logit_p=effect[index] + features @ b, observed=y, dims="obs")
    return model


def centred_poisson_slopes() -> pm.Model:
    """Centred varying intercepts and slopes: a (G, 2) table read as ``ab[g, :]``."""
    rng = np.random.default_rng(1)
    group = _groups(rng, 12)
    x = rng.normal(size=N_ROWS)
    y = rng.poisson(2.0, N_ROWS)
    with pm.Model() as model:
        centre = pm.Normal("centre", 0.0, 1.0, shape=2)
        scale = pm.HalfNormal("scale", 1.0, shape=2)
        ab = pm.Normal("ab", centre, scale, shape=(12, 2))
        rows = ab[group]
        pm.Poisson("y", mu=pm.math.exp(rows[:, 0] + rows[:, 1] * x), observed=y)
    return model


def crossed_normal() -> pm.Model:
    """Two grouping factors per row (crossed), Normal rows with a free noise scale."""
    rng = np.random.default_rng(2)
    first, second = _groups(rng, 20), rng.integers(0, 7, N_ROWS)
    y = rng.normal(size=N_ROWS)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=20)
        c = pm.Normal("c", 0.0, 1.0, shape=7)
        noise = pm.HalfNormal("noise", 1.0)
        # The second index is an expression of the data, negative (counted from the end).
        pm.Normal("y", a[first] + c[second - 7], noise, observed=y)
    return model


def table_also_read_directly() -> pm.Model:
    """The group effects are gathered and also summed into every row: read directly too."""
    rng = np.random.default_rng(3)
    group = _groups(rng, 8)
    y = rng.normal(size=N_ROWS)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=8)
        pm.Normal("y", a[group] + 0.1 * a.sum(), 1.0, observed=y)
    return model


def two_observed_variables() -> pm.Model:
    """Two observed variables read the same table: two gathers, a row's cells unconnected."""
    rng = np.random.default_rng(5)
    group = _groups(rng, 5)
    with pm.Model() as model:
        effect = pm.Normal("effect", 0.0, 2.0, shape=5)
        pm.Normal("y", effect[group], 1.0, observed=rng.normal(size=N_ROWS))
        pm.Poisson("count", pm.math.exp(0.2 * effect[group]), observed=rng.poisson(1.0, N_ROWS))
    return model


MODELS = [
    noncentred_logistic,
    centred_poisson_slopes,
    crossed_normal,
    table_also_read_directly,
    two_observed_variables,
]


def _oracles(model: pm.Model):
    return build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=2
    )


@cache
def _model_oracles(make_model):
    # One model per maker for the module: its functions compile once for all the tests.
    return _oracles(make_model())


def _points(size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 0.6, size) for _ in range(2)]


@pytest.mark.parametrize("make_model", MODELS, ids=lambda make: make.__name__)
def test_grouped_search_sums_equal_the_dense_ones(make_model):
    oracles = _model_oracles(make_model)
    grouped = oracles._functions.grouped_search()
    assert grouped is not None and grouped.n_local > 0
    rows = np.sort(np.random.default_rng(7).choice(N_ROWS, 700, replace=False))
    dense_search = oracles._functions.search[True]
    for q in _points(oracles.n_params, 8):
        # Two chunks, so the sums across chunks are checked too.
        totals = oracles.search_sums(q, rows, with_hessian=True, chunk_size=400)
        dense = dense_search(q, *[array[:, None] for array in oracles._gather(rows)])
        for got, expected in zip(totals, dense, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("make_model", MODELS, ids=lambda make: make.__name__)
def test_grouped_control_variate_sums_equal_the_dense_ones(make_model):
    # In q and, where the rows have a cut, in the likelihood's parameters theta.
    oracles = _model_oracles(make_model)
    spaces = [oracles]
    likelihood = oracles.in_likelihood_parameters()
    if likelihood is not None:
        assert likelihood._space.grouped is not None
        spaces.append(likelihood)
    for space in spaces:
        dense_sums = (
            space._functions.sums if space.expansion == "unconstrained" else space._space.sums
        )
        for q in _points(oracles.n_params, 9):
            point = space.expansion_point(q)
            gradient, hessian = space.gradient_hessian_sums(point)
            expected = dense_sums(point, *space._gather(np.arange(N_ROWS)))
            np.testing.assert_allclose(gradient, expected[0], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(hessian, expected[1], rtol=1e-9, atol=1e-9)


def test_rows_without_groups_keep_the_dense_sums():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(N_ROWS, 2))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        pm.Bernoulli("y", logit_p=X @ b, observed=rng.binomial(1, 0.5, N_ROWS))
    assert _oracles(model)._functions.grouped_search() is None


def test_the_direct_coordinates_are_the_shared_coefficients():
    oracles = _model_oracles(noncentred_logistic)
    grouped = oracles._functions.grouped_search()
    # q = (mu, log sigma, z[30], b[3]): only b is read other than through the table.
    np.testing.assert_array_equal(grouped.direct, np.arange(32, 35))
    assert grouped.n_groups == (30,) and grouped.psi_size == 4


def test_saturated_logistic_rows_have_a_finite_hessian():
    # Group effects of +-60 make 1 - sigmoid(eta) round to 0: PyTensor's Hessian of the raw
    # rows' graph is NaN there; the grouped rows are stabilised first (softplus).
    oracles = _model_oracles(noncentred_logistic)
    q = np.zeros(oracles.n_params)
    for mu in (60.0, -60.0):
        q[0] = mu
        totals = oracles.search_sums(q, slice(0, N_ROWS), with_hessian=True)
        assert np.all(np.isfinite(totals.hessian)) and np.all(np.isfinite(totals.outer))


def test_the_reference_search_reads_every_row_of_a_hierarchy_from_its_first_iteration():
    # A minibatch leaves small groups without rows, where the direction test sees no noise in
    # their scores: on 1,000 groups and 3e5 rows the iterates drifted (mu at -300 after 100
    # iterations). With grouped rows the search starts on all rows (700 rows by default here).
    model = noncentred_logistic()
    with model:
        reference = pms.find_reference_point(random_seed=1)
    assert reference.batch_sizes[0] == N_ROWS
    assert reference.converged

"""The model adapter: per-row log-likelihood equals PyMC's own elementwise logp on every kind."""

from __future__ import annotations

import importlib.util
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from pymc.blocking import DictToArrayBijection

import pymc_subsample as pms
from pymc_subsample import SubsampleWarning
from pymc_subsample.model import build_oracles, find_row_layout

N = 300
RNG = np.random.default_rng(7)
X = RNG.normal(size=(N, 3))
Y = X @ np.array([1.0, -2.0, 0.5]) + RNG.normal(size=N)
GROUP = RNG.integers(0, 4, size=N)


def numpy_regression():
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 10, shape=3)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", X @ beta, sigma, observed=Y)
    return model


def data_with_dims():
    with pm.Model(coords={"obs": range(N), "feature": range(3)}) as model:
        x = pm.Data("x", X, dims=("obs", "feature"))
        y = pm.Data("y_data", Y, dims="obs")
        beta = pm.Normal("beta", 0, 10, dims="feature")
        pm.Normal("y", x @ beta, 1.0, observed=y, dims="obs")
    return model


def iid_student_t():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        nu = pm.Exponential("nu", 0.1)
        pm.StudentT("y", nu=nu, mu=mu, sigma=1.0, observed=Y)
    return model


def total_size():
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=Y, total_size=N)
    return model


def censored():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Censored("y", pm.Normal.dist(mu, 2.0), lower=-1.0, upper=1.0, observed=np.clip(Y, -1, 1))
    return model


def mv_normal_rows():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10, shape=2)
        chol, _, _ = pm.LKJCholeskyCov("chol", n=2, eta=2.0, sd_dist=pm.Exponential.dist(1.0))
        pm.MvNormal("y", mu, chol=chol, observed=X[:, :2])
    return model


def custom_dist():
    def logp(value, mu):
        return -0.5 * (value - mu) ** 2 - 0.5 * np.log(2 * np.pi)

    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.CustomDist("y", mu, logp=logp, observed=Y)
    return model


def hierarchical_two_observed():
    with pm.Model() as model:
        group_mean = pm.Normal("group_mean", 0, 5)
        group_sd = pm.HalfNormal("group_sd", 1)
        effect = pm.Normal("effect", group_mean, group_sd, shape=4)
        pm.Normal("y", effect[GROUP], 1.0, observed=Y)
        pm.Poisson("count", pt.exp(0.1 * effect[GROUP]), observed=RNG.poisson(1.0, size=N))
    return model


MODELS = [
    numpy_regression,
    data_with_dims,
    iid_student_t,
    total_size,
    censored,
    mv_normal_rows,
    custom_dist,
    hierarchical_two_observed,
]


def _reference_rows(model, layout, point):
    """Sum over row-aligned observed variables of PyMC's elementwise logp, per row."""
    fn = model.compile_logp(vars=list(layout.row_rvs), sum=False, jacobian=False)
    terms = [np.asarray(t).reshape(N, -1).sum(axis=1) for t in fn(point)]
    return np.sum(terms, axis=0)


def _jittered_point(model, seed):
    point = model.initial_point()
    rng = np.random.default_rng(seed)
    return {name: value + 0.2 * rng.normal(size=np.shape(value)) for name, value in point.items()}


def _modes():
    # CVM is PyTensor's C backend with Python fallbacks; strict "C" needs a BLAS library that
    # pip installs of PyTensor lack (Gemv has no C code without it).
    modes = ["NUMBA", "CVM"]
    if importlib.util.find_spec("jax") is not None:
        modes.append("JAX")
    return modes


@pytest.mark.parametrize("build", MODELS, ids=lambda f: f.__name__)
def test_rows_match_pymc_elementwise_logp(build):
    model = build()
    oracles = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    assert oracles.n_rows == N
    point = _jittered_point(model, seed=3)
    q = DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars}).data
    reference = _reference_rows(model, oracles.layout, point)
    idx = np.array([0, 5, 17, 5, N - 1], dtype=np.int64)  # a repeated row is fine here
    np.testing.assert_allclose(oracles.loglik_rows(q, idx), reference[idx], rtol=1e-8)
    all_rows = oracles.loglik_rows(q, np.arange(N))
    np.testing.assert_allclose(all_rows, reference, rtol=1e-8)
    # A slice reads a range of rows in place (a view where the data are C-ordered).
    np.testing.assert_allclose(oracles.loglik_rows(q, slice(0, N)), reference, rtol=1e-8)
    np.testing.assert_allclose(oracles.loglik_rows(q, slice(17, 61)), reference[17:61], rtol=1e-8)
    q_new = q + 0.01
    np.testing.assert_allclose(
        oracles.loglik_ratio_rows(q_new, q, idx),
        oracles.loglik_rows(q_new, idx) - oracles.loglik_rows(q, idx),
        atol=1e-10,
    )
    prior_terms = [*model.free_RVs, *model.potentials, *oracles.layout.full_rvs]
    expected_prior = model.compile_logp(vars=prior_terms)(point)
    assert oracles.log_prior(q) == pytest.approx(expected_prior, rel=1e-10)


@pytest.mark.parametrize("mode", _modes())
def test_backends_agree(mode):
    model = numpy_regression()
    point = model.initial_point()
    oracles = build_oracles(
        model, model.value_vars, initial_point=point, compile_kwargs={"mode": mode}
    )
    q = DictToArrayBijection.map(point).data + 0.1
    reference = _reference_rows(
        model,
        oracles.layout,
        {
            **point,
            **DictToArrayBijection.rmap(
                DictToArrayBijection.map(point).__class__(
                    q, DictToArrayBijection.map(point).point_map_info
                )
            ),
        },
    )
    idx = np.arange(0, N, 7)
    np.testing.assert_allclose(oracles.loglik_rows(q, idx), reference[idx], rtol=1e-8)


@pytest.mark.parametrize("order", ["C", "F"])
def test_ranges_of_rows_read_in_place_or_gathered(order):
    """Slices of rows give the values and sums of the same rows as indices, in either order.

    A C-ordered array is read through views; a Fortran-ordered one (whose row ranges are not
    contiguous) is gathered. Mixing up the two paths, or the range's bounds, fails this.
    """
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Normal("y", pm.math.dot(np.asarray(X, order=order), beta), 1.0, observed=Y)
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=2
    )
    q = np.array([0.3, -1.0, 0.2])
    np.testing.assert_allclose(
        oracles.loglik_rows(q, slice(40, 95)), oracles.loglik_rows(q, np.arange(40, 95))
    )
    np.testing.assert_allclose(
        oracles.score_rows(q, slice(0, 7)), oracles.score_rows(q, np.arange(7))
    )
    by_slices = oracles.gradient_hessian_sums(q, chunk_size=64)
    by_indices = oracles.gradient_hessian_sums(q, np.arange(N), chunk_size=64)
    for sliced, indexed in zip(by_slices, by_indices, strict=True):
        np.testing.assert_allclose(sliced, indexed, rtol=1e-12)


@pytest.mark.parametrize("rows", [slice(0, N), slice(13, 170), np.arange(3, N, 5)])
def test_search_sums_are_the_sums_of_the_per_row_functions(rows):
    """One pass of the reference search sums what the per-row functions give row by row.

    The loglik, gradient, outer products and Hessian of ``search_sums`` (several chunks, as a
    slice or as indices) against ``loglik_rows``, ``score_rows`` and ``gradient_hessian_sums``
    on the same rows: a chunk dropped or counted twice, an offset slice, or a transposed outer
    product fails this.
    """
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", pm.math.dot(X, beta), sigma, observed=Y)
    oracles = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    q = np.array([0.3, -1.0, 0.2, 0.4])
    indices = np.arange(N)[rows]
    sums = oracles.search_sums(q, rows, with_hessian=True, chunk_size=64)
    scores = oracles.score_rows(q, indices)
    np.testing.assert_allclose(sums.loglik, oracles.loglik_rows(q, indices).sum(), rtol=1e-12)
    np.testing.assert_allclose(sums.gradient, scores.sum(0), rtol=1e-10)
    np.testing.assert_allclose(sums.outer, scores.T @ scores, rtol=1e-10)
    oracles.freeze_shared()
    hessian = oracles.gradient_hessian_sums(q, indices)[1]
    np.testing.assert_allclose(sums.hessian, hessian, rtol=1e-10)
    assert oracles.search_sums(q, rows, with_hessian=False, chunk_size=64).hessian is None


def test_reduction_over_rows_is_refused():
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 10, shape=3)
        data = pt.as_tensor(X)
        standardised = (data - data.mean(0)) / data.std(0)
        pm.Normal("y", standardised @ beta, 1.0, observed=Y)
    with pytest.raises(ValueError, match="reduction over rows"):
        build_oracles(model, model.value_vars, initial_point=model.initial_point())


def test_observed_variables_of_different_lengths_subsample_the_long_one():
    short = RNG.normal(size=20_000 // 1000)  # 20 rows: off the row axis
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1.0, observed=Y)
        pm.Normal("calibration", mu, 1.0, observed=short)
    layout = find_row_layout(model)
    assert [rv.name for rv in layout.row_rvs] == ["y"]
    assert [rv.name for rv in layout.full_rvs] == ["calibration"]
    oracles = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    q = np.array([0.3])
    expected = model.compile_logp(vars=[model["mu"], model["calibration"]])({"mu": 0.3})
    assert oracles.log_prior(q) == pytest.approx(expected)


def test_large_off_row_observed_variable_warns():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1.0, observed=np.zeros(30_000))
        pm.Normal("other", mu, 1.0, observed=np.zeros(20_000))
    with pytest.warns(SubsampleWarning, match="evaluated in full"):
        find_row_layout(model)


def test_obs_dim_selects_rows_and_leaves_same_length_arrays_alone():
    # "weights" has N entries but lives on another dim: it must not be indexed by row.
    with pm.Model(coords={"obs": range(N), "knot": range(N)}) as model:
        weights = pm.Data("weights", np.linspace(0, 1, N), dims="knot")
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu + weights.sum(), 1.0, observed=Y, dims="obs")
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), obs_dim="obs"
    )
    idx = np.array([1, 2], dtype=np.int64)
    expected = -0.5 * (Y[idx] - 0.5 - weights.get_value().sum()) ** 2 - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(oracles.loglik_rows(np.array([0.5]), idx), expected)


def test_minibatch_data_is_refused():
    with pm.Model() as model:
        y_batch = pm.Minibatch(Y, batch_size=50)
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("y", mu, 1.0, observed=y_batch, total_size=N)
    with pytest.raises(ValueError, match=r"pm\.Minibatch"):
        find_row_layout(model)


def test_unknown_obs_dim_is_refused():
    with pytest.raises(ValueError, match="obs_dim='rows' is not a dimension"):
        find_row_layout(data_with_dims(), obs_dim="rows")


def test_set_data_is_seen_by_the_oracles():
    model = data_with_dims()
    oracles = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    q = np.array([1.0, -2.0, 0.5])
    before = oracles.loglik_rows(q, np.array([0], dtype=np.int64))
    with model:
        pm.set_data({"y_data": Y + 1.0})
    after = oracles.loglik_rows(q, np.array([0], dtype=np.int64))
    assert not np.allclose(before, after)


def test_no_warning_for_an_ordinary_model():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SubsampleWarning)
        model = numpy_regression()
        build_oracles(model, model.value_vars, initial_point=model.initial_point())


@pytest.mark.parametrize(
    "build", [numpy_regression, iid_student_t, hierarchical_two_observed], ids=lambda f: f.__name__
)
def test_per_row_gradients_match_finite_differences(build):
    model = build()
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), with_gradients=True
    )
    point = _jittered_point(model, seed=4)
    q = DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars}).data
    idx = np.array([3, 40, 299], dtype=np.int64)
    scores = oracles.score_rows(q, idx)
    assert scores.shape == (3, q.size)
    step = 1e-6
    for j in range(q.size):
        shift = np.zeros(q.size)
        shift[j] = step
        numeric = (oracles.loglik_rows(q + shift, idx) - oracles.loglik_rows(q - shift, idx)) / 2e-6
        np.testing.assert_allclose(scores[:, j], numeric, rtol=1e-5, atol=1e-6)
        prior_numeric = (oracles.log_prior(q + shift) - oracles.log_prior(q - shift)) / 2e-6
        assert oracles.log_prior_grad(q)[j] == pytest.approx(prior_numeric, rel=1e-5, abs=1e-6)


def test_functions_compile_at_first_use_and_are_shared_by_later_builds():
    # A reference search and the step built after it must not compile the model twice
    # (issue 14: 11.8 s + 9.4 s on a 1,000-row mixture), and a step compiles only what it calls.
    model = numpy_regression()
    first = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    functions = first._functions
    assert not functions.score.built and not functions.sums.built
    first.score_rows(first.initial_q, np.array([0, 1]))
    assert functions.score.built and not functions.sums.built
    second = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=2
    )
    assert second._functions is functions and second.proxy_order == 2
    # Each build keeps its own view of the data, so each step sees pm.set_data for itself.
    assert second._data is not first._data
    other = build_oracles(model, model.value_vars[:1], initial_point=model.initial_point())
    assert other._functions is not functions


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH])
def test_a_step_over_prior_only_variables_reads_one_batch_and_samples_the_prior(step_class):
    # A hyperparameter that no row sees has row differences of exactly 0: the test decides on
    # its first batch, and the chain must sample the prior. scale ~ HalfNormal(1) is sampled
    # alone (the offset has its own step); its first and second moments, sqrt(2/pi) and 1, are
    # checked at 4.5 Monte Carlo SEs (false failure about 1e-5 per check). A step that accepted
    # every proposal, or ignored the prior ratio, is off by tens of SEs.
    rng = np.random.default_rng(3)
    x = rng.normal(size=500)
    with pm.Model(), warnings.catch_warnings():
        warnings.simplefilter("ignore", SubsampleWarning)  # the offset's tests read all rows
        scale = pm.HalfNormal("scale", 1.0)
        offset = pm.Normal("offset", 0.0, 1.0)
        pm.Normal("y", offset * x, 1.0, observed=0.3 * x + rng.normal(size=500))
        steps = [step_class([scale], batch_size=50), step_class([offset], batch_size=50)]
        idata = pm.sample(
            draws=4000,
            tune=500,
            chains=2,
            cores=1,
            step=steps,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert np.all(idata.sample_stats["n_data"].values[..., 0] == 50)
    draws = idata.posterior["scale"].values
    for moment, exact in ((draws, np.sqrt(2 / np.pi)), (draws**2, 1.0)):
        mcse = moment.std() / np.sqrt(float(np.asarray(az.ess(moment))))
        assert abs(moment.mean() - exact) < 4.5 * mcse


@pytest.mark.parametrize("enabled_before", [True, False])
def test_collection_paused_restores_the_collector(enabled_before):
    """Compiling pauses Python's garbage collector and leaves it as it found it, even on errors."""
    import gc

    from pymc_subsample.model.compiled import collection_paused

    (gc.enable if enabled_before else gc.disable)()
    try:
        with pytest.raises(RuntimeError), collection_paused():
            assert not gc.isenabled()
            raise RuntimeError("compilation failed")
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_the_set_up_prior_is_the_prior_and_leaves_the_draws_prior_uncompiled():
    """The self-check and the reference search read the prior through its set-up functions.

    They run on PyTensor's Python linker at first, so that a step whose draws read the prior
    ratio's Numba kernel (the fused draw) compiles no prior of its own at set-up (0.7-0.9 s of
    a logistic regression's cold build). Caught if the set-up functions gave other values, or
    if the set-up compiled the draws' prior.
    """
    model = numpy_regression()
    with model:
        step = pms.AusterityMH()
    assert step.draw_path == "fused"
    functions = step.oracles._functions
    # The fused draw compiled the prior ratio's kernel; nothing compiled the prior.
    assert functions.prior_ratio.compiled and not functions.prior.compiled
    assert functions.setup_prior.built
    point = _jittered_point(model, seed=5)
    q = DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars}).data
    assert step.oracles.setup_log_prior(q) == pytest.approx(step.oracles.log_prior(q), rel=1e-12)
    assert step.oracles.setup_log_prior_ratio(q + 0.1, q) == pytest.approx(
        step.oracles.log_prior_ratio(q + 0.1, q), rel=1e-10, abs=1e-12
    )

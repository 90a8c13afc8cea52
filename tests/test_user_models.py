"""Ordinary PyMC models a user writes: each samples the right posterior or is refused in words.

Every test here failed on the code before the model-adapter fixes (a crash deep in PyTensor or
NumPy, a refusal that blamed the wrong feature, or a silently wrong posterior).

Statistical tolerances: exact posteriors come from conjugate algebra; the checks use exact MH
(``error_tolerance=0``) or control variates, whose only error is Monte Carlo. Tolerances are at
least 4 Monte Carlo standard errors at the ESS these runs reach (false-failure rate below 1e-4
per check) and detect the errors the old code made (sds 2x or 1.4x off, means tens of sds off).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import linear_regression_data, linear_regression_posterior

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "chains": 1}


def _draws(idata, name):
    values = idata.posterior[name].values
    return values.reshape(-1, *values.shape[2:])


def _full_row_logp(model, name, point):
    """Per-row log-likelihood of the observed variable ``name`` from PyMC itself."""
    rv = model[name]
    fn = model.compile_fn(model.logp(vars=[rv], sum=False)[0], point_fn=True)
    return np.asarray(fn(point))


def test_flat_priors_with_gradient_features_sample_the_ols_posterior():
    # pm.Flat / pm.HalfFlat priors: the prior's gradient and Hessian do not depend on the
    # parameters (before: DisconnectedInputError). With known sigma = 1 the posterior of beta
    # is exactly N(beta_ols, (X^T X)^-1).
    X, y = linear_regression_data(2000, seed=21)
    mean, sd = linear_regression_posterior(X, y, prior_sd=np.inf)
    with pm.Model():
        beta = pm.Flat("beta", shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y)
        ref = pms.find_reference_point()
        step = pms.AusterityMH(control_variate="taylor2", reference_point=ref, batch_size=100)
        idata = pm.sample(1500, tune=500, step=step, initvals=ref.initvals, random_seed=3, **SAMPLE)
    draws = _draws(idata, "beta")
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.3)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.25)


def test_half_flat_scale_has_gradients():
    X, y = linear_regression_data(500, seed=22)
    with pm.Model():
        beta = pm.Flat("beta", shape=3)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("y", X @ beta, sigma, observed=y)
        step = pms.AusterityMH(proposal="langevin", batch_size=100)
    q = step.oracles.initial_q
    assert np.all(np.isfinite(step.oracles.log_prior_grad(q)))


def test_compound_step_with_pymc_metropolis():
    # Before: "Sampler statistic accepted appears with different types" (bool against float).
    X, y = linear_regression_data(1000, seed=23)
    with pm.Model():
        beta = pm.Normal("beta", 0, 10, shape=3)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", X @ beta, sigma, observed=y)
        steps = [
            pms.AusterityMH([beta], error_tolerance=0.01, batch_size=200),
            pm.Metropolis([sigma]),
        ]
        idata = pm.sample(300, tune=300, step=steps, random_seed=4, **SAMPLE)
    assert idata.sample_stats["accepted"].dtype == np.float64
    assert abs(_draws(idata, "sigma").mean() - 1.0) < 0.15


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH, pms.SGFS])
def test_compound_step_with_pymc_nuts(step_class):
    # Before: "Sampler statistic warning appears with different types" (our relayed-warnings
    # stat declared as object, NUTS's as SamplerWarning), before the first draw.
    X, y = linear_regression_data(1000, seed=23)
    with pm.Model():
        beta = pm.Normal("beta", 0, 10, shape=3)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", X @ beta, sigma, observed=y)
        kwargs = {"batch_size": 200}
        if step_class is not pms.SGFS:
            kwargs["control_variate"] = None
        steps = [step_class([beta], **kwargs), pm.NUTS([sigma])]
        idata = pm.sample(100, tune=100, step=steps, random_seed=4, **SAMPLE)
    assert "diverging" in idata.sample_stats and "n_data" in idata.sample_stats
    assert np.isfinite(_draws(idata, "sigma")).all()


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH])
def test_default_step_beside_a_discrete_variable_pymc_assigns(step_class):
    # Before: the step with no vars took the discrete k too and refused it, so even
    # pm.sample(step=[pms.AusterityMH(), pm.BinaryMetropolis([k])]) failed. Now it takes the
    # continuous variables, as NUTS does, and pm.sample gives k its own step.
    #
    # Exact posterior: y_i ~ N(mu, 1), mu | k ~ N(0, s_k^2) with s = (1, 3), k ~ Bernoulli(0.3).
    # ybar is sufficient: p(k | y) is proportional to p(k) N(ybar; 0, s_k^2 + 1/N), and mu
    # given k is conjugate. With ybar = 2.5, P(k = 1 | y) = 0.70 (0.30 a priori); a k-step
    # that saw mu at its start (0) would give 0.125, one that held k 0 or 1. Tolerances: 0.08 on
    # P(k = 1) (about 4 Monte Carlo sds at the ESS of 2 x 1,000 draws of BinaryGibbsMetropolis,
    # above 300) and 4 posterior sds of mu on its mean (mu's posterior sd is 0.014; a wrong
    # mean would be off by the ridge's tens of sds); false-failure rate below 1e-4.
    rng = np.random.default_rng(11)
    n_rows, scales, prior_k = 5000, np.array([1.0, 3.0]), 0.3
    y = rng.normal(0.0, 1.0, n_rows)
    y += 2.5 - y.mean()
    ybar = y.mean()
    from scipy import stats

    weights = np.array([1 - prior_k, prior_k]) * stats.norm.pdf(
        ybar, 0.0, np.sqrt(scales**2 + 1 / n_rows)
    )
    p_k1 = weights[1] / weights.sum()
    with pm.Model():
        k = pm.Bernoulli("k", prior_k)
        mu = pm.Normal("mu", 0.0, pt.switch(pt.eq(k, 1), scales[1], scales[0]))
        pm.Normal("y", mu, 1.0, observed=y)
        idata = pm.sample(
            1000, tune=500, step=step_class(), random_seed=5, **{**SAMPLE, "chains": 2}
        )
    assert abs(_draws(idata, "k").mean() - p_k1) < 0.08, (_draws(idata, "k").mean(), p_k1)
    assert abs(_draws(idata, "mu").mean() - ybar) < 4 / np.sqrt(n_rows)


def test_set_data_to_fewer_rows_uses_the_new_rows():
    # Before: IndexError (the step kept N = 2000 and drew rows beyond the new data).
    X, y = linear_regression_data(2000, seed=24)
    mean, sd = linear_regression_posterior(X[:400], y[:400], prior_sd=10.0)
    with pm.Model():
        X_data = pm.Data("X", X)
        y_data = pm.Data("y_obs", y)
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Normal("y", X_data @ beta, 1.0, observed=y_data, shape=X_data.shape[0])
        step = pms.AusterityMH(error_tolerance=0.0, batch_size=100)
        pm.set_data({"X": X[:400], "y_obs": y[:400]})
        idata = pm.sample(3000, tune=1000, step=step, random_seed=5, **SAMPLE)
    assert step.n_rows == 400
    assert np.all(idata.sample_stats["n_data"].values == 400)
    draws = _draws(idata, "beta")
    # ESS about 300 per coefficient: the sd's Monte Carlo error is about 4%.
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.2)
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.3)


def test_control_variate_step_reused_after_set_data_with_new_values():
    # Before: the gradient and Hessian sums of the old data stayed, 48-159 sd off.
    X, y = linear_regression_data(2000, seed=25)
    mean, sd = linear_regression_posterior(X, 2 * y, prior_sd=10.0)
    with pm.Model():
        y_data = pm.Data("y_obs", y)
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y_data)
        step = pms.AusterityMH(control_variate="taylor2", batch_size=100)
        pm.set_data({"y_obs": 2 * y})
        idata = pm.sample(1500, tune=500, step=step, random_seed=6, **SAMPLE)
    draws = _draws(idata, "beta")
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.3)


def test_set_data_with_mismatched_row_counts_is_explained():
    X, y = linear_regression_data(300, seed=26)
    with pm.Model():
        X_data = pm.Data("X", X)
        y_data = pm.Data("y_obs", y)
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Normal("y", X_data @ beta, 1.0, observed=y_data, shape=X_data.shape[0])
        step = pms.AusterityMH(batch_size=100)
        X_data.set_value(X[:100])  # y left at 300 rows
        with pytest.raises(ValueError, match="different lengths"):
            step.setup_chain(np.random.default_rng(0), 10, 10)


def test_total_size_scales_every_row_as_pymc_does():
    # Before: total_size was dropped, so the posterior was that of 1/4 of the data (sds 2x).
    X, y = linear_regression_data(500, seed=27)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 10, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y, total_size=2000)
        step = pms.AusterityMH(batch_size=100)
    point = model.initial_point()
    point["beta"] = np.array([0.5, -1.0, 0.2])
    rows = step.oracles.loglik_rows(np.array([0.5, -1.0, 0.2]), np.arange(500))
    np.testing.assert_allclose(rows.sum(), _full_row_logp(model, "y", point).sum(), rtol=1e-10)


def test_summed_custom_dist_logp_is_refused_in_words():
    def summed_logp(value, mu):
        return pt.sum(pm.logp(pm.Normal.dist(mu, 1.0), value))

    with pm.Model():
        mu = pm.Normal("mu")
        pm.CustomDist("y", mu, logp=summed_logp, observed=np.zeros(50))
        with pytest.raises(ValueError, match="single summed value, not one term per row"):
            pms.AusterityMH(batch_size=10)


@pytest.mark.parametrize("with_dims", [True, False])
def test_integer_observed_data_in_pm_data(with_dims):
    # pm.Data stores int64 as int32 and the observed value is a cast node. Before: refused
    # with a message about per-row latent variables.
    rng = np.random.default_rng(28)
    X = rng.normal(size=(300, 2))
    y = rng.binomial(1, 0.5, size=300)
    coords = {"obs": range(300), "feature": ["a", "b"]} if with_dims else None
    with pm.Model(coords=coords) as model:
        X_data = pm.Data("X", X, dims=("obs", "feature") if with_dims else None)
        y_data = pm.Data("y_obs", y, dims="obs" if with_dims else None)
        beta = pm.Normal(
            "beta", 0, 1, dims="feature" if with_dims else None, shape=None if with_dims else 2
        )
        pm.Bernoulli("y", logit_p=X_data @ beta, observed=y_data, dims="obs" if with_dims else None)
        step = pms.AusterityMH(batch_size=50)
    q = np.array([0.3, -0.7])
    point = {"beta": q}
    idx = np.array([0, 5, 17, 299])
    np.testing.assert_allclose(
        step.oracles.loglik_rows(q, idx), _full_row_logp(model, "y", point)[idx], rtol=1e-12
    )


def test_observed_value_that_is_an_expression_of_data():
    rng = np.random.default_rng(29)
    z = np.exp(rng.normal(size=200))
    with pm.Model() as model:
        z_data = pm.Data("z", z)
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pt.log(z_data))
        step = pms.AusterityMH(batch_size=50)
    idx = np.array([1, 50, 199])
    np.testing.assert_allclose(
        step.oracles.loglik_rows(np.array([0.4]), idx),
        _full_row_logp(model, "y", {"mu": np.array(0.4)})[idx],
        rtol=1e-12,
    )


def test_missing_observed_values_are_imputed_by_pymc_beside_the_step():
    # Once refused; now the observed rows are subsampled (tests/test_missing_values.py).
    X, y = linear_regression_data(200, seed=30)
    y[:3] = np.nan
    with pm.Model():
        beta = pm.Normal("beta", 0, 1, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y)
        step = pms.AusterityMH(batch_size=50)
    assert [v.name for v in step.vars] == ["beta"]
    assert step.oracles.n_rows == 200


def test_per_row_latents_are_refused_before_gradients_are_built():
    # Before: a raw PyTensor Alloc error from the gradient graphs of find_reference_point.
    with pm.Model():
        theta = pm.Normal("theta", 0, 5, shape=8)
        pm.Normal("y", theta, 1.0, observed=np.arange(8.0))
        with pytest.raises(ValueError, match=r"Free variables \['theta'\] have one entry per row"):
            pms.find_reference_point()


@pytest.mark.parametrize(
    "likelihood",
    [
        pytest.param(lambda theta, y: pm.Uniform("y", 0, theta, observed=y), id="uniform"),
        pytest.param(
            lambda theta, y: pm.Truncated("y", pm.Normal.dist(0, 1), upper=theta, observed=y),
            id="truncated",
        ),
    ],
)
def test_support_that_depends_on_a_parameter_is_refused(likelihood):
    # Before: rows outside the batch could not reject, and 100% of draws sat where the full
    # likelihood is zero (16 sd off).
    y = np.random.default_rng(31).uniform(0, 3, size=400)
    with pm.Model():
        theta = pm.HalfNormal("theta", 10)
        likelihood(theta, y)
        with pytest.raises(
            ValueError, match=r"support that depends on the\s+parameters \['theta'\]"
        ):
            pms.AusterityMH(batch_size=50)


def test_fixed_support_with_parameters_inside_is_accepted():
    # A data-only bound (y >= 0) next to a parameter (mu) is not a parameter-dependent support.
    y = np.abs(np.random.default_rng(32).normal(size=300))
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Truncated("y", pm.Normal.dist(mu, 1), lower=0, observed=y)
        step = pms.AusterityMH(batch_size=50)
    assert step.n_rows == 300


def test_time_series_likelihood_is_refused_in_words():
    y = np.cumsum(np.random.default_rng(33).normal(size=300))
    with pm.Model():
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.GaussianRandomWalk("y", sigma=sigma, init_dist=pm.Normal.dist(0.0, 10.0), observed=y)
        with pytest.raises(ValueError, match=r"time series over the rows.*pm.sample\(\) \(NUTS\)"):
            pms.AusterityMH(batch_size=50)


def test_categorical_bound_read_through_a_shape_is_fixed():
    # pm.OrderedLogistic's bound y <= len(p) - 1 reads p, which depends on the parameters, only
    # through its shape: a fixed support. Before, the model was refused as if the bound were
    # free; now its per-row terms are checked against PyMC's at set-up and summed here.
    rng = np.random.default_rng(34)
    x = rng.normal(size=300)
    y = rng.integers(0, 3, size=300)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0)
        cutpoints = pm.Normal(
            "cutpoints",
            0.0,
            5.0,
            shape=2,
            transform=pm.distributions.transforms.ordered,
            initval=np.array([-1.0, 1.0]),
        )
        pm.OrderedLogistic("y", eta=b * x, cutpoints=cutpoints, observed=y, compute_p=False)
        step = pms.AusterityMH(batch_size=50)
    point = model.initial_point()
    q = step.oracles.initial_q
    rows = step.oracles.loglik_rows(q, np.arange(300, dtype="int64"))
    expected = model.compile_logp(vars=[model["y"]], sum=False)(point)[0]
    np.testing.assert_allclose(rows, expected, rtol=1e-10)


def test_uncentred_regression_has_a_usable_reference_point():
    # Years near 4000 as the predictor (posteriordb's kilpisjarvi): the negative Hessian has a
    # condition number of about 1e12, yet the posterior is proper and well identified. The
    # singularity test used to compare raw eigenvalues and refused it as improper; in
    # correlation form its smallest eigenvalue is about 1e-5, far above the 1e-10 threshold.
    rng = np.random.default_rng(35)
    years = np.arange(3952.0, 4014.0)
    y = 9.3 + 0.02 * (years - years.mean()) + rng.normal(0.0, 1.0, size=years.size)
    with pm.Model():
        alpha = pm.Normal("alpha", 9.3, 100.0)
        beta = pm.Normal("beta", 0.0, 1.0 / 30.0)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("y", alpha + beta * years, sigma, observed=y)
        ref = pms.find_reference_point(random_seed=1)
    assert ref.failure is None


def _bounded_regression(likelihood: str) -> pm.Model:
    rng = np.random.default_rng(5)
    x = rng.normal(size=300)
    y = np.abs(0.5 + 0.8 * x + rng.normal(size=300))
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 5.0)
        s = pm.HalfNormal("s", 2.0)
        mu = a + b * x
        if likelihood == "truncated_below":
            pm.Truncated("y", pm.Normal.dist(mu, s), lower=0.0, observed=y)
        elif likelihood == "truncated_above":
            pm.Truncated("y", pm.Normal.dist(mu, s), upper=5.0, observed=y)
        elif likelihood == "censored_below":
            pm.Censored("y", pm.Normal.dist(mu, s), lower=0.2, upper=None, observed=y + 0.2)
        else:  # a CustomDist whose log-density has no derivative where it is used

            def logp(value, mu, sigma):
                return pm.logp(pm.Normal.dist(mu, sigma), value) + pt.sqrt(
                    pt.maximum(sigma - 10.0, 0.0)
                )

            pm.CustomDist("y", mu, s, logp=logp, observed=y)
    return model


@pytest.mark.parametrize("likelihood", ["truncated_below", "truncated_above", "censored_below"])
def test_bounded_likelihoods_have_pymcs_gradient(likelihood):
    """An infinite bound of pm.Truncated / pm.Censored drops out of the rows' terms, as in PyMC.

    PyMC folds constant inputs before reading a distribution's log-probability, and these
    distributions keep an infinite bound's terms when the bound is not a constant. The rows'
    graph kept them (the same values), and the truncated normal's gradient in the scale was
    NaN: the reference search failed, every Hamiltonian trajectory was rejected and tuning
    ended in a crash. The rows' gradient over all rows must be PyMC's, at two points.
    """
    model = _bounded_regression(likelihood)
    point = model.initial_point()
    with model:
        step = pms.AusterityMH(proposal="random_walk", control_variate=None)
    oracles = step.oracles
    dlogp = model.compile_dlogp()
    for shift in (0.0, 0.3):
        q = oracles.initial_q + shift
        ours = oracles.gradient_on_rows(None)(q)
        shifted = {name: value + shift for name, value in point.items()}
        np.testing.assert_allclose(ours, dlogp(shifted), rtol=1e-9, atol=1e-9)


def test_nan_gradients_of_the_rows_leave_the_default_on_a_random_walk():
    """A log-density whose gradient is NaN where it is finite: gradient proposals cannot move.

    Every trajectory would be rejected as non-finite and the chain would never move (during
    tuning the step size shrank to 0, and PyMC crashed). The default says so and runs the
    random walk, which moves; an explicit gradient-based proposal is refused, naming the cause.
    """
    model = _bounded_regression("custom_without_derivative")
    with model:
        with pytest.warns(pms.SubsampleWarning, match="random-walk proposal instead"):
            step = pms.AusterityMH()
        assert step.proposal_kind == "random_walk"
        idata = pm.sample(300, tune=500, step=step, random_seed=2, **SAMPLE)
    assert idata.sample_stats["accepted"].values.mean() > 0.05
    with model, pytest.raises(ValueError, match=r"proposal='hmc' cannot be used.*maximum"):
        pms.MinibatchBarkerMH(proposal="hmc", control_variate=None)

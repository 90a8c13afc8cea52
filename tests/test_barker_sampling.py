"""MinibatchBarkerMH inside pm.sample: exact (tempered) posteriors, stats, bad input."""

from __future__ import annotations

import math

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data, linear_regression_model, linear_regression_posterior
from conjugate import tempered_gaussian_mean_data

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def _ess(idata, name):
    return np.asarray(az.ess(idata, var_names=[name])[name]).ravel()


@pytest.mark.parametrize("correction_sd", [1.0, 1.2])
def test_tempered_gaussian_mean_matches_exact_tempered_posterior(correction_sd):
    # x_i ~ N(mu, 1), mu ~ N(0, 10^2), T = 100: the target is the tempered posterior with
    # precision N / T + 1/100. ESS > 900 bounds the Monte Carlo error of the mean by 0.033 sd,
    # so 0.15 sd is 4.5 standard errors (plus the test's own CLT error, measured near 0);
    # sds within 10% (Monte Carlo error about 2.4%). Ignoring T (targeting the untempered
    # posterior) would shrink the sd tenfold. With correction_sd = 1.2 batches pass with
    # s^2 up to 1.44, and some must (the setting acts).
    n_rows, temperature = 20_000, 100.0
    x, mean, sd = tempered_gaussian_mean_data(n_rows, temperature, seed=3)
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("x", mu, 1.0, observed=x)
        step = pms.MinibatchBarkerMH(
            temperature=temperature, batch_size=100, correction_sd=correction_sd
        )
        idata = pm.sample(
            draws=4000, tune=1000, chains=3, cores=1, step=step, random_seed=2, **SAMPLE
        )
    draws = idata.posterior["mu"].values.ravel()
    assert _ess(idata, "mu").min() > 900
    assert abs(draws.mean() - mean) / sd < 0.15
    assert abs(draws.std() / sd - 1) < 0.1
    stats = idata.sample_stats
    assert np.all(stats["temperature"].values == temperature)
    assert stats["n_data"].values.mean() < n_rows / 2
    variances = stats["variance"].values[~stats["full_data"].values]
    assert np.all(variances < correction_sd**2)
    assert (correction_sd == 1.0) or np.any(variances >= 1.0)


def test_untempered_linear_regression_matches_exact_posterior():
    # At T = 1 the test needs most rows (see the class notes) but must still be right: means
    # within 0.15 sd (>= 4.5 Monte Carlo standard errors at ESS > 700) and sds within 12%.
    X, y = linear_regression_data(2000, seed=5)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        step = pms.MinibatchBarkerMH(batch_size=200)
        idata = pm.sample(
            draws=5000, tune=1000, chains=3, cores=1, step=step, random_seed=4, **SAMPLE
        )
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    assert _ess(idata, "beta").min() > 700
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.15)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.12)


def test_stats_names_and_dtypes(small_regression):
    with small_regression[0]:
        idata = pm.sample(
            draws=50,
            tune=50,
            chains=1,
            step=pms.MinibatchBarkerMH(batch_size=50, error_bound=0.9),
            random_seed=1,
            **SAMPLE,
        )
    stats = idata.sample_stats
    expected = {
        "accepted": np.float64,
        "n_data": np.int64,
        "n_batches": np.int64,
        "full_data": np.bool_,
        "variance": np.float64,
        "clt_error": np.float64,
        "nonfinite_proposal": np.bool_,
        "n_grad_rows": np.int64,
        "scaling": np.float64,
        "temperature": np.float64,
    }
    for name, dtype in expected.items():
        assert stats[name].dtype == dtype, name
    assert np.all(stats["n_grad_rows"].values == 0)  # random walk: no gradients
    partial = ~stats["full_data"].values
    assert np.all(stats["clt_error"].values[partial] <= 0.9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 0.0}, "temperature must be a positive"),
        ({"temperature": -2.0}, "temperature must be a positive"),
        ({"temperature": math.nan}, "temperature must be a positive"),
        ({"batch_size": 1}, "batch_size must be an integer >= 2"),
        ({"error_bound": 0.0}, r"error_bound must be in \(0, 1\)"),
        ({"error_bound": 1.5}, r"error_bound must be in \(0, 1\)"),
        ({"correction_sd": 0.0}, r"correction_sd must be in \(0, 1.5\]"),
        ({"correction_sd": 1.9}, r"correction_sd must be in \(0, 1.5\]"),
    ],
)
def test_bad_input(small_regression, kwargs, message):
    with small_regression[0], pytest.raises(ValueError, match=message):
        pms.MinibatchBarkerMH(**kwargs)


def test_barker_tuning_enlarges_small_steps():
    assert pms.step_methods.barker.barker_tune(1.0, 0.49) == 2.0
    assert pms.step_methods.barker.barker_tune(1.0, 0.2) == 1.0
    assert pms.step_methods.barker.barker_tune(1.0, 0.0) == 0.1

"""SGFS inside pm.sample: a Gaussian posterior at large step size, stats, bad input."""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data, linear_regression_model, linear_regression_posterior

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def test_linear_regression_posterior_at_large_step_size():
    # The posterior is Gaussian, so SGFS at large step size samples it (Bernstein-von Mises is
    # exact). ESS > 400 bounds the Monte Carlo error of a mean by 0.05 sd: means within 0.2 sd
    # (4 standard errors) and sds within 12%.
    X, y = linear_regression_data(2000, seed=5)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        step = pms.SGFS(batch_size=200, step_size=100.0)
        idata = pm.sample(
            draws=3000,
            tune=500,
            chains=2,
            cores=1,
            step=step,
            initvals={"beta": mean},
            random_seed=4,
            **SAMPLE,
        )
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    assert np.asarray(az.ess(idata)["beta"]).min() > 400
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.2)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.12)
    stats = idata.sample_stats
    assert np.all(stats["n_data"].values == 200)
    assert stats["n_data"].dtype == np.int64 and stats["nonfinite_update"].dtype == np.bool_
    assert np.all(stats["step_size"].values == 100.0)
    assert np.all(stats["condition_number"].values >= 1.0)


def test_step_size_schedule_is_applied_and_recorded(small_regression):
    with small_regression[0]:
        schedule = pms.PolynomialStepSize(a=1.0, b=9.0, c=0.5)
        idata = pm.sample(
            draws=5,
            tune=5,
            chains=1,
            step=pms.SGFS(batch_size=100, step_size_schedule=schedule),
            random_seed=1,
            **SAMPLE,
        )
    steps = idata.sample_stats["step_size"].values.ravel()
    np.testing.assert_allclose(steps, [schedule(t) for t in range(6, 11)])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_size": 0.0}, "step_size must be a positive"),
        ({"step_size": -1.0}, "step_size must be a positive"),
        ({"step_size": 1.0, "step_size_schedule": lambda t: 1.0}, "not both"),
        ({"batch_size": 1}, "batch_size must be an integer >= 2"),
        ({"batch_size": 401}, "larger than the N=400 rows"),
        ({"fisher": "block"}, "fisher must be one of"),
        ({"batch_size": 100, "preconditioner": -np.eye(3)}, "symmetric positive definite"),
        ({"batch_size": 100, "preconditioner": np.ones(2)}, r"shape \(3, 3\)"),
        ({"adapt_fisher": "never"}, "adapt_fisher must be one of"),
    ],
)
def test_bad_input(small_regression, kwargs, message):
    with small_regression[0], pytest.raises(ValueError, match=message):
        pms.SGFS(**kwargs)


def test_discrete_variables_are_refused():
    with pm.Model():
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", k, 1.0, observed=np.zeros(20))
        with pytest.raises(ValueError, match="Discrete variables"):
            pms.SGFS(batch_size=10)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_same_seed_same_draws_whatever_cores_and_fisher_restarts_per_chain():
    # Chain 1 after chain 0 in one process (cores=1) must equal chain 1 alone in its own
    # process (cores=2): the Fisher average and step counter restart for every chain.
    X, y = linear_regression_data(1000, seed=3)
    mean, _ = linear_regression_posterior(X, y, prior_sd=10.0)
    runs = []
    for cores in (1, 2):
        with linear_regression_model(X, y):
            runs.append(
                pm.sample(
                    draws=30,
                    tune=30,
                    chains=2,
                    cores=cores,
                    step=pms.SGFS(batch_size=100),
                    initvals={"beta": mean},
                    random_seed=5,
                    **SAMPLE,
                )
            )
    sequential, parallel = runs
    assert np.array_equal(sequential.posterior["beta"].values, parallel.posterior["beta"].values)
    condition = sequential.sample_stats["condition_number"].values
    assert not np.array_equal(condition[0], condition[1])  # each chain has its own Fisher


def test_default_start_is_the_reference_with_its_fisher_information():
    # With no arguments SGFS finds the reference point once, seeds the Fisher average with the
    # empirical Fisher information there, and moves a far first point (the model's initial
    # point, all zeros, hundreds of sds away) to a draw near the reference.
    X, y = linear_regression_data(5_000, seed=21)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        step = pms.SGFS(batch_size=200)
    reference = step._reference
    assert reference is not None and step.dropped_default == ""
    np.testing.assert_allclose(reference.q, mean, atol=0.05 * sd.min())
    np.testing.assert_allclose(reference.fisher, X.T @ X / 5_000, atol=0.1)  # unit noise: ~I
    step.tune = True
    step.reset_tuning()
    assert step.fisher is reference.fisher and step.fisher_count == 5_000 // 200
    far = np.zeros(3)
    moved = reference.chain_start(far, np.random.default_rng(1))
    assert np.all(np.abs(moved - mean) / sd < 6)
    near = mean + 0.5 * sd
    np.testing.assert_array_equal(reference.chain_start(near, np.random.default_rng(1)), near)


def test_start_initial_keeps_pymcs_start_and_refuses_a_reference_point(small_regression):
    model, _, _ = small_regression
    with model:
        step = pms.SGFS(batch_size=100, start="initial")
        assert step._reference is None
        with pytest.raises(ValueError, match="start='reference'"):
            pms.SGFS(batch_size=100, start="initial", reference_point={"beta": np.zeros(3)})

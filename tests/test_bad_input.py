"""Every rejected input raises with a message that names the argument and the fix."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_subsample as pms


def test_model_without_observed_data():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Potential("likelihood", -(mu**2))
        with pytest.raises(ValueError, match=r"no observed variables.*CustomDist"):
            pms.AusterityMH()


def test_discrete_variables_are_refused():
    with pm.Model():
        rate = pm.Exponential("rate", 1.0)
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", rate + k, 1.0, observed=np.zeros(20))
        with pytest.raises(ValueError, match=r"Discrete variables \['k'\].*pm.Metropolis"):
            pms.AusterityMH([rate, k])
        # With no vars the step takes the continuous ones, as NUTS does.
        assert [v.name for v in pms.AusterityMH(control_variate=None).vars] == ["rate_log__"]


def test_a_model_with_only_discrete_variables_is_refused():
    with pm.Model():
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", k, 1.0, observed=np.zeros(20))
        with pytest.raises(ValueError, match=r"Discrete variables \['k'\]"):
            pms.AusterityMH()


@pytest.mark.parametrize("value", [-0.1, 0.5, 1.0, float("nan"), "small"])
def test_error_tolerance_range(small_regression, value):
    with small_regression[0], pytest.raises(ValueError, match=r"error_tolerance must be in \[0"):
        pms.AusterityMH(error_tolerance=value)


@pytest.mark.parametrize("value", [1, 0, -5, 2.5, True])
def test_batch_size(small_regression, value):
    with small_regression[0], pytest.raises(ValueError, match="batch_size must be an integer >= 2"):
        pms.AusterityMH(batch_size=value)


def test_tune_interval(small_regression):
    with small_regression[0], pytest.raises(ValueError, match="tune_interval must be"):
        pms.AusterityMH(tune_interval=0)


@pytest.mark.parametrize("value", [0.0, -1.0, np.inf])
def test_scaling(small_regression, value):
    with small_regression[0], pytest.raises(ValueError, match="scaling must be a positive"):
        pms.AusterityMH(scaling=value)


@pytest.mark.parametrize(
    ("cov", "message"),
    [
        (np.ones(2), r"shape \(3,\) or \(3, 3\)"),
        (np.array([1.0, -1.0, 1.0]), "positive finite variances"),
        (np.array([[1, 2, 0], [0, 1, 0], [0, 0, 1.0]]), "symmetric"),
        (np.diag([1.0, -1.0, 1.0]), "positive definite"),
    ],
)
def test_proposal_cov(small_regression, cov, message):
    with small_regression[0], pytest.raises(ValueError, match=message):
        pms.AusterityMH(proposal_cov=cov)


def test_compile_kwargs_type(small_regression):
    with small_regression[0], pytest.raises(TypeError, match="compile_kwargs must be a dict"):
        pms.AusterityMH(compile_kwargs="NUMBA")


def test_reduction_over_rows_fails_self_check():
    X = np.random.default_rng(0).normal(size=(100, 2))
    with pm.Model():
        beta = pm.Normal("beta", shape=2)
        centred = pt.as_tensor(X) - pt.as_tensor(X).mean(0)
        pm.Normal("y", centred @ beta, 1.0, observed=np.zeros(100))
        with pytest.raises(ValueError, match=r"Self-check failed.*in numpy before"):
            pms.AusterityMH()


def test_nonfinite_initial_loglik():
    y = np.zeros(50)
    y[7] = np.nan
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pt.as_tensor(y))
        with pytest.raises(ValueError, match=r"not finite at the initial point for rows \[7\]"):
            pms.AusterityMH()


def test_nonfinite_rows_are_found_across_chunks(monkeypatch):
    """The start's finiteness check reads the rows range by range: rows in later ranges count.

    With ranges of 7 rows, rows 7, 20 and 49 lie in the second, third and last range; an
    offset dropped from a range's indices reports rows 0 and 6 instead, and fails this.
    """
    import pymc_subsample.model.self_check as self_check_module

    monkeypatch.setattr(self_check_module, "_FINITE_CHUNK", 7)
    y = np.zeros(50)
    y[[7, 20, 49]] = np.nan
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pt.as_tensor(y))
        with pytest.raises(ValueError, match=r"initial point for rows \[7, 20, 49\] \(3 rows"):
            pms.AusterityMH()


def test_per_row_latent_variable_is_explained():
    with pm.Model():
        z = pm.Normal("z", shape=40)
        pm.Normal("y", z, 1.0, observed=np.zeros(40))
        with pytest.raises(ValueError, match=r"Free variables \['z'\] have one entry per row"):
            pms.AusterityMH()


def test_batch_size_at_least_n_rows_warns_and_runs_exact(small_regression):
    with (
        small_regression[0],
        pytest.warns(pms.SubsampleWarning, match="uses all rows and is the exact test"),
    ):
        step = pms.AusterityMH(batch_size=1000)
    assert step.test.exact(step)


def test_not_assigned_automatically(small_regression):
    from pymc.step_methods.compound import Competence

    model = small_regression[0]
    assert pms.AusterityMH.competence(model["beta"], True) == Competence.INCOMPATIBLE


@pytest.mark.parametrize(
    "make_step",
    [
        lambda var: pms.SGFS([var], batch_size=50),
        lambda var: pms.AusterityMH([var], proposal="langevin"),
        lambda var: pms.MinibatchBarkerMH([var], control_variate="taylor1"),
    ],
)
def test_gradients_for_prior_only_variables_are_refused_clearly(make_step):
    x = np.random.default_rng(0).normal(size=300)
    with pm.Model():
        scale = pm.HalfNormal("scale", 1.0)
        offset = pm.Normal("offset", 0.0, scale)
        pm.Normal("y", offset * x, 1.0, observed=x)
        with pytest.raises(ValueError, match="No row of the likelihood depends on scale"):
            make_step(scale)


def test_arrays_whose_rows_do_not_align_are_named_with_their_shapes() -> None:
    """Covariates one row longer than the labels: the message shows both arrays' shapes."""
    import pytensor

    rng = np.random.default_rng(0)
    X = pytensor.shared(rng.normal(size=(3_000, 3)))
    y = pytensor.shared(rng.integers(0, 2, size=2_999))
    with pm.Model():
        beta = pm.Normal("beta", shape=3)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
        with pytest.raises(ValueError, match=r"data arrays read: .*\(2999,\).*\(3000, 3\)"):
            pms.AusterityMH()

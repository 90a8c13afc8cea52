"""Missing observed values (PyMC's imputation): observed rows subsampled, imputed ones by PyMC.

The conjugate model: y_i ~ N(mu, 1), mu ~ N(0, 10^2), N = 20,000 rows of which 50 are NaN.
The posterior of mu is the conjugate one on the 19,950 observed rows; each imputed value's
posterior is N(mu, 1) mixed over it. Given fixed imputed values, a step on mu alone must target
the conditional, whose 50 imputed values are 50 more rows: the test that holds them at 40 sees
the step drop their density (the conditional mean moves by 0.1, 14 posterior sds).

Tolerances: 4.5 Monte Carlo standard errors from ArviZ's ESS (for an sd, relative standard
error 1 / sqrt(2 ESS)) plus the steps' own approximation, as the package's other sampling tests
allow it (the sequential test at error_tolerance=0.001 biases means by 2-4% of an sd; one run
here gave an sd 3.3% low): 0.1 sd on a mean, 5% on an sd. From noise alone a false failure is
about one in 150,000 per comparison, under 1e-4 for the file, if the ESS estimates hold; at the
ESS of about 1,000 seen here the smallest errors detected are 0.25 sd in a mean and 15% in an sd.
"""

from __future__ import annotations

from typing import ClassVar

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data
from pymc.step_methods.compound import BlockedStep

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}
N_ROWS, N_MISSING, PRIOR_SD = 20_000, 50, 10.0
Z = 4.5
MEAN_BIAS, SD_BIAS = 0.1, 0.05  # the steps' own approximation, in sds and relative


def _data(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.normal(1.5, 1.0, size=N_ROWS)
    missing = rng.choice(N_ROWS, size=N_MISSING, replace=False)
    y[missing] = np.nan
    return y, missing


def _posterior(y_rows: np.ndarray) -> tuple[float, float]:
    """N(mean, sd^2) of mu given unit-variance rows ``y_rows`` and the N(0, 10^2) prior."""
    precision = y_rows.size + PRIOR_SD**-2
    return float(y_rows.sum() / precision), float(precision**-0.5)


def _model(y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, PRIOR_SD)
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def _draws(idata, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draws, and the ESS of their mean and of their sd (NUTS's antithetic draws make the
    first exceed the number of draws on a Gaussian, not the second)."""
    draws = np.asarray(idata.posterior[name])
    ess = [
        np.asarray(az.ess(idata, var_names=[name], method=method)[name]).ravel()
        for method in ("mean", "sd")
    ]
    return draws, ess[0], ess[1]


def _check(draws: np.ndarray, ess: float, ess_sd: float, mean: float, sd: float, what: str):
    mean_error = Z * sd / np.sqrt(ess) + MEAN_BIAS * sd
    sd_error = Z * sd / np.sqrt(2 * ess_sd) + SD_BIAS * sd
    assert abs(draws.mean() - mean) < mean_error, (what, draws.mean(), mean, mean_error)
    assert abs(draws.std() - sd) < sd_error, (what, draws.std(), sd, sd_error)


class Hold(BlockedStep):
    """Keep variables at their initial values: the other step then samples a conditional."""

    stats_dtypes_shapes: ClassVar[dict] = {}

    def __init__(self, vars):
        self.vars = vars

    def step(self, point):
        return point, []


def _steps():
    return {
        "austerity": lambda: pms.AusterityMH(),
        "barker": lambda: pms.MinibatchBarkerMH(),
    }


def test_default_vars_leave_the_imputed_values_to_pymc():
    y, _ = _data()
    with _model(y) as model:
        for step in (pms.AusterityMH(), pms.MinibatchBarkerMH(), pms.SGFS()):
            assert [v.name for v in step.vars] == ["mu"], type(step).__name__
        # Named explicitly, the imputed values are the step's too (their density is the prior).
        step = pms.AusterityMH([model["mu"], model["y_unobserved"]])
        assert [v.name for v in step.vars] == ["mu", "y_unobserved"]


@pytest.mark.parametrize("name", ["austerity", "barker"])
def test_joint_posterior_with_pymc_sampling_the_imputed_values(name):
    # pm.sample assigns NUTS to y_unobserved. The imputed values pool 50 entries, so their
    # pooled sd is checked to about 2% (pure Monte Carlo: mu's bias is 1e-4 of their spread).
    y, missing = _data()
    mean, sd = _posterior(y[~np.isnan(y)])
    with _model(y):
        step = _steps()[name]()
        idata = pm.sample(draws=2000, tune=1000, chains=2, step=step, random_seed=3, **SAMPLE)
    mu, ess, ess_sd = _draws(idata, "mu")
    _check(mu, ess[0], ess_sd[0], mean, sd, "mu")
    imputed, imputed_ess, imputed_ess_sd = _draws(idata, "y_unobserved")
    assert imputed.shape[-1] == missing.size
    # Each imputed value is mu + e, e ~ N(0, 1) independent: the pooled mean's error is mu's
    # plus the e's over all entries; the pooled spread is sqrt(1 + sd^2).
    pooled_se = np.hypot(sd / np.sqrt(ess[0]), 1.0 / np.sqrt(imputed_ess.sum()))
    assert abs(imputed.mean() - mean) < Z * pooled_se, (imputed.mean(), mean, pooled_se)
    spread = np.sqrt(1.0 + sd**2)
    spread_se = spread / np.sqrt(2 * imputed_ess_sd.sum())
    assert abs(imputed.std() - spread) < Z * spread_se, (imputed.std(), spread)
    # The joined deterministic has the data where observed, the imputed values where not.
    joined = np.asarray(idata.posterior["y"])
    np.testing.assert_array_equal(joined[..., ~np.isnan(y)][0, 0], y[~np.isnan(y)])
    np.testing.assert_array_equal(joined[..., missing[np.argsort(missing)]], imputed)


@pytest.mark.parametrize("name", ["austerity", "barker", "sgfs"])
def test_step_targets_the_conditional_given_the_imputed_values(name):
    # The imputed values held at 40 are 50 more unit-variance observations of mu: the
    # conditional mean is 0.1 (14 sds) above the observed rows' posterior, which is what a step
    # that dropped their density would sample. SGFS is approximate: its mean is held to 4.5
    # standard errors plus half a posterior sd, still 27 times finer than that shift.
    y, _ = _data()
    held = np.full(N_MISSING, 40.0)
    mean, sd = _posterior(np.concatenate([y[~np.isnan(y)], held]))
    with _model(y) as model:
        model.set_initval(model["y_unobserved"], held)
        step = {**_steps(), "sgfs": lambda: pms.SGFS()}[name]()
        hold = Hold([model.rvs_to_values[model["y_unobserved"]]])
        idata = pm.sample(
            draws=2000, tune=1000, chains=2, step=[step, hold], random_seed=4, **SAMPLE
        )
    np.testing.assert_array_equal(np.asarray(idata.posterior["y_unobserved"]), 40.0)
    mu, ess, ess_sd = _draws(idata, "mu")
    if name == "sgfs":
        assert abs(mu.mean() - mean) < Z * sd / np.sqrt(ess[0]) + 0.5 * sd, (mu.mean(), mean)
    else:
        _check(mu, ess[0], ess_sd[0], mean, sd, "mu")


def test_rows_are_read_where_their_covariates_are():
    # A regression with NaNs: the rows' terms on the original rows sum to PyMC's own
    # y_observed log-likelihood, a missing row's term is 0, and the imputed values' density
    # (in the prior part) reads only their rows, not all N.
    X, y = linear_regression_data(3_000, seed=5)
    missing = np.array([0, 17, 1_999, 2_999])
    y[missing] = np.nan
    with pm.Model() as model:
        beta = pm.Normal("beta", 0, 1, shape=X.shape[1])
        sigma = pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", X @ beta, sigma, observed=y)
        step = pms.AusterityMH(control_variate=None, proposal="random_walk")
    oracles = step.oracles
    assert oracles.n_rows == y.size
    q = oracles.initial_q + np.random.default_rng(0).normal(scale=0.2, size=oracles.n_params)
    point = {**model.initial_point(), **_point(step, q)}
    terms = oracles.loglik_rows(q, np.arange(y.size, dtype="int64"))
    np.testing.assert_array_equal(terms[missing], 0.0)
    expected = model.compile_logp(vars=[model["y_observed"]])(point)
    np.testing.assert_allclose(terms.sum(), expected, rtol=1e-10)
    prior = model.compile_logp(vars=[beta, sigma, model["y_unobserved"]])(point)
    np.testing.assert_allclose(oracles.log_prior(q), prior, rtol=1e-10)
    compiled = oracles._functions.prior.compile()  # what the step evaluates
    sizes = [np.size(c.data) for c in _constants(compiled)]
    assert max(sizes) < X.shape[1] * y.size / 10, sizes  # X itself is not in the prior


def _point(step, q: np.ndarray) -> dict[str, np.ndarray]:
    """The step's raveled ``q`` as a point (value variables in the step's order)."""
    initial = step._initial_point  # the point the step was built at
    point, start = {}, 0
    for value in step.vars:
        shape = np.shape(initial[value.name])
        size = int(np.prod(shape, dtype=int))
        point[value.name] = q[start : start + size].reshape(shape)
        start += size
    return point


def _constants(function) -> list:
    fgraph = getattr(function, "maker", function).fgraph
    return [v for v in fgraph.variables if hasattr(v, "data")]


def test_two_outcomes_with_missing_values_in_different_rows_share_the_rows():
    rng = np.random.default_rng(11)
    y1, y2 = rng.normal(size=500), rng.normal(size=500)
    y1[[3, 9]] = np.nan
    y2[[4]] = np.nan
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y1", mu, 1.0, observed=y1)
        pm.Normal("y2", mu, 1.0, observed=y2)
        step = pms.AusterityMH(control_variate=None, proposal="random_walk")
    assert step.oracles.n_rows == 500
    assert not step.oracles.layout.full_rvs
    terms = step.oracles.loglik_rows(np.array([0.3]), np.array([3, 4, 5]))
    point = {**model.initial_point(), "mu": np.array(0.3)}
    one = model.compile_logp(vars=[model["y1_observed"]], sum=False)(point)[0]
    two = model.compile_logp(vars=[model["y2_observed"]], sum=False)(point)[0]
    np.testing.assert_allclose(terms, [two[3], one[3], one[4] + two[4]], rtol=1e-12)


def test_missing_entries_inside_a_multivariate_row_are_refused_in_words():
    rng = np.random.default_rng(12)
    y = rng.normal(size=(200, 2))
    y[5, 1] = np.nan
    with pm.Model():
        mu = pm.Normal("mu", shape=2)
        pm.MvNormal("y", mu, np.eye(2), observed=y)
        with pytest.raises(ValueError, match=r"missing values inside some rows"):
            pms.AusterityMH([mu])

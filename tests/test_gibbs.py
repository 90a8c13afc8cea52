"""AusterityGibbs: Gibbs updates of binary variables on subsampled terms (supplementary F).

The reference is exact: a Boltzmann machine of 8 units whose 2^8 states are enumerated with
PyMC's own log-density (``examples/boltzmann_gibbs.py``). Each check compares nine statistics
(the eight marginals and the probability of the most likely state) with the enumeration, to
within 4.5 Monte Carlo standard errors (from ArviZ's ESS) plus a bias budget: 0 for exact Gibbs,
0.03 for the subsampled test at epsilon 0.05 (Theorem 4 bounds its stationary error by the
update's error, about epsilon, over 1 - eta). False-failure rate: at most 9 x 7e-6 per check
from the chain's noise. A Gibbs update decided by Metropolis's rule ``Delta > log u`` instead of
``logit(u)`` (x_j = 1 whenever Delta > 0) is off by 0.1 to 0.4 and fails.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
import pymc_subsample.kernels.gibbs as gibbs_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from boltzmann_gibbs import boltzmann_model, exact_distribution, make_patterns

#: pm.sample options of every run here.
QUIET = {"progressbar": False, "compute_convergence_checks": False}
N_PATTERNS = 3_000
N_UNITS = 8
DRAWS = 3_000


@pytest.fixture(scope="module")
def boltzmann() -> tuple[pm.Model, np.ndarray, np.ndarray]:
    """The model, its statistics' exact values and the most likely state."""
    bias = np.random.default_rng(2).normal(scale=0.5, size=N_UNITS)
    model = boltzmann_model(make_patterns(N_PATTERNS, N_UNITS, seed=1), beta=8.0, bias=bias)
    states, probabilities = exact_distribution(model)
    mode = states[np.argmax(probabilities)]
    exact = np.append(probabilities @ states, probabilities.max())
    return model, exact, mode


def _statistics_errors(idata: az.InferenceData, exact: np.ndarray, mode: np.ndarray) -> tuple:
    x = idata.posterior["x"].to_numpy()[0]  # (draws, units)
    series = np.column_stack([x, np.all(x == mode, axis=1)]).astype(float)
    means = series.mean(axis=0)
    ess = np.array([az.ess(column[None, :]) for column in series.T], dtype=float)
    mcse = series.std(axis=0) / np.sqrt(ess)
    return np.abs(means - exact), mcse


def _sample(model: pm.Model, seed: int, **settings: object) -> az.InferenceData:
    with model:
        return pm.sample(
            draws=DRAWS,
            tune=0,
            chains=1,
            step=pms.AusterityGibbs(**settings),
            **QUIET,
            random_seed=seed,
        )


@pytest.mark.parametrize(
    ("settings", "budget"),
    [({"error_tolerance": 0.0}, 0.0), ({"error_tolerance": 0.05, "batch_size": 100}, 0.03)],
    ids=["exact", "subsampled"],
)
def test_gibbs_matches_enumeration(boltzmann, settings, budget) -> None:
    model, exact, mode = boltzmann
    idata = _sample(model, seed=11, **settings)
    errors, mcse = _statistics_errors(idata, exact, mode)
    assert np.all(errors < 4.5 * mcse + budget), (errors, mcse)
    stats = idata.sample_stats
    assert np.all(stats["n_updates"] == N_UNITS)
    rows_per_update = float((stats["n_data"] / stats["n_updates"]).mean())
    if settings["error_tolerance"] == 0.0:
        assert rows_per_update == N_PATTERNS
    else:  # the dense field: each update reads a fraction of the terms
        assert rows_per_update < 0.5 * N_PATTERNS


def test_a_metropolis_threshold_is_detected(boltzmann, monkeypatch) -> None:
    """The check above has power: Gibbs updates with Metropolis's rule fail it."""
    model, exact, mode = boltzmann
    broken = partial(gibbs_kernel.exact_mh_test, rule="metropolis")
    monkeypatch.setattr(gibbs_kernel, "exact_mh_test", lambda *a, rule, **k: broken(*a, **k))
    idata = _sample(model, seed=11, error_tolerance=0.0)
    errors, mcse = _statistics_errors(idata, exact, mode)
    assert not np.all(errors < 4.5 * mcse), (errors, mcse)


def test_sweep_statistics_and_order(boltzmann) -> None:
    model, _, _ = boltzmann
    idata = _sample(model, seed=3, error_tolerance=0.01, order="sequential")
    stats = idata.sample_stats
    for name in ("n_data", "n_updates", "n_changed", "n_full_data", "n_nonfinite"):
        assert stats[name].dtype == np.int64
    assert float(stats["error_tolerance"][0, 0]) == 0.01
    assert int(stats["batch_size"][0, 0]) == 500
    assert 0 < float(stats["n_changed"].mean()) < N_UNITS
    assert int(stats["n_nonfinite"].sum()) == 0


def test_refuses_variables_that_are_not_bernoulli() -> None:
    with pm.Model() as model:
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", k, 1.0, observed=np.zeros(10))
    with model, pytest.raises(ValueError, match=r"'k' is a PoissonRV.*pms\.AusterityMH"):
        pms.AusterityGibbs([k])
    with model, pytest.raises(ValueError, match="has none"):
        pms.AusterityGibbs()


def test_refuses_bad_settings(boltzmann) -> None:
    model, _, _ = boltzmann
    with model, pytest.raises(ValueError, match="error_tolerance"):
        pms.AusterityGibbs(error_tolerance=0.6)
    with model, pytest.raises(ValueError, match="order"):
        pms.AusterityGibbs(order="backwards")


def test_impossible_value_is_never_taken() -> None:
    """An update whose rows rule a value out (a log ratio of +inf) keeps the possible one."""
    y = np.r_[np.zeros(200), np.ones(200)]  # half the rows have density 0 at z = 0
    with pm.Model() as model:
        z = pm.Bernoulli("z", p=0.1, initval=1)
        pm.Bernoulli("y", p=0.01 * z, observed=y)
    with model:
        idata = pm.sample(
            draws=50,
            tune=0,
            chains=1,
            step=pms.AusterityGibbs(batch_size=50),
            **QUIET,
            random_seed=0,
        )
    assert np.all(idata.posterior["z"].to_numpy() == 1)
    assert np.all(idata.sample_stats["n_nonfinite"] == 1)


def test_a_sum_of_binary_entries_passes_the_self_check() -> None:
    """The set-up self-check moves only continuous entries (a jittered 0.61 is cast differently
    by the per-row and the full function); the data say x.sum() = 1 beyond doubt."""
    y = np.random.default_rng(0).normal(size=2_000) + 1.0
    with pm.Model():
        x = pm.Bernoulli("x", 0.5, shape=3)
        pm.Normal("y", mu=x.sum(), observed=y)
        idata = pm.sample(
            draws=50,
            tune=0,
            chains=1,
            step=pms.AusterityGibbs(),
            **QUIET,
            random_seed=0,
        )
    assert np.all(idata.posterior["x"].to_numpy().sum(axis=-1)[:, 5:] == 1)

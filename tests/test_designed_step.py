"""AusterityMH with a designed sequential test (Korattikara et al. 2014, section 5.2)."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conjugate import tempered_gaussian_mean_data

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def _gaussian_mean_model(n_rows: int):
    x, mean, sd = tempered_gaussian_mean_data(n_rows, 1.0, seed=4)
    model = pm.Model()
    with model:
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("x", mu, 1.0, observed=x)
    return model, mean, sd


@pytest.mark.parametrize("fused", [True, False])
def test_a_fixed_design_sets_the_batch_and_the_bounds(fused):
    # The design's batch replaces batch_size; its per-stage tolerances are those of
    # SequentialDesign.stage_tolerances (Wang-Tsiatis shape 1: shrinking bounds), in the
    # fused and the Python draw; past max_stages the test reads every row.
    model, _, _ = _gaussian_mean_model(5000)
    design = pms.SequentialDesign(250, 0.05, shape=1.0, max_stages=4)
    with model:
        step = pms.AusterityMH(
            error_tolerance=design, control_variate=None, proposal="random_walk", fused=fused
        )
        idata = pm.sample(draws=300, tune=200, chains=1, step=step, random_seed=3, **SAMPLE)
    assert step.batch_size == 250 and (step.draw_path == "fused") == fused
    stats = idata.sample_stats
    assert np.all(stats["batch_size"].values == 250)
    assert np.all(stats["error_tolerance"].values == 0.05)
    assert np.all(np.isnan(stats["design_rows"].values))
    used = stats["n_data"].values.ravel()
    # Stages 1-4 stop at 250..1000 rows; after them only all 5000 rows.
    assert set(np.unique(used)) <= {250, 500, 750, 1000, 5000} | set(range(1001, 5001))
    assert np.all(stats["n_batches"].values.ravel()[used <= 1000] <= 4)


def test_worst_case_design_is_chosen_before_sampling():
    # OptimalDesign(kind="worst") designs at construction (eq. 8): E(0) <= max_error by the
    # programme, and the stats carry its tolerance, predicted rows and error.
    model, _, _ = _gaussian_mean_model(20_000)
    with model:
        step = pms.AusterityMH(
            error_tolerance=pms.OptimalDesign(0.05, kind="worst"), control_variate=None
        )
        choice = step.test.choice
        assert choice is not None and choice.kind == "worst"
        error, _ = pms.operating_characteristics(choice.design, 20_000, 0.0)
        assert error[0] <= 0.05
        assert step.batch_size == choice.design.batch_size
        idata = pm.sample(draws=100, tune=100, chains=1, step=step, random_seed=1, **SAMPLE)
    stats = idata.sample_stats
    assert np.all(stats["design_rows"].values == choice.predicted_rows)
    assert np.all(stats["design_error"].values == choice.predicted_error)


def test_average_design_is_chosen_after_tuning_and_samples_the_posterior():
    # OptimalDesign() (the default kind, "average", eq. 7) tunes with the step's batch and
    # epsilon 0.001, then designs from 100 tuning proposals; each of 2 chains designs its own.
    # The posterior of a Gaussian mean (N = 20,000) stays right with the designed test: with
    # ESS > 600 the mean's Monte Carlo error is <= 0.041 sd, so 0.2 sd is 4.9 SE plus the
    # test's bias at max_error 0.01; sds within 15% (MC error about 3%). With a tolerance of
    # 0.4 at every stage in place of the design's the sd is 16% off and this fails (checked).
    model, mean, sd = _gaussian_mean_model(20_000)
    with model:
        step = pms.AusterityMH(error_tolerance="optimal", control_variate=None)
        idata = pm.sample(
            draws=1500, tune=600, chains=2, cores=1, step=step, random_seed=2, **SAMPLE
        )
    stats = idata.sample_stats
    rows = stats["design_rows"].values
    assert np.all(np.isfinite(rows)) and np.all(stats["design_error"].values <= 0.01)
    for chain in range(2):  # constant within a chain
        assert np.unique(stats["error_tolerance"].values[chain]).size == 1
    draws = idata.posterior["mu"].values.ravel()
    ess = float(az.ess(idata, var_names=["mu"])["mu"])
    assert ess > 600
    assert abs(draws.mean() - mean) / sd < 0.2
    assert abs(draws.std() / sd - 1) < 0.15


def test_average_design_without_tuning_falls_back_to_the_worst_case():
    model, _, _ = _gaussian_mean_model(5000)
    with model:
        step = pms.AusterityMH(error_tolerance="optimal", control_variate=None)
        with pytest.warns(pms.SubsampleWarning, match="worst-case design"):
            idata = pm.sample(draws=20, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
    assert step.test.choice is not None and step.test.choice.kind == "worst"
    assert np.all(np.isfinite(idata.sample_stats["design_rows"].values))


def test_bad_error_tolerance_strings_are_refused():
    model, _, _ = _gaussian_mean_model(100)
    with (
        model,
        pytest.raises(ValueError, match=r"must be in \[0, 0.5\), 'optimal', a SequentialDesign"),
    ):
        pms.AusterityMH(error_tolerance="best")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with model:
            pms.AusterityMH(error_tolerance=0.01)  # a number still works, silently

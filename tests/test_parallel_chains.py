"""A step reused across ``pm.sample`` calls starts every chain as a fresh step would.

PyMC's parallel path (``cores > 1``) pickles the step into the worker processes without calling
``reset_tuning``; before ``_start_chain`` a reused step arrived there with tuning switched off
and the previous run's scale, so the new chains never tuned. Deterministic: no tolerance.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


@pytest.mark.parametrize("cores", [1, 2])
def test_reused_step_tunes_again(cores):
    y = np.random.default_rng(0).normal(size=200)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
        step = pms.AusterityMH(batch_size=50, control_variate=None)  # scale tuning moves it
        initial = step.scaling
        pm.sample(draws=20, tune=300, chains=1, cores=1, step=step, random_seed=1, **SAMPLE)
        assert step.scaling != initial  # the first run tuned
        idata = pm.sample(
            draws=20,
            tune=300,
            chains=2,
            cores=cores,
            step=step,
            random_seed=2,
            discard_tuned_samples=False,
            **SAMPLE,
        )
    warmup = idata.warmup_sample_stats["scaling"].values
    # Every chain starts from the initial scale and adapts it during its own tuning.
    np.testing.assert_array_equal(warmup[:, 0], initial)
    assert np.all(np.ptp(warmup, axis=1) > 0)
    # After tuning the scale stays fixed.
    assert np.all(np.ptp(idata.sample_stats["scaling"].values, axis=1) == 0)

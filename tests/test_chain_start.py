"""A tuning chain with a control variate starts near the reference point, not far from it.

Deterministic checks (no tolerance depends on chance beyond what is stated): before, a chain
started at the model's initial point (about 800 squared Mahalanobis units from the reference
here) and Barker's tuning draws read thousands of rows each until it arrived; now a start beyond
the chi-square(d) 1 - 1e-6 limit is replaced by a draw from the Laplace approximation, and a
start inside it (``initvals=ref.initvals``) is kept.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}
N_ROWS = 20_000


@pytest.fixture(scope="module")
def logistic():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N_ROWS, 3))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.array([1.0, -0.5, 0.8]))))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=3)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
        ref = pms.find_reference_point(random_seed=1)
    return model, ref


def test_far_start_moves_near_the_reference_so_tuning_reads_few_rows(logistic):
    model, ref = logistic
    with model:
        step = pms.MinibatchBarkerMH(control_variate="taylor2", reference_point=ref, batch_size=100)
        far = step.control.distance_sq(step.oracles.initial_q)
        assert far > step.control.limit  # the model's initial point is far
        idata = pm.sample(
            200,
            tune=200,
            chains=2,
            cores=1,
            step=step,
            random_seed=3,
            discard_tuned_samples=False,
            **SAMPLE,
        )
    warmup = idata.warmup_sample_stats
    # Every tuning draw near the reference reads one batch (a full-data fallback there has a
    # probability far below 1e-3 per draw with taylor2); from the far start they read ~1e4.
    assert float(warmup["n_data"].mean()) <= 3 * 100
    first = warmup["reference_distance"].values[:, 0] ** 2
    assert np.all(first <= step.control.limit)
    assert first[0] != first[1]  # each chain its own start


def test_start_inside_the_limit_is_kept(logistic):
    model, ref = logistic
    with model:
        step = pms.AusterityMH(control_variate="taylor2", reference_point=ref, batch_size=100)
    step.tune = True
    step.reset_tuning()
    near = step.control.proxy.reference + 1e-3
    np.testing.assert_array_equal(step._chain_start(near), near)
    # Only at a chain's first draw; there a far start moves with or without tuning.
    assert not step._start_near_reference
    step.reset_tuning()
    step.tune = False
    far = step.oracles.initial_q
    moved = step._chain_start(far)
    assert step.control.distance_sq(far) > step.control.limit
    assert step.control.distance_sq(moved) <= step.control.limit

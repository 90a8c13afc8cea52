"""The cost statistics agree with each other: a draw is ``full_data`` exactly when it read N rows.

Before, a staged test that had read all N rows (its calls grow 1, 2, 4, ... stages) still decided
at an earlier stage: ``n_data == N`` on 38.6% of Austerity's draws and 89.9% of Barker's while
``full_data`` said 4.8% and 2.4%, so the cost warning never fired.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data, linear_regression_model

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


@pytest.mark.parametrize(
    "make_step",
    [
        pytest.param(
            lambda: pms.AusterityMH(error_tolerance=0.001, batch_size=100, control_variate=None),
            id="austerity",
        ),
        pytest.param(
            lambda: pms.MinibatchBarkerMH(batch_size=100, control_variate=None), id="barker"
        ),
    ],
)
def test_full_data_exactly_when_every_row_was_read(make_step):
    # Temperature 1, no control variate, N = 1,000: many draws read all rows, many do not.
    X, y = linear_regression_data(1000, seed=41)
    with linear_regression_model(X, y):
        idata = pm.sample(draws=300, tune=100, chains=1, step=make_step(), random_seed=2, **SAMPLE)
    stats = idata.sample_stats
    n_data, full = stats["n_data"].values, stats["full_data"].values
    assert full.any()
    np.testing.assert_array_equal(full, n_data == 1000)
    np.testing.assert_array_equal(stats["n_batches"].values[full], 10)


@pytest.mark.parametrize("control_variate", [False, True])
def test_fallback_advice_matches_the_configuration(control_variate):
    # Before, the advice was to turn on control variates even when they were on.
    from pymc_subsample.step_methods.diagnostics import ChainDiagnostics

    diagnostics = ChainDiagnostics(100, 1000, control_variate=control_variate)
    diagnostics.reset(10)
    with pytest.warns(pms.SubsampleWarning) as record:
        for _ in range(10):
            diagnostics.record(True, float("nan"), 1000)
    message = str(record[0].message)
    assert ("turn on control_variate" in message) is not control_variate
    assert ("reference_distance" in message) is control_variate


@pytest.mark.parametrize("far", [False, True])
def test_fallback_advice_names_a_posterior_the_proxies_cannot_follow(far):
    # Issue 35: a hierarchy with the defaults read 96% of the rows per draw and was told to
    # pass initvals or recenter, which its chains (started at the reference) already did.
    # Where the search measured the posterior far from Gaussian and the chain did not drift
    # away, the advice names that and the faster sampler; a chain that went far keeps the
    # start/re-centre advice.
    from pymc_subsample.step_methods.diagnostics import ChainDiagnostics

    diagnostics = ChainDiagnostics(100, 1000, control_variate=True, skewed_posterior=True)
    diagnostics.reset(10)
    with pytest.warns(pms.SubsampleWarning) as record:
        if far:
            diagnostics.warn_far(1e4, 50.0)
        for _ in range(10):
            diagnostics.record(True, float("nan"), 1000)
    message = str(record[-1].message)
    assert ("far from Gaussian" in message) is not far
    assert ("full-data NUTS" in message) is not far
    assert ("initvals" in message) is far


def test_no_control_variate_advice_where_none_can_apply():
    # Discrete variables, or a default dropped because another step moves what the rows read:
    # advising control_variate='taylor2' there sent users to a warning about the reference.
    from pymc_subsample.step_methods.diagnostics import ChainDiagnostics

    diagnostics = ChainDiagnostics(100, 1000, can_control=False)
    diagnostics.reset(10)
    with pytest.warns(pms.SubsampleWarning, match="No control variate applies") as record:
        for _ in range(10):
            diagnostics.record(True, float("nan"), 1000)
    assert "turn on control_variate" not in str(record[0].message)


def test_reading_most_rows_without_full_data_fallbacks_is_reported():
    # A sequential test that stops short of N on every draw but reads 60% of the rows on
    # average saves little; the fallback share alone (0% here) never said so.
    from pymc_subsample.step_methods.diagnostics import ChainDiagnostics

    costly = ChainDiagnostics(100, 1000)
    costly.reset(10)
    with pytest.warns(pms.SubsampleWarning, match=r"read 600 of the N=1000 rows on average"):
        for _ in range(10):
            costly.record(False, float("nan"), 600)
    cheap = ChainDiagnostics(100, 1000)
    cheap.reset(10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pms.SubsampleWarning)
        for _ in range(10):
            cheap.record(False, float("nan"), 400)

"""plot_data_usage on real pm.sample results (InferenceData on PyMC 5, DataTree on PyMC 6)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
import pytest
import xarray as xr

import pymc_subsample as pms

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def test_plot_data_usage_marks_fallbacks(small_regression):
    model, _, _ = small_regression
    with model:
        step = pms.AusterityMH(batch_size=50, error_tolerance=0.05)
        idata = pm.sample(draws=60, tune=20, chains=2, cores=1, step=step, random_seed=1, **SAMPLE)
    axes = pms.plot_data_usage(idata, n_rows=400)
    trace_ax, hist_ax = axes
    n_data = idata.sample_stats["n_data"].values
    full = idata.sample_stats["full_data"].values
    lines = trace_ax.get_lines()
    # One line per chain (its y data are that chain's n_data), then fallback markers per chain
    # with any, then the N line.
    np.testing.assert_array_equal(lines[0].get_ydata(), n_data[0])
    markers = [line for line in lines if line.get_marker() == "x" and len(line.get_xdata())]
    assert sum(len(m.get_xdata()) for m in markers) == int(full.sum())
    assert sum(patch.get_height() for patch in hist_ax.patches) == n_data.size
    assert f"{full.mean():.1%}" in hist_ax.get_title()
    plt.close("all")


def test_plot_data_usage_adds_the_rows_of_a_compound_step():
    # Two subsampled steps per draw (a step over hyperparameters that only the prior sees
    # reads one batch); the plotted rows per draw are their sum, one line per chain.
    rng = np.random.default_rng(0)
    x = rng.normal(size=300)
    with pm.Model():
        scale = pm.HalfNormal("scale", 1.0)
        slope = pm.Normal("slope", 0.0, scale)
        pm.Normal("y", slope * x, 1.0, observed=0.5 * x + rng.normal(size=300))
        steps = [pms.AusterityMH([slope], batch_size=50), pms.AusterityMH([scale], batch_size=50)]
        idata = pm.sample(draws=40, tune=10, chains=2, cores=1, step=steps, random_seed=1, **SAMPLE)
    n_data = idata.sample_stats["n_data"].values
    assert n_data.shape == (2, 40, 2)
    np.testing.assert_array_equal(n_data[..., 1], 50)  # the prior-only step: one batch
    trace_ax, hist_ax = pms.plot_data_usage(idata)
    np.testing.assert_array_equal(trace_ax.get_lines()[1].get_ydata(), n_data[1].sum(-1))
    assert sum(patch.get_height() for patch in hist_ax.patches) == 80
    plt.close("all")


def test_plot_data_usage_without_full_data_stat_and_on_given_axes():
    dims = ("chain", "draw")
    stats = xr.Dataset({"n_data": (dims, np.full((1, 5), 500))})
    _, given = plt.subplots(1, 2)
    axes = pms.plot_data_usage({"sample_stats": stats}, axes=given)
    assert axes[0] is given[0] and axes[1] is given[1]
    assert "full data in 0.0%" in axes[1].get_title()
    plt.close("all")


def test_plot_data_usage_refuses_runs_without_subsample_stats():
    stats = xr.Dataset({"diverging": (("chain", "draw"), np.zeros((1, 3), bool))})
    with pytest.raises(ValueError, match="n_data"):
        pms.plot_data_usage({"sample_stats": stats})
    with pytest.raises(ValueError, match="n_data"):
        pms.plot_data_usage({})

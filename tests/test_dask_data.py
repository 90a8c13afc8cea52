"""Row data on Dask (issue 36, item 3): passes on the cluster, draws' rows fetched ahead.

``pms.dask_data`` puts a Dask array's rows in a model; ``model/dask_pass.py`` sums over them
as a Dask reduction and ``model/dask_rows.py`` reads the draws' rows from a stream of
proposals fetched ahead. The deterministic tests compare with the same model in memory:
sums over every row to a relative 1e-9 (the same numbers added in another order), gathered
rows exactly. A gather that returned other rows than those named could not be seen in a
posterior (exchangeable rows give the same posterior), hence the exact comparisons.

The statistical test compares the posterior of a conjugate linear regression sampled from
Dask with its exact posterior: means within 0.25 posterior sd and sds within 20%. With
2 x 1,000 draws at an effective sample size of several hundred, the mean's Monte Carlo error
is about 0.05 sd, so the false-failure rate is below 1e-5 per coordinate; it detects a bias of
0.3 sd or more (a pass that missed a chunk of rows moves the control variate's sums and the
proposal by more than that: tried, it failed).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import example_module, linear_regression_data, linear_regression_posterior

import pymc_subsample as pms
import pymc_subsample.model.dask_rows as dask_rows_module
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.model.oracle_builder import build_oracles

da = pytest.importorskip("dask.array")

N_ROWS, CHUNK = 20_000, 3_000


def _regression(
    on_dask: bool, n_rows: int = N_ROWS, chunk: int = CHUNK, persisted: bool = False
) -> pm.Model:
    X, y = linear_regression_data(n_rows, seed=4)
    with pm.Model() as model:
        if on_dask:
            X_dask = da.from_array(X, chunks=(chunk, 3))
            y_dask = da.from_array(y, chunks=chunk + 500)
            if persisted:  # the chunks in a distributed cluster's memory
                X_dask, y_dask = X_dask.persist(), y_dask.persist()
            X_rows = pms.dask_data("X", X_dask)
            y_rows = pms.dask_data("y", y_dask)
        else:
            X_rows, y_rows = pm.Data("X", X), pm.Data("y", y)
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("obs", X_rows @ beta, 1.0, observed=y_rows)
    return model


def _oracles(model: pm.Model):
    return build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=2
    )


def test_passes_over_every_row_on_dask_equal_the_passes_in_memory() -> None:
    in_memory, on_dask = _oracles(_regression(False)), _oracles(_regression(True))
    assert on_dask.rows_on_dask and on_dask.n_rows == N_ROWS
    q = np.array([0.9, -1.7, 0.4])
    for expected, found in zip(
        in_memory.gradient_hessian_sums(q), on_dask.gradient_hessian_sums(q), strict=True
    ):
        np.testing.assert_allclose(found, expected, rtol=1e-9)
    full = slice(0, N_ROWS)
    expected_sums = in_memory.search_sums(q, full, with_hessian=True)
    found_sums = on_dask.search_sums(q, full, with_hessian=True)
    assert found_sums.loglik == pytest.approx(expected_sums.loglik, rel=1e-9)
    np.testing.assert_allclose(found_sums.gradient, expected_sums.gradient, rtol=1e-9)
    np.testing.assert_allclose(found_sums.hessian, expected_sums.hessian, rtol=1e-9)
    # The exact gradient adds the prior's gradient once, whatever the number of calls.
    np.testing.assert_allclose(
        on_dask.gradient_on_rows(None)(q), in_memory.gradient_on_rows(None)(q), rtol=1e-9
    )
    assert on_dask.loglik_total(q) == pytest.approx(
        float(in_memory.loglik_rows(q, full).sum()), rel=1e-9
    )


def test_gathered_rows_are_the_rows_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of the stream (across blocks), rows fetched on demand, repeats and any order."""
    monkeypatch.setattr(dask_rows_module, "FIRST_FETCH_ROWS", 64)
    monkeypatch.setattr(dask_rows_module, "FETCH_ROWS", 256)
    monkeypatch.setattr(dask_rows_module, "KEPT_ROWS", 600)
    X, y = linear_regression_data(N_ROWS, seed=4)
    oracles = _oracles(_regression(True))
    rows = oracles._tracker.dask
    rng = np.random.default_rng(0)
    sampler = RowSampler(N_ROWS, oracles.row_proposals())
    for size in (10, 100, 300, 700):  # the larger tests span several blocks
        sampler.start_test()
        drawn = np.concatenate([sampler.draw(rng, size // 2), sampler.draw(rng, size - size // 2)])
        assert np.unique(drawn).size == drawn.size and drawn.max() < N_ROWS
        gathered = dict(zip(rows.names, rows.gather(drawn), strict=True))
        np.testing.assert_array_equal(gathered["X"], X[drawn])
        np.testing.assert_array_equal(gathered["y"], y[drawn])
    named = np.array([5, N_ROWS - 1, 5, 17, 0])  # not from the stream: fetched now
    x_position, y_position = rows.names.index("X"), rows.names.index("y")
    np.testing.assert_array_equal(rows.gather(named)[x_position], X[named])
    np.testing.assert_array_equal(rows.gather_range(slice(100, 4_100))[y_position], y[100:4_100])


def test_the_proposal_stream_restarts_from_each_chains_generator() -> None:
    """A chain's rows depend on its own generator only, not on what drew before it."""
    oracles = _oracles(_regression(True))
    rows = oracles._tracker.dask
    first = rows.proposals(np.random.default_rng(3), 50)
    rows.proposals(np.random.default_rng(9), 5_000)
    np.testing.assert_array_equal(rows.proposals(np.random.default_rng(3), 50), first)
    counts = np.bincount(rows.proposals(np.random.default_rng(1), 40_000) // 2_000, minlength=10)
    assert counts.min() > 3_600 and counts.max() < 4_400  # uniform over the rows (10 bins)


def test_sampling_from_dask_gives_the_exact_posterior() -> None:
    X, y = linear_regression_data(N_ROWS, seed=4)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with _regression(True):
        step = pms.AusterityMH()
        idata = pm.sample(
            tune=500, draws=1_000, chains=2, cores=1, step=step, random_seed=2,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    assert step.draw_path.startswith("python: the rows are read from Dask")
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 0.25 * sd)
    np.testing.assert_allclose(draws.std(axis=0), sd, rtol=0.2)
    assert idata.sample_stats["n_data"].mean() < N_ROWS / 20


def test_a_local_cluster_runs_the_passes_and_gives_the_exact_posterior() -> None:
    distributed = pytest.importorskip("distributed")
    X, y = linear_regression_data(N_ROWS, seed=4)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        model = _regression(True, persisted=True)
        q = np.array([0.9, -1.7, 0.4])
        expected = _oracles(_regression(False)).gradient_hessian_sums(q)
        for found, value in zip(_oracles(model).gradient_hessian_sums(q), expected, strict=True):
            np.testing.assert_allclose(found, value, rtol=1e-9)
        with model:
            idata = pm.sample(
                tune=300, draws=600, chains=1, cores=1, step=pms.AusterityMH(), random_seed=3,
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip
        # Every worker ran chunks of the passes.
        assert len(client.run(lambda: 1)) == 2
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 0.3 * sd)


def test_rows_held_by_workers_are_fetched_one_task_per_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Persisted chunks: one task per worker and array takes the rows; cast here, exactly.

    Float32 covariates and int8 labels on Dask, held by the model as float64 and an integer
    type: the rows come back in the model's dtypes with the stored values. A fetch that
    took any task per chunk fails (the per-chunk path is made to raise), as does a row
    offset within a chunk off by one (tried: the values differ).
    """
    distributed = pytest.importorskip("distributed")
    X, y = linear_regression_data(N_ROWS, seed=4)
    X32, labels = X.astype("float32"), (y > 0).astype("int8")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        with pm.Model():
            X_rows = pms.dask_data("X", da.from_array(X32, chunks=(CHUNK, 3)).persist())
            y_rows = pms.dask_data("y", da.from_array(labels, chunks=CHUNK + 500).persist())
        rows = dask_rows_module.dask_rows([X_rows, y_rows])
        assert rows is not None
        submitted: list[object] = []
        submit = client.submit

        def counted(*args: object, **kwargs: object) -> object:
            submitted.append(kwargs.get("workers"))
            return submit(*args, **kwargs)

        def refused(*args: object) -> None:
            raise AssertionError("fetched by chunk")

        monkeypatch.setattr(client, "submit", counted)
        monkeypatch.setattr(dask_rows_module, "_fetch_by_chunk", refused)
        named = np.random.default_rng(5).choice(N_ROWS, 2_000, replace=False)
        X_found, y_found = rows.gather(named)
    assert 1 <= len(submitted) <= 2 * 2 and all(workers for workers in submitted)
    assert X_found.dtype == X_rows.get_value().dtype == np.float64
    assert y_found.dtype == y_rows.get_value().dtype
    np.testing.assert_array_equal(X_found, X32[named].astype(np.float64))
    np.testing.assert_array_equal(y_found, labels[named])


def test_a_zarr_array_is_read_through_dask(tmp_path) -> None:
    zarr = pytest.importorskip("zarr")
    X, y = linear_regression_data(5_000, seed=4)
    stored = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(1_000, 3))
    stored[:] = X
    with pm.Model() as model:
        X_rows = pms.dask_data("X", zarr.open_array(str(tmp_path / "X.zarr"), mode="r"))
        y_rows = pms.dask_data("y", y)
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("obs", X_rows @ beta, 1.0, observed=y_rows)
    oracles = _oracles(model)
    rows = np.array([4_999, 3, 2_500])
    on_dask = oracles._tracker.dask
    np.testing.assert_array_equal(on_dask.gather(rows)[on_dask.names.index("X")], X[rows])


def test_unknown_chunk_sizes_are_refused_with_the_fix() -> None:
    values = da.from_array(np.arange(100.0), chunks=10)
    unknown = values[values > 50]
    with pm.Model(), pytest.raises(ValueError, match="compute_chunk_sizes"):
        pms.dask_data("x", unknown)


def test_row_data_partly_in_memory_are_refused_before_sampling() -> None:
    X, y = linear_regression_data(5_000, seed=4)
    with pm.Model() as model:
        X_rows = pms.dask_data("X", da.from_array(X, chunks=(1_000, 3)))
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("obs", X_rows[:, 0] * beta[0], 1.0, observed=np.resize(y, 1_000))
    with model, pytest.raises(ValueError, match="in memory while the other row-aligned"):
        pms.AusterityMH()


def test_data_on_dask_replaced_by_set_data_are_refused_before_sampling() -> None:
    model = _regression(True)
    with model:
        step = pms.AusterityMH()
        X, y = linear_regression_data(1_000, seed=5)
        pm.set_data({"X": X, "y": y})
        with pytest.raises(ValueError, match="cannot be swapped in place"):
            pm.sample(
                tune=10, draws=10, chains=1, cores=1, step=step, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip


def test_sampling_in_worker_processes_says_to_use_one_core() -> None:
    with _regression(True, n_rows=3_000, chunk=1_000):
        with pytest.raises(Exception, match="sample with cores=1"):
            pm.sample(
                tune=10, draws=10, chains=2, cores=2, step=pms.AusterityMH(),
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip


def test_the_data_on_dask_example_samples_on_a_local_cluster(tmp_path) -> None:
    """``examples/data_on_dask.py``: Zarr rows on two workers, two chains in this process.

    100,000 rows give posterior sds near 0.01; every chain's means must lie within 0.1 of the
    true coefficients (up to 0.65 in size): a chain that did not move, or read other rows
    than the labels', fails; the chance of a false failure is below 1e-6.
    """
    pytest.importorskip("distributed")
    pytest.importorskip("zarr")
    data_on_dask = example_module("data_on_dask")
    x_path, y_path, true_beta = data_on_dask.write_zarr(tmp_path, 100_000)
    draws, rows, _, _ = data_on_dask.sample_on_cluster(x_path, y_path, draws=400, tune=300)
    assert draws.shape == (2, 400, data_on_dask.FEATURES)
    assert np.all(np.abs(draws.mean(axis=1) - true_beta) < 0.1)
    assert rows.mean() < 10_000


def test_dask_arrays_of_different_lengths_are_refused_before_sampling() -> None:
    X, y = linear_regression_data(5_000, seed=4)
    with pm.Model() as model:
        X_rows = pms.dask_data("X", da.from_array(X, chunks=(1_000, 3)))
        y_rows = pms.dask_data("y", da.from_array(y[:-1], chunks=1_000))
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("obs", X_rows @ beta, 1.0, observed=y_rows)
    with model, pytest.raises(ValueError, match=r"different lengths \{'y': 4999, 'X': 5000\}"):
        pms.AusterityMH()

"""Data on a Dask cluster: a logistic regression whose rows live in Zarr and on the workers.

Writes ``--rows`` rows (float32 covariates, int8 labels) into a Zarr store in ``--dir`` (a
temporary directory by default), starts a ``distributed.LocalCluster`` of two worker
processes, loads the rows onto the workers (``da.from_zarr(...).persist()``) and gives them to
the model with ``pms.dask_data``. The step's passes over every row run as Dask tasks on the
workers; the rows of each draw are fetched from them ahead of the draws
(``docs/data_beyond_ram.md``, "Data on Dask, Zarr or a cluster"). Two chains run one after
the other in this process (``cores=1``: the workers share the passes).

Needs the extra: ``pip install "pymc-subsample[dask]"``. Run with
``python examples/data_on_dask.py`` (2e6 rows, about a minute on 2 cores). It prints the rows
per draw, the set-up and sampling times, the min ESS, and the posterior means next to the true
coefficients.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import arviz as az
import dask.array as da
import numpy as np
import pymc as pm
from distributed import Client, LocalCluster

import pymc_subsample as pms

FEATURES = 10
CHUNK_ROWS = 1 << 18


def write_zarr(directory: Path, n_rows: int, seed: int = 0) -> tuple[Path, Path, np.ndarray]:
    """Write X (first column 1) and y as Zarr arrays, one chunk at a time; return the paths."""
    rng = np.random.default_rng(seed)
    true_beta = rng.normal(0.0, 0.5, size=FEATURES).astype(np.float32)
    X = rng.standard_normal((n_rows, FEATURES), dtype=np.float32)
    X[:, 0] = 1.0
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-(X @ true_beta)))).astype("int8")
    x_path, y_path = directory / "X.zarr", directory / "y.zarr"
    da.from_array(X, chunks=(CHUNK_ROWS, FEATURES)).to_zarr(str(x_path))
    da.from_array(y, chunks=CHUNK_ROWS).to_zarr(str(y_path))
    return x_path, y_path, true_beta


def sample_on_cluster(
    x_path: Path, y_path: Path, *, draws: int = 2_000, tune: int = 1_000, chains: int = 2
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Sample the model with its rows on a LocalCluster; draws, rows per draw, seconds."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster),
    ):
        X = da.from_zarr(str(x_path)).persist()
        y = da.from_zarr(str(y_path)).persist()
        with pm.Model():
            beta = pm.Normal("beta", 0.0, 2.0, shape=FEATURES)
            pm.Bernoulli(
                "y", logit_p=pms.dask_data("X", X) @ beta, observed=pms.dask_data("labels", y)
            )
            start = time.perf_counter()
            step = pms.AusterityMH()
            setup = time.perf_counter() - start
            start = time.perf_counter()
            idata = pm.sample(
                draws=draws, tune=tune, chains=chains, cores=1, step=step, random_seed=1,
            )  # fmt: skip
            seconds = time.perf_counter() - start
    draws_by_chain = np.asarray(idata.posterior["beta"])
    rows = np.asarray(idata.sample_stats["n_data"]).ravel()
    return draws_by_chain, rows, setup, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=float, default=2e6)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.dir or Path(scratch)
        x_path, y_path, true_beta = write_zarr(directory, int(args.rows))
        draws, rows, setup, seconds = sample_on_cluster(x_path, y_path)
    ess = np.asarray(az.ess(az.convert_to_dataset({"beta": draws}))["beta"])
    print(f"rows per draw: {rows.mean():.0f} of N = {int(args.rows):,}")
    print(f"building the step: {setup:.1f} s; sampling: {seconds:.1f} s")
    print(f"min ESS: {ess.min():.0f} of {draws.shape[0] * draws.shape[1]:,} draws")
    print("true beta:     ", np.round(true_beta, 3))
    print("posterior mean:", np.round(draws.mean(axis=(0, 1)), 3))


if __name__ == "__main__":
    main()

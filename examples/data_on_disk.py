"""Data on disk: a logistic regression whose rows stay in ``.npy`` memory maps.

Writes ``--rows`` rows (float32 covariates, int8 labels) block by block into ``--dir`` (a
temporary directory by default), opens them with ``np.load(path, mmap_mode="r")`` and gives
them to the model as ``pytensor.shared(array, borrow=True)``, which keeps the maps: the step
reads its rows from the files, passes over every row stream them, and the pages read are
dropped again where the maps are larger than half the machine's memory
(``docs/data_beyond_ram.md``). ``pm.sample`` returns its trace (``return_inferencedata=False``):
InferenceData would hold PyMC's int64 copy of the observed labels. Two chains run in two
processes, which share the maps.

Run with ``python examples/data_on_disk.py`` (5e6 rows, 210 MB, about a minute on 2 cores;
``--rows 1e9 --dir /big/disk`` for 41 GB). It prints the rows per draw, the sampling time, the
min ESS, the process's peak resident memory on Linux, and the posterior means next to the
true coefficients.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor

import pymc_subsample as pms

FEATURES = 10


def write_rows(directory: Path, n_rows: int, seed: int = 0) -> tuple[Path, Path, np.ndarray]:
    """Write X (first column 1) and y as .npy files, 2^20 rows at a time; return the paths."""
    rng = np.random.default_rng(seed)
    true_beta = rng.normal(0.0, 0.5, size=FEATURES).astype(np.float32)
    x_path, y_path = directory / "X.npy", directory / "y.npy"
    X = np.lib.format.open_memmap(x_path, "w+", dtype="float32", shape=(n_rows, FEATURES))
    y = np.lib.format.open_memmap(y_path, "w+", dtype="int8", shape=(n_rows,))
    for start in range(0, n_rows, 1 << 20):
        stop = min(start + (1 << 20), n_rows)
        block = rng.standard_normal((stop - start, FEATURES), dtype=np.float32)
        block[:, 0] = 1.0
        X[start:stop] = block
        y[start:stop] = rng.random(stop - start) < 1.0 / (1.0 + np.exp(-(block @ true_beta)))
    X.flush()
    y.flush()
    return x_path, y_path, true_beta


def sample_from_disk(
    x_path: Path, y_path: Path, *, draws: int = 2_000, tune: int = 1_000, chains: int = 2
) -> tuple[np.ndarray, np.ndarray, float]:
    """Sample the model on the maps; return the draws, rows per draw and seconds."""
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 2.0, shape=X.shape[1])
        pm.Bernoulli(
            "y",
            logit_p=pytensor.shared(X, borrow=True) @ beta,
            observed=pytensor.shared(y, borrow=True),
        )
        start = time.perf_counter()
        trace = pm.sample(
            draws=draws, tune=tune, chains=chains, step=pms.AusterityMH(), random_seed=1,
            return_inferencedata=False,
        )  # fmt: skip
        seconds = time.perf_counter() - start
    draws_by_chain = np.stack(trace.get_values("beta", combine=False))
    rows = np.concatenate(trace.get_sampler_stats("n_data", combine=False))
    return draws_by_chain, rows, seconds


def _peak_resident_gb() -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=float, default=5e6)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.dir or Path(scratch)
        x_path, y_path, true_beta = write_rows(directory, int(args.rows))
        draws, rows, seconds = sample_from_disk(x_path, y_path)
    ess = np.asarray(az.ess(az.convert_to_dataset({"beta": draws}))["beta"])
    print(f"rows per draw: {rows.mean():.0f} of N = {int(args.rows):,}")
    print(f"sampling, set-up included: {seconds:.1f} s for {draws.shape[0]} chains")
    print(f"min ESS: {ess.min():.0f} of {draws.shape[0] * draws.shape[1]:,} draws")
    peak = _peak_resident_gb()
    if peak is not None:
        print(f"peak resident memory of this process: {peak:.2f} GB")
    print("true beta:     ", np.round(true_beta, 3))
    print("posterior mean:", np.round(draws.mean(axis=(0, 1)), 3))


if __name__ == "__main__":
    main()

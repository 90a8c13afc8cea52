"""Building the default step on 1e7 to 1e8 rows in RAM (issue 36, item 1).

Issue 36's target: ``AusterityMH()`` with no arguments on logistic regression with N = 1e8
rows and d = 10 (``common.logistic_model``; float64 ``X``, 8 GB) builds in at most 30 s, its
peak memory grows by at most half the data, and its means lie within 0.1 sd of a full-data
Newton/Laplace reference.

Each N runs in its own fresh process, which loads the data from ``.npy`` files into RAM
(written once, in blocks, under ``--data-dir``), builds the model, resets the process's peak
resident memory (``/proc/self/clear_refs``), and then:

- times a full-data pass of the log-likelihood's gradient (NumPy, one core, in blocks of
  65,536 rows): what one leapfrog step of full-data NUTS pays, beside the build;
- times building ``AusterityMH()`` twice: the first in the process (warm on-disk caches, as
  every run after a user's first on a model; a cold one adds compilation, issue 37) and its
  search rows (``reference_rows``), then reports the growth of peak memory over the data;
- samples 1 chain of 1,000 tune + 2,000 draws and reports min-ESS, its rate with set-up
  included (``pm.sample``'s whole wall time), rows per draw, microseconds per draw (PyMC's
  timing of its draw loop, without its copy of the observed rows into InferenceData), and
  each coefficient's posterior mean against the reference;
- the reference: Newton's method on all rows in NumPy (blocks of 65,536 rows, a separate code
  path from the package's search) to a step below 1e-10 sds; its mode and the Laplace sds.

``--shared`` runs each N a second time with ``X`` given as ``pytensor.shared(X, borrow=True)``
(the same array, not copied): PyTensor then does not hash it as a constant (``np.isnan`` and a
sum over the whole array, each time PyMC builds a log-density of the model).

Run ``python benchmarks/build_at_scale.py`` (``--rows 1e7 1e8``; about 5 minutes on 2 cores,
plus writing 9 GB of data once; ``--shared`` doubles it). Writes ``results/build_at_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import child_json, logistic_model, process_status_bytes, reset_peak_memory, write_json

FEATURES = 10
BLOCK = 65_536
DRAWS = {"tune": 1_000, "draws": 2_000}


def _paths(directory: Path, n_rows: int) -> tuple[Path, Path]:
    return directory / f"logistic_X_{n_rows}.npy", directory / f"logistic_y_{n_rows}.npy"


def write_data(directory: Path, n_rows: int, seed: int = 0) -> tuple[Path, Path]:
    """Write X (first column 1, then standard normals) and y as .npy files, block by block."""
    x_path, y_path = _paths(directory, n_rows)
    if x_path.exists() and y_path.exists():
        return x_path, y_path
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    beta = rng.normal(0.0, 0.5, size=FEATURES)
    X = np.lib.format.open_memmap(x_path, mode="w+", dtype="float64", shape=(n_rows, FEATURES))
    y = np.lib.format.open_memmap(y_path, mode="w+", dtype="int8", shape=(n_rows,))
    for start in range(0, n_rows, 1 << 20):
        stop = min(start + (1 << 20), n_rows)
        block = rng.normal(size=(stop - start, FEATURES))
        block[:, 0] = 1.0
        X[start:stop] = block
        y[start:stop] = rng.random(stop - start) < 1.0 / (1.0 + np.exp(-block @ beta))
    X.flush()
    y.flush()
    del X, y
    return x_path, y_path


def _newton_reference(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The posterior mode by Newton on all rows (N(0, 2^2) prior) and the Laplace sds."""
    beta = np.zeros(X.shape[1])
    prior_precision = np.eye(X.shape[1]) / 4.0
    for _ in range(50):
        gradient, hessian = -prior_precision @ beta, -prior_precision.copy()
        for start in range(0, X.shape[0], BLOCK):
            block, labels = X[start : start + BLOCK], y[start : start + BLOCK]
            p = 1.0 / (1.0 + np.exp(-block @ beta))
            gradient += block.T @ (labels - p)
            hessian -= (block * (p * (1.0 - p))[:, None]).T @ block
        step = np.linalg.solve(-hessian, gradient)
        beta += step
        if step @ (-hessian) @ step < 1e-20:
            break
    return beta, np.sqrt(np.diag(np.linalg.inv(-hessian)))


def _gradient_pass_seconds(X: np.ndarray, y: np.ndarray, beta: np.ndarray) -> float:
    start_time = time.perf_counter()
    gradient = np.zeros(X.shape[1])
    for start in range(0, X.shape[0], BLOCK):
        block = X[start : start + BLOCK]
        gradient += block.T @ (y[start : start + BLOCK] - 1.0 / (1.0 + np.exp(-block @ beta)))
    return time.perf_counter() - start_time


def _shared_model(X: np.ndarray, y: np.ndarray) -> Any:
    """``common.logistic_model`` with X given as ``pytensor.shared(X, borrow=True)`` (no copy)."""
    import pymc as pm
    import pytensor

    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=pytensor.shared(X, borrow=True, name="X") @ beta, observed=y)
    return model


def run_child(n_rows: int, directory: Path, shared: bool) -> dict[str, Any]:
    import arviz as az
    import pymc as pm

    import pymc_subsample as pms

    x_path, y_path = _paths(directory, n_rows)
    X, y = np.load(x_path), np.load(y_path)
    data_bytes = X.nbytes + y.nbytes
    model = _shared_model(X, y) if shared else logistic_model(X, y)
    mode, laplace_sd = _newton_reference(X, y)
    gradient_pass = _gradient_pass_seconds(X, y, mode)
    base = process_status_bytes("VmRSS")
    reset_peak_memory()
    start = time.perf_counter()
    with model:
        step = pms.AusterityMH()
    setup = time.perf_counter() - start
    setup_growth = process_status_bytes("VmHWM") - base
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            **DRAWS, step=step, chains=1, cores=1, random_seed=1, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    sampling = time.perf_counter() - start
    # PyMC's own timing of its draw loop, without its conversion of the N observed rows into
    # InferenceData (seconds at N = 1e8, what NUTS pays too).
    draw_loop = float(idata.posterior.attrs.get("sampling_time", sampling))
    draws = idata.posterior["beta"].values.reshape(-1, FEATURES)
    ess = az.ess(idata, var_names=["beta"])["beta"].values
    error = np.abs(draws.mean(0) - mode) / laplace_sd
    sd_ratio = draws.std(0) / laplace_sd
    rows = idata.sample_stats["n_data"].values
    return {
        "rows": n_rows,
        "X_given_as": "pytensor.shared(X, borrow=True)" if shared else "a plain array (constant)",
        "data_bytes": data_bytes,
        "setup_seconds": setup,
        "reference_rows": int(step.reference_rows),
        "setup_peak_growth_bytes": setup_growth,
        "setup_peak_growth_over_data": setup_growth / data_bytes,
        "full_gradient_pass_seconds": gradient_pass,
        "sampling_seconds": sampling,
        "draw_loop_seconds": draw_loop,
        "us_per_draw": 1e6 * draw_loop / (DRAWS["tune"] + DRAWS["draws"]),
        "rows_per_draw": float(np.mean(rows)),
        "min_ess": float(ess.min()),
        "min_ess_per_second_with_setup": float(ess.min()) / (setup + sampling),
        "max_mean_error_in_sds": float(error.max()),
        "sd_ratio_range": [float(sd_ratio.min()), float(sd_ratio.max())],
        "control_variate": str(step.control_variate),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("ROWS", "DIR", "SHARED"))
    parser.add_argument(
        "--shared",
        action="store_true",
        help="also run each N with X given as pytensor.shared(X, borrow=True)",
    )
    parser.add_argument("--rows", nargs="+", type=float, default=[1e7, 1e8])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/pms_build_at_scale"))
    args = parser.parse_args()
    if args.child:
        rows, directory, shared = args.child
        print(json.dumps(run_child(int(float(rows)), Path(directory), shared == "shared")))
        return
    runs = []
    for rows in args.rows:
        write_data(args.data_dir, int(rows))
        for form in ("constant", "shared") if args.shared else ("constant",):
            arguments = [str(int(rows)), str(args.data_dir), form]
            result = child_json(__file__, arguments, dict(os.environ))
            print(json.dumps(result), file=sys.stderr)
            runs.append(result)
    write_json(
        "build_at_scale",
        {"features": FEATURES, "step_draws": DRAWS, "cpu_count": os.cpu_count(), "runs": runs},
    )


if __name__ == "__main__":
    main()

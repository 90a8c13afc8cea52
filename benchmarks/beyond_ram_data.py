"""Data for ``beyond_ram.py``: logistic-regression rows on disk, and their streamed reference.

``write_data`` writes ``X`` (float32, first column 1, then standard normals) and ``y`` (int8)
as ``.npy`` files block by block, so that no more than one block is ever in RAM.
``streamed_reference`` finds the posterior mode by Newton's method with passes that read the
files block by block (NumPy, a separate code path from the package's search) and caches it,
with the Laplace sds, in a JSON file beside the data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

FEATURES = 10
WRITE_BLOCK = 1 << 22
PASS_BLOCK = 1 << 18
PRIOR_SD = 2.0


def data_paths(directory: Path, n_rows: int) -> tuple[Path, Path]:
    """The ``.npy`` files of ``X`` and ``y`` for ``n_rows`` rows."""
    return directory / f"X_f32_{n_rows}.npy", directory / f"y_i8_{n_rows}.npy"


def write_data(directory: Path, n_rows: int, seed: int = 0) -> tuple[Path, Path]:
    """Write the rows once (a finished file is kept); return the two paths."""
    x_path, y_path = data_paths(directory, n_rows)
    if x_path.exists() and y_path.exists():
        return x_path, y_path
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    beta = rng.normal(0.0, 0.5, size=FEATURES).astype(np.float32)
    partial_x, partial_y = x_path.with_suffix(".partial"), y_path.with_suffix(".partial")
    X = np.lib.format.open_memmap(partial_x, "w+", dtype="float32", shape=(n_rows, FEATURES))
    y = np.lib.format.open_memmap(partial_y, "w+", dtype="int8", shape=(n_rows,))
    for start in range(0, n_rows, WRITE_BLOCK):
        stop = min(start + WRITE_BLOCK, n_rows)
        block = rng.standard_normal((stop - start, FEATURES), dtype=np.float32)
        block[:, 0] = 1.0
        X[start:stop] = block
        y[start:stop] = rng.random(stop - start, dtype=np.float32) < 1.0 / (
            1.0 + np.exp(-(block @ beta))
        )
    X.flush()
    y.flush()
    del X, y
    os.replace(partial_x, x_path)
    os.replace(partial_y, y_path)
    return x_path, y_path


def _newton_sums(
    X: np.ndarray, y: np.ndarray, beta: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    loglik, gradient, hessian = 0.0, np.zeros(FEATURES), np.zeros((FEATURES, FEATURES))
    for start in range(0, X.shape[0], PASS_BLOCK):
        block = np.asarray(X[start : start + PASS_BLOCK], dtype=np.float64)
        labels = y[start : start + PASS_BLOCK]
        eta = block @ beta
        p = 1.0 / (1.0 + np.exp(-eta))
        loglik += float(np.sum(labels * eta - np.logaddexp(0.0, eta)))
        gradient += block.T @ (labels - p)
        hessian -= (block * (p * (1.0 - p))[:, None]).T @ block
    return loglik, gradient, hessian


def streamed_reference(directory: Path, n_rows: int) -> dict[str, list[float]]:
    """The posterior mode (N(0, 2^2) prior) by Newton on all rows, and the Laplace sds.

    Starts from the mode of the first 2^22 rows and iterates on all rows until a step's squared
    Newton decrement is below 1e-8 (1e-4 sds). Cached as ``reference_{n_rows}.json``.
    """
    cache = directory / f"reference_{n_rows}.json"
    if cache.exists():
        return dict(json.loads(cache.read_text()))
    x_path, y_path = data_paths(directory, n_rows)
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    prior_precision = np.eye(FEATURES) / PRIOR_SD**2
    beta = np.zeros(FEATURES)
    passes = 0
    for rows in (min(n_rows, 1 << 22), n_rows):
        for _ in range(50):
            _, gradient, hessian = _newton_sums(X[:rows], y[:rows], beta)
            passes += rows == n_rows
            gradient -= prior_precision @ beta
            hessian -= prior_precision
            step = np.linalg.solve(-hessian, gradient)
            beta = beta + step
            if step @ (-hessian) @ step < 1e-8:
                break
    reference = {
        "mode": beta.tolist(),
        "laplace_sd": np.sqrt(np.diag(np.linalg.inv(-hessian))).tolist(),
        "full_passes": passes,
    }
    cache.write_text(json.dumps(reference))
    return reference


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", type=float, default=[1e9])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/pms_beyond_ram"))
    args = parser.parse_args()
    for rows in args.rows:
        write_data(args.data_dir, int(rows))
        print(streamed_reference(args.data_dir, int(rows)))

"""Data on disk beyond RAM: the default step on memory-mapped rows (issue 36, items 2 and 4).

Logistic regression with d = 10, float32 ``X`` and int8 ``y`` written as ``.npy`` files
(``beyond_ram_data.py``), ``AusterityMH()`` with no arguments, 1 chain of 1,000 tune +
2,000 draws. Each case runs in its own fresh process:

- ``memmap``: ``X`` and ``y`` from ``np.load(path, mmap_mode="r")``, given to the model as
  ``pytensor.shared(array, borrow=True)`` (no copy; ``docs/data_beyond_ram.md``);
- ``in RAM``: the same files loaded into memory (N up to 1e8);
- page cache ``cold``: the files' pages evicted from the page cache before the process starts
  (``posix_fadvise(POSIX_FADV_DONTNEED)``); ``warm``: the same case again right after, every
  page cached (up to ``--in-ram-up-to`` rows; beyond RAM a cache holds part of the file).

Reported per case: building the step, its peak resident memory (``VmHWM``: the map's
resident pages included) and that of the whole process through sampling, sampling time,
microseconds and rows per draw, min-ESS and its rate with set-up included, and each
coefficient's posterior mean against the reference, a Newton/Laplace mode found by streaming
NumPy passes over the files (``beyond_ram_data.streamed_reference``, a separate code path).
Beside them, one full-data gradient pass in NumPy over the map in blocks (its own process,
cache as found): what one leapfrog step of full-data NUTS would pay.

``pm.sample`` is asked for its trace (``return_inferencedata=False``): InferenceData's
``observed_data`` group would hold PyMC's copy of the observed values in the distribution's
dtype (int32 then int64 for a Bernoulli: 12 GB at 1e9 rows), which the page explains.

Run ``python benchmarks/beyond_ram.py`` (``--rows 1e7 1e8 1e9``): writes 45 GB of data once
(about 8 minutes) and its references (about 15 minutes), then about 20 minutes of runs on
2 cores. Writes ``results/beyond_ram.json``.
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
from beyond_ram_data import FEATURES, PASS_BLOCK, data_paths, streamed_reference, write_data
from common import child_json, process_status_bytes, reset_peak_memory, write_json

DRAWS = {"tune": 1_000, "draws": 2_000}


def evict(paths: tuple[Path, ...]) -> None:
    """Drop the files' clean pages from the page cache (a cold start)."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def gradient_pass(directory: Path, n_rows: int, mode: np.ndarray) -> dict[str, float]:
    """One full-data gradient of the log-likelihood in NumPy over the maps, block by block."""
    x_path, y_path = data_paths(directory, n_rows)
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    start = time.perf_counter()
    gradient = np.zeros(FEATURES)
    for begin in range(0, n_rows, PASS_BLOCK):
        block = np.asarray(X[begin : begin + PASS_BLOCK], dtype=np.float64)
        labels = y[begin : begin + PASS_BLOCK]
        gradient += block.T @ (labels - 1.0 / (1.0 + np.exp(-(block @ mode))))
    return {"full_gradient_pass_seconds": time.perf_counter() - start}


def run_case(directory: Path, n_rows: int, form: str) -> dict[str, Any]:
    import arviz as az
    import pymc as pm
    import pytensor

    import pymc_subsample as pms

    reference = streamed_reference(directory, n_rows)
    mode, laplace_sd = np.array(reference["mode"]), np.array(reference["laplace_sd"])
    x_path, y_path = data_paths(directory, n_rows)
    if form == "memmap":
        X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    else:
        X, y = np.load(x_path), np.load(y_path)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=FEATURES)
        pm.Bernoulli(
            "y",
            logit_p=pytensor.shared(X, borrow=True, name="X") @ beta,
            observed=pytensor.shared(y, borrow=True, name="y"),
        )
    base = process_status_bytes("VmRSS")
    reset_peak_memory()
    start = time.perf_counter()
    with model:
        step = pms.AusterityMH()
    setup = time.perf_counter() - start
    setup_peak = process_status_bytes("VmHWM")
    start = time.perf_counter()
    with model:
        trace = pm.sample(
            **DRAWS, step=step, chains=1, cores=1, random_seed=1, progressbar=False,
            compute_convergence_checks=False, return_inferencedata=False,
        )  # fmt: skip
    sampling = time.perf_counter() - start
    run_peak = process_status_bytes("VmHWM")
    draws = np.asarray(trace.get_values("beta"))
    ess = np.asarray(az.ess(draws[None]))
    error = np.abs(draws.mean(0) - mode) / laplace_sd
    sd_ratio = draws.std(0) / laplace_sd
    rows = np.asarray(trace.get_sampler_stats("n_data"))
    return {
        "rows": n_rows,
        "form": form,
        "data_bytes": X.nbytes + y.nbytes,
        "rss_before_step_bytes": base,
        "setup_seconds": setup,
        "setup_peak_rss_bytes": setup_peak,
        "run_peak_rss_bytes": run_peak,
        "reference_rows": int(step.reference_rows),
        "sampling_seconds": sampling,
        "us_per_draw": 1e6 * sampling / (DRAWS["tune"] + DRAWS["draws"]),
        "rows_per_draw": float(rows.mean()),
        "min_ess": float(ess.min()),
        "min_ess_per_second_with_setup": float(ess.min()) / (setup + sampling),
        "max_mean_error_in_sds": float(error.max()),
        "sd_ratio_range": [float(sd_ratio.min()), float(sd_ratio.max())],
        "control_variate": str(step.control_variate),
        "proposal": str(step.proposal_kind),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("ROWS", "DIR", "FORM"))
    parser.add_argument("--rows", nargs="+", type=float, default=[1e7, 1e8, 1e9])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/pms_beyond_ram"))
    parser.add_argument("--in-ram-up-to", type=float, default=1e8)
    parser.add_argument("--name", default="beyond_ram", help="results/NAME.json")
    args = parser.parse_args()
    if args.child:
        rows, directory, form = args.child
        n_rows = int(float(rows))
        if form == "gradient":
            mode = np.array(streamed_reference(Path(directory), n_rows)["mode"])
            result = gradient_pass(Path(directory), n_rows, mode)
        else:
            result = run_case(Path(directory), n_rows, form)
        print(json.dumps(result))
        return
    runs = []
    for rows in args.rows:
        n_rows = int(rows)
        write_data(args.data_dir, n_rows)
        reference = streamed_reference(args.data_dir, n_rows)
        cases = [("memmap", "cold")]
        if n_rows <= args.in_ram_up_to:  # the data fit in the page cache, and in RAM
            cases += [("memmap", "warm"), ("in RAM", "cold")]
        for form, cache in cases:
            if cache == "cold":
                evict(data_paths(args.data_dir, n_rows))
            arguments = [str(n_rows), str(args.data_dir), form]
            result = {"page_cache": cache, **child_json(__file__, arguments, dict(os.environ))}
            print(json.dumps(result), file=sys.stderr)
            runs.append(result)
        arguments = [str(n_rows), str(args.data_dir), "gradient"]
        gradient = child_json(__file__, arguments, dict(os.environ))
        print(json.dumps(gradient), file=sys.stderr)
        runs.append({"rows": n_rows, "reference_full_passes": reference["full_passes"], **gradient})
    write_json(
        args.name,
        {
            "features": FEATURES,
            "step_draws": DRAWS,
            "cpu_count": os.cpu_count(),
            "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()

"""Data on disk beyond RAM: the default step on memory-mapped rows (issue 36, items 2 and 4).

Logistic regression with d = 10, float32 ``X`` and int8 ``y`` written as ``.npy`` files
(``beyond_ram_data.py``), ``AusterityMH()`` with no arguments, 1 chain of 1,000 tune +
2,000 draws. Each case runs in its own fresh process:

- ``memmap``: ``X`` and ``y`` from ``np.load(path, mmap_mode="r")``, given to the model as
  ``pytensor.shared(array, borrow=True)`` (no copy; ``docs/data_beyond_ram.md``);
- ``memmap rows`` (only with ``--forms``): the same maps, with the draws' tests reading rows
  one by one where they read blocks of a page's rows beyond RAM (``MappedRows.
  draw_block_rows``, ``docs/architecture.md``, "Rows read in blocks"): the step as it was
  before block reads, beside it on the same files;
- ``in RAM``: the same files loaded into memory (N up to 1e8);
- ``dask``: the same files on a ``distributed.LocalCluster`` of 2 worker processes (one
  thread each): each chunk of 2^22 rows is read from the files by the worker that holds it
  and kept in its memory (``persist``), and the model reads them through ``pms.dask_data``:
  the step's passes run as Dask tasks on the workers, the draws' rows are fetched ahead
  from them (``docs/data_beyond_ram.md``, "Data on Dask"). Its full-data gradient pass is
  timed on the cluster too, as a Dask array expression.
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
    cluster: dict[str, Any] = {}
    if form == "dask":
        X, y, cluster = on_cluster(x_path, y_path, mode)
        with pm.Model() as model:
            beta = pm.Normal("beta", 0.0, 2.0, shape=FEATURES)
            pm.Bernoulli(
                "y", logit_p=pms.dask_data("X", X) @ beta, observed=pms.dask_data("labels", y)
            )
    else:
        if form == "memmap rows":  # as before rows were read in blocks: one by one
            from pymc_subsample.model.mapped_pages import MappedRows

            MappedRows.draw_block_rows = lambda self: 1  # type: ignore[method-assign]
        if form.startswith("memmap"):
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
        "draw_path": str(step.draw_path),
        **cluster,
    }


def on_cluster(x_path: Path, y_path: Path, mode: np.ndarray) -> tuple[Any, Any, dict[str, Any]]:
    """Start a 2-worker LocalCluster, load the files' rows onto it; time a gradient pass there.

    The cluster and its client stay open for the rest of the process (the step's passes run
    on it). Returns the Dask arrays and what was measured: the load, the workers' resident
    memory after it, and one full-data gradient pass as a Dask array expression.
    """
    import dask.array as da
    import psutil
    from distributed import Client, LocalCluster, wait

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True)
    client = Client(cluster)
    start = time.perf_counter()
    X, y = (npy_rows(path) for path in (x_path, y_path))
    X, y = X.persist(), y.persist()
    wait([X, y])
    load = time.perf_counter() - start
    worker_rss = sum(client.run(lambda: psutil.Process().memory_info().rss).values())
    start = time.perf_counter()
    eta = X.astype(np.float64) @ mode
    gradient = (X.T @ (y - 1.0 / (1.0 + da.exp(-eta)))).compute()
    assert gradient.shape == (FEATURES,)
    return (
        X,
        y,
        {
            "cluster_workers": 2,
            "cluster_load_seconds": load,
            "cluster_workers_rss_bytes": worker_rss,
            "cluster_full_gradient_pass_seconds": time.perf_counter() - start,
            "chunk_rows": int(X.chunks[0][0]),
        },
    )


def npy_rows(path: Path, chunk_rows: int = 1 << 22) -> Any:
    """A Dask array of a ``.npy`` file's rows, each chunk read by the worker computing it."""
    import dask.array as da

    header = np.load(path, mmap_mode="r")
    shape, dtype = header.shape, header.dtype
    sizes = [min(chunk_rows, shape[0] - begin) for begin in range(0, shape[0], chunk_rows)]
    chunks = (tuple(sizes), *((extent,) for extent in shape[1:]))

    def read(block_info: dict[Any, Any] | None = None) -> np.ndarray:
        assert block_info is not None
        (begin, end), *_ = block_info[None]["array-location"]
        return np.array(np.load(path, mmap_mode="r")[begin:end])

    return da.map_blocks(read, chunks=chunks, dtype=dtype, meta=np.empty((0,) * len(shape), dtype))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("ROWS", "DIR", "FORM"))
    parser.add_argument("--rows", nargs="+", type=float, default=[1e7, 1e8, 1e9])
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/pms_beyond_ram"))
    parser.add_argument("--in-ram-up-to", type=float, default=1e8)
    parser.add_argument("--dask-up-to", type=float, default=1e8)
    parser.add_argument(
        "--forms",
        nargs="+",
        help="run only these forms (memmap, in RAM, dask; and 'memmap rows', a map whose "
        "draws read rows one by one, not in blocks, only where asked for)",
    )
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
        if n_rows <= args.dask_up_to:  # the workers hold the rows in their memory
            cases += [("dask", "cold")]
        if args.forms and "memmap rows" in args.forms:  # asked for: the draws' rows one by one
            cases += [("memmap rows", "cold")]
        for form, cache in cases:
            if args.forms and form not in args.forms:
                continue
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

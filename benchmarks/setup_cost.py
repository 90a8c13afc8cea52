"""Set-up time and memory of the zero-configuration steps, beside NUTS's set-up on the same data.

Issue 14's target: building ``AusterityMH()`` (or ``MinibatchBarkerMH()``) with no arguments
on logistic regression with N = 1e6 rows and d = 10 (``common.logistic_data``) takes at most
2 s (reference search and compilation) and peak memory stays within 1.5x the data. Beside
each step, in the same run and on the same data, the set-up of PyMC's ``pm.NUTS()``
(compiling the log density and its gradient, and one full-data evaluation: what NUTS pays
before its first draw) and, where installed, nutpie's ``compile_pymc_model``.

Every measurement runs in its own fresh process, which loads the data from an ``.npy`` file
(no generation temporaries in its memory), builds the model, and then:

- times starting PyTensor's Numba backend (``backend_seconds``: importing it and one trivial
  compiled call, which loads Numba's registries; paid once per process by whatever compiles
  first, NUTS as well, so it is reported apart: ``setup_seconds`` excludes it, and
  ``setup_with_backend_seconds`` is their sum, the set-up of the first step a fresh process
  builds);
- times building the step (``setup_seconds``), then samples 200 + 1,000 draws (the steps);
- reports the growth of peak resident memory over the process's memory with the model built
  (the data included), during set-up and by the end of sampling, and over the data's size.

Caches: "warm" runs reuse PyTensor's and Numba's on-disk caches (filled by a first, unmeasured
run), as every run after a user's first on a model does; three of them per sampler and N, and
the one with the median set-up is reported (``setup_seconds_range``: the three's range).
"Cold" runs get an empty compile directory, as a user's first run does (``--cold``, N = 1e6
only). The memory that does not
grow with N (Numba, LLVM, compiled code) is measured at N = 1e4 and reported as ``fixed``;
``per_data`` is the growth beyond it over the data's size.

Run ``python benchmarks/setup_cost.py`` (about 6 minutes on 2 cores; ``--large`` adds
N = 1e7, about 6 more; ``--cold`` adds the cold-cache runs, about 2 more). Writes
``results/setup_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from typing import Any

import numpy as np
from common import child_json, logistic_data, nuts_setup, write_json

SAMPLERS = ("austerity", "barker", "nuts", "nutpie")
STEP_DRAWS = {"tune": 200, "draws": 1_000}
#: Warm runs per sampler and N; the run with the median set-up is reported, with the range.
REPEATS = 3
FEATURES = 10


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _start_backend() -> None:
    """Start PyTensor's default backend: import it and run one trivial compiled function.

    What the first compiled call of any process pays once (NUTS's as well as a step's):
    importing PyTensor's Numba backend and loading Numba's typing registries.
    """
    import pytensor
    import pytensor.tensor as pt

    x = pt.dvector("x")
    pytensor.function([x], 2 * x)(np.zeros(3))


def child(sampler: str, data_path: str) -> dict[str, Any]:
    """Measure one sampler's set-up in this (fresh) process."""
    start = time.perf_counter()
    import pymc as pm
    from common import logistic_model

    import pymc_subsample as pms

    imports = time.perf_counter() - start
    X, y = np.load(f"{data_path}_X.npy"), np.load(f"{data_path}_y.npy")
    model = logistic_model(X, y)
    with model:
        model.initial_point()
    base = _rss()
    start = time.perf_counter()
    _start_backend()
    backend = time.perf_counter() - start
    result: dict[str, Any] = {"import_seconds": imports, "backend_seconds": backend}
    start = time.perf_counter()
    with model:
        if sampler == "nutpie":
            import nutpie

            nutpie.compile_pymc_model(model)
        elif sampler == "nuts":
            step = nuts_setup(model)
        else:
            step_class = pms.AusterityMH if sampler == "austerity" else pms.MinibatchBarkerMH
            step = step_class()
            result["reference_rows"] = step.reference_rows
    result["setup_seconds"] = time.perf_counter() - start
    result["setup_peak_growth_bytes"] = _peak() - base
    if sampler in ("austerity", "barker"):
        with model:
            pm.sample(
                step=step,
                chains=1,
                cores=1,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
                **STEP_DRAWS,
            )
    result["peak_growth_bytes"] = _peak() - base
    result["data_bytes"] = int(X.nbytes + y.nbytes)
    return result


def run_child(sampler: str, data_path: str, compiledir: str | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    if compiledir is not None:
        env["PYTENSOR_FLAGS"] = f"base_compiledir={compiledir}"
    return child_json(__file__, [sampler, data_path], env)


def nutpie_installed() -> bool:
    try:
        import nutpie  # noqa: F401
    except ImportError:
        return False
    return True


def measure(n_rows: int, samplers: list[str], cold: bool, folder: str) -> dict[str, Any]:
    data_path = os.path.join(folder, f"logistic_{n_rows}")
    X, y = logistic_data(n_rows, FEATURES)
    np.save(f"{data_path}_X.npy", X)
    np.save(f"{data_path}_y.npy", y)
    del X, y
    runs: dict[str, Any] = {}
    for sampler in samplers:
        run_child(sampler, data_path)  # fills the on-disk caches
        repeats = [run_child(sampler, data_path) for _ in range(REPEATS)]
        setups = sorted(r["setup_seconds"] for r in repeats)
        runs[sampler] = run = sorted(repeats, key=lambda r: r["setup_seconds"])[REPEATS // 2]
        run["setup_seconds_range"] = [setups[0], setups[-1]]
        run["setup_with_backend_seconds"] = run["setup_seconds"] + run["backend_seconds"]
        if cold:
            with tempfile.TemporaryDirectory() as compiledir:
                cold_run = run_child(sampler, data_path, compiledir)
            run["cold_setup_with_backend_seconds"] = (
                cold_run["setup_seconds"] + cold_run["backend_seconds"]
            )
        print(n_rows, sampler, json.dumps(run), flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("SAMPLER", "DATA"))
    parser.add_argument("--large", action="store_true", help="add N = 1e7")
    parser.add_argument("--cold", action="store_true", help="add cold-cache runs at N = 1e6")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    samplers = [s for s in SAMPLERS if s != "nutpie" or nutpie_installed()]
    sizes = [10_000, 1_000_000] + ([10_000_000] if args.large else [])
    by_rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for n_rows in sizes:
            chosen = samplers if n_rows <= 1_000_000 else ["austerity", "barker"]
            by_rows[str(n_rows)] = measure(n_rows, chosen, args.cold and n_rows == 1e6, folder)
    fixed = {s: by_rows["10000"][s]["peak_growth_bytes"] for s in by_rows["10000"]}
    for runs in by_rows.values():
        nuts = runs.get("nuts")
        for sampler, run in runs.items():
            run["peak_growth_over_data"] = run["peak_growth_bytes"] / run["data_bytes"]
            run["per_data"] = (run["peak_growth_bytes"] - fixed[sampler]) / run["data_bytes"]
            if nuts is not None:
                run["setup_over_nuts"] = run["setup_seconds"] / nuts["setup_seconds"]
    write_json(
        "setup_cost",
        {
            "rows": sizes,
            "features": FEATURES,
            "step_draws": STEP_DRAWS,
            "fixed_peak_growth_bytes": fixed,
            "runs": by_rows,
        },
    )


if __name__ == "__main__":
    main()

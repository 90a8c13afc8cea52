"""Set-up time of a ``control_variate="taylor2"`` step on a dims/pm.Data model (issue 13).

A logistic regression written in the style of most PyMC examples (``coords``, ``pm.Data`` with
``dims``, parameters and observed with ``dims``) against the same model after
``freeze_dims_and_data``. ``dims_before_fix`` rebuilds the graphs as before the fix (the raveled
parameter vector of unknown length), under a time limit: on PyTensor 2.38 its Hessian sums never
finish compiling (a shape rewrite makes the graph cyclic and the rewriter's walk grows without
end).

Each case runs in its own process with a memory cap, twice on one fresh compile directory: "cold"
(empty PyTensor/Numba caches, as a user's first run) and "warm" (cached). Run it with each stack's
python; results are merged into ``results/setup_time_dims.json`` under a key per stack::

    .ci-venvs/py312-pymc6/bin/python benchmarks/setup_time_dims.py
    .ci-venvs/py311-pymc5/bin/python benchmarks/setup_time_dims.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import run_limited

RESULTS = Path(__file__).parent / "results" / "setup_time_dims.json"
CASES = ("dims", "frozen", "dims_before_fix")
MEMORY_CAP = 8 * 2**30
N_ROWS, N_FEATURES = 20_000, 10


def build_model(n_rows: int, n_features: int, frozen: bool) -> tuple[Any, dict[str, Any]]:
    """Logistic regression with an intercept, on pm.Data with dims; and a reference point."""
    import numpy as np
    import pymc as pm
    from pymc.model.transform.optimization import freeze_dims_and_data

    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, n_features))
    beta = rng.normal(0.0, 0.3, size=n_features)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(0.5 + X @ beta))))
    coords = {"obs": range(n_rows), "feature": [f"x{j}" for j in range(n_features)]}
    with pm.Model(coords=coords) as model:
        X_data = pm.Data("X", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")
        alpha = pm.Normal("alpha", 0.0, 5.0)
        coefficients = pm.Normal("beta", 0.0, 1.0, dims="feature")
        p = pm.math.invlogit(alpha + X_data @ coefficients)
        pm.Bernoulli("y_obs", p=p, observed=y_data, dims="obs")
    if frozen:
        model = freeze_dims_and_data(model)
    return model, {"alpha": 0.5, "beta": beta}


def worker(case: str) -> None:
    """Build the step for one case and print its set-up time as JSON."""
    import pymc_subsample as pms

    if case == "dims_before_fix":
        from pymc_subsample.model import functions

        def unchanged(outputs: Any, q: Any, length: int) -> tuple[list[Any], Any]:
            return list(outputs), q

        functions.with_static_length = unchanged  # type: ignore[assignment]
    model, reference = build_model(N_ROWS, N_FEATURES, frozen=case == "frozen")
    start = time.perf_counter()
    with model:
        pms.AusterityMH(control_variate="taylor2", reference_point=reference, batch_size=500)
    seconds = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"seconds": round(seconds, 2), "peak_rss_gb": round(peak_gb, 2)}))


def run_case(case: str, compiledir: str, timeout: float) -> dict[str, Any]:
    """Run one case in a subprocess with a time limit and a memory cap."""
    env = {**os.environ, "PYTENSOR_FLAGS": f"base_compiledir={compiledir}"}
    command = [sys.executable, __file__, "--worker", case]
    start = time.perf_counter()
    done = run_limited(command, timeout_s=timeout, memory_bytes=MEMORY_CAP, env=env)
    if done is None:
        return {"seconds": None, "status": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
        elapsed = time.perf_counter() - start
        return {"seconds": None, "status": f"failed after {elapsed:.0f} s: {tail[0]}"}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "status": "ok"}


def stack_key() -> str:
    import pymc as pm

    major, minor = sys.version_info[:2]
    return f"py{major}{minor}-pymc{pm.__version__.split('.')[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    import pymc as pm
    import pytensor

    results: dict[str, Any] = {}
    load_before = os.getloadavg()[0]
    for case in args.cases:
        with tempfile.TemporaryDirectory(prefix="pytensor-") as compiledir:
            cold = run_case(case, compiledir, args.timeout)
            warm = run_case(case, compiledir, args.timeout) if cold["status"] == "ok" else None
        results[case] = {"cold": cold, "warm": warm}
        print(case, json.dumps(results[case]), flush=True)
    payload = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    payload["model"] = (
        f"logistic regression with intercept, N={N_ROWS}, {N_FEATURES} features, pm.Data and "
        "parameters with dims; AusterityMH(control_variate='taylor2', reference_point=...)"
    )
    payload[stack_key()] = {
        "python": platform.python_version(),
        "pymc": pm.__version__,
        "pytensor": pytensor.__version__,
        "linker": str(pytensor.config.linker),
        "timeout_s": args.timeout,
        "cpus": os.cpu_count(),
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "setup_seconds": results,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

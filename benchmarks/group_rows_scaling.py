"""Rows read per draw by the default step on a hierarchy as N grows at fixed groups.

The issue's bar: "Rows per draw stay O(1) in N: within 1.5x from 1e5 to 1e7 rows at a fixed
number of groups." Two models of ``hierarchical_groups.py`` (its builders, fixed seeds, uneven
Dirichlet(0.7) group sizes), each at ``--rows`` rows (default 1e5, 1e6 and 1e7):

- ``centred_poisson``: 100 groups, centred varying intercepts and slopes, Poisson rows
  (204 parameters);
- ``noncentred_logistic``: 200 groups, non-centred varying intercepts and 4 shared
  coefficients, Bernoulli rows (206 parameters).

Each (model, N) runs in a fresh process (memory and compile caches do not leak between runs):
build the model, build ``pms.AusterityMH()`` with no arguments (on these models it builds
``pms.GroupEffectsMH``; ``step`` records the class) and time it (``setup_seconds``), then one
chain of 500 tuning + 500 draws with ``cores=1`` and ``random_seed=1`` (``sampling_seconds``).
Reported per run from the draws' sample stats: rows per draw (stat ``n_data``: mean, median,
90th percentile, and the mean as a fraction of N), the groups decided on all their rows
(``n_full_groups``), the shared coefficients' rows (``shared_n_data``, the logistic model's
``beta``; part of ``n_data``; its median, 90th percentile and the share of draws whose shared
move read all N rows), the groups' rows (``n_data - shared_n_data``), acceptance;
microseconds per iteration (``us_per_draw``: ``sampling_seconds / (tune + draws)``), split by
``pm.sample``'s callback into ``us_per_tuning_draw`` (it includes the step's passes over all N
rows to expand the groups' likelihoods, at the start and a few times while tuning, which
``n_data`` does not count) and ``us_per_draw_after_tuning``; the child's peak resident memory,
the load average before and after (other work shares the machine), the ``SubsampleWarning``
messages, and an error's text where a run failed or ran past ``--timeout``
(the benchmark goes on). Per model: ``rows_ratio_max_to_min``, the largest mean rows per draw
over the smallest across the N values, and ``within_1_5x``; the same ratio for the groups' and
the shared rows and for ``n_full_groups`` (which part grows, if any).

``results/group_rows_scaling.json`` came from ``python benchmarks/group_rows_scaling.py`` (the
defaults; its ``command``, ``seconds`` and ``source``, the commit measured): 112 s on a 2-core
machine at load average 1.3 to 1.8 (peak resident memory at 1e7 rows 1.9 and 2.3 GiB).
``--quick`` is a smoke test (1e4 and 1e5 rows, 100 + 100 draws, 35 s;
``results/group_rows_scaling_quick.json``). ``--models`` picks the models. The JSON is written after
each run, so a run stopped part-way keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
from common import write_json
from hierarchical_groups import centred_poisson, noncentred_logistic

import pymc_subsample as pms

#: Model name: (builder taking (groups, rows), groups).
MODELS: dict[str, tuple[Callable[[int, int], Any], int]] = {
    "centred_poisson": (centred_poisson, 100),
    "noncentred_logistic": (noncentred_logistic, 200),
}
ROWS = (100_000, 1_000_000, 10_000_000)
QUICK_ROWS = (10_000, 100_000)
#: (tune, draws) of one chain: the full run and ``--quick``.
DRAWS = ((500, 500), (100, 100))
CHILD_TIMEOUT_S = 1800.0
BAR = 1.5


def run_one(model_name: str, n_rows: int, tune: int, draws: int) -> dict[str, Any]:
    """Build the model and the default step in this process, sample; return the measurements.

    Parameters
    ----------
    model_name : str
        A key of ``MODELS``.
    n_rows : int
        The model's rows.
    tune, draws : int
        Tuning iterations and draws of the one chain.

    Returns
    -------
    dict
        The run's timings, rows-per-draw statistics and peak resident memory.
    """
    builder, n_groups = MODELS[model_name]
    begin = time.perf_counter()
    model = builder(n_groups, n_rows)
    model_seconds = time.perf_counter() - begin
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pms.SubsampleWarning)
        start = time.perf_counter()
        step = pms.AusterityMH()
        setup = time.perf_counter() - start
        stamps: dict[str, float] = {}

        def stamp(trace: Any, draw: Any) -> None:
            stamps["tuning" if draw.tuning else "draws"] = time.perf_counter()

        start = time.perf_counter()
        idata = pm.sample(
            callback=stamp,
            step=step,
            tune=tune,
            draws=draws,
            chains=1,
            cores=1,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
        sampling = time.perf_counter() - start
    stats = idata.sample_stats
    rows = stats["n_data"].values.ravel().astype(float)
    run: dict[str, Any] = {
        "model": model_name,
        "groups": n_groups,
        "rows": n_rows,
        "tune": tune,
        "draws": draws,
        "step": type(step).__name__,
        "model_seconds": model_seconds,
        "setup_seconds": setup,
        "sampling_seconds": sampling,
        "us_per_draw": sampling / (tune + draws) * 1e6,
        "us_per_tuning_draw": (stamps["tuning"] - start) / tune * 1e6 if tune else None,
        "us_per_draw_after_tuning": (stamps["draws"] - stamps.get("tuning", start)) / draws * 1e6,
        "rows_per_draw": float(rows.mean()),
        "rows_per_draw_median": float(np.median(rows)),
        "rows_per_draw_p90": float(np.percentile(rows, 90)),
        "rows_per_draw_fraction_of_n": float(rows.mean()) / n_rows,
    }
    if "n_full_groups" in stats:
        run["n_full_groups"] = float(stats["n_full_groups"].mean())
    if "shared_n_data" in stats:
        shared = stats["shared_n_data"].values.ravel().astype(float)
        run["shared_rows_per_draw"] = float(shared.mean())
        run["group_rows_per_draw"] = float((rows - shared).mean())
    for name in ("accept_rate", "hyper_accept_rate"):
        if name in stats:
            run[name] = float(np.nanmean(stats[name].values))
    if "shared_n_data" in stats and stats["shared_n_data"].values.any():  # a shared move
        run["shared_rows_per_draw_median"] = float(np.median(shared))
        run["shared_rows_per_draw_p90"] = float(np.percentile(shared, 90))
        run["shared_accept_rate"] = float(stats["shared_accepted"].values.mean())
        run["shared_full_data_rate"] = float(stats["shared_full_data"].values.mean())
    if "batch_size" in stats:
        run["batch_size"] = int(stats["batch_size"].values.ravel()[-1])
    # Linux reports ru_maxrss in KiB.
    run["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    run["warnings"] = sorted({str(w.message) for w in caught})
    return run


def run_child(
    model_name: str, n_rows: int, counts: tuple[int, int], timeout: float
) -> dict[str, Any]:
    """Run :func:`run_one` in a fresh process; its JSON, or the error's text.

    Parameters
    ----------
    model_name : str
        A key of ``MODELS``.
    n_rows : int
        The model's rows.
    counts : tuple of int
        (tune, draws) of the chain.
    timeout : float
        Seconds after which the child is killed and the run recorded as failed.

    Returns
    -------
    dict
        The child's measurements (or ``error``), the wall seconds and the load averages.
    """
    command = [sys.executable, str(Path(__file__)), "--child", model_name, str(n_rows)]
    command += ["--tune", str(counts[0]), "--draws", str(counts[1])]
    load_before = os.getloadavg()
    begin = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
        error = None if done.returncode == 0 else done.stderr[-3000:]
    except subprocess.TimeoutExpired:
        error = f"timed out after {timeout} s"
    extra = {
        "wall_seconds": time.perf_counter() - begin,
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
    }
    if error is not None:
        run = {"model": model_name, "rows": n_rows, "tune": counts[0], "draws": counts[1]}
        print(model_name, n_rows, "FAILED", error, flush=True)
        return {**run, "error": error, **extra}
    run = {**json.loads(done.stdout.strip().splitlines()[-1]), **extra}
    print(json.dumps({k: v for k, v in run.items() if k != "warnings"}), flush=True)
    return run


def ratio(runs: list[dict[str, Any]], key: str) -> float | None:
    """The largest value of ``key`` over the smallest across the runs that have it.

    Parameters
    ----------
    runs : list of dict
        One model's runs.
    key : str
        The measurement to compare.

    Returns
    -------
    float or None
        The ratio; None with fewer than two runs, or where the smallest is 0.
    """
    values = [run[key] for run in runs if key in run and "error" not in run]
    if len(values) < 2 or min(values) <= 0:
        return None
    return max(values) / min(values)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's rows per draw at each N and their spread against the issue's bar.

    Parameters
    ----------
    runs : list of dict
        The model's runs, one per N.

    Returns
    -------
    dict
        Rows per draw (and as a fraction of N) by N, ``rows_ratio_max_to_min`` and
        ``within_1_5x``, and the same ratio for the groups' and the shared rows and
        ``n_full_groups``.
    """
    ok = [run for run in runs if "error" not in run]
    rows_ratio = ratio(ok, "rows_per_draw")
    return {
        "rows_per_draw": {str(run["rows"]): run["rows_per_draw"] for run in ok},
        "rows_per_draw_fraction_of_n": {
            str(run["rows"]): run["rows_per_draw_fraction_of_n"] for run in ok
        },
        "rows_ratio_max_to_min": rows_ratio,
        "within_1_5x": None if rows_ratio is None else rows_ratio <= BAR,
        "group_rows_ratio_max_to_min": ratio(ok, "group_rows_per_draw"),
        "shared_rows_ratio_max_to_min": ratio(ok, "shared_rows_per_draw"),
        "n_full_groups_ratio_max_to_min": ratio(ok, "n_full_groups"),
        "failed_rows": [run["rows"] for run in runs if "error" in run],
    }


def source_state() -> dict[str, Any]:
    """The git commit and the package files changed since it (the code the run measured).

    Returns
    -------
    dict
        ``commit`` and ``changed``, the ``git status --short`` lines under ``pymc_subsample/``
        (empty where git is not available).
    """
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--short", "--", "pymc_subsample"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"commit": commit, "changed": status}


def main() -> None:
    """Parse the arguments; run each (model, N) in a child process and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--rows", type=int, nargs="+", help=f"N values (default {ROWS})")
    parser.add_argument(
        "--quick", action="store_true", help=f"rows {QUICK_ROWS}, 100 + 100 draws (smoke test)"
    )
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="s per run")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ROWS"), help=argparse.SUPPRESS)
    parser.add_argument("--tune", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--draws", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child[0], int(args.child[1]), args.tune, args.draws)))
        return
    all_rows = args.rows or (QUICK_ROWS if args.quick else ROWS)
    counts = DRAWS[int(args.quick)]
    name = "group_rows_scaling_quick" if args.quick else "group_rows_scaling"
    command = "python benchmarks/group_rows_scaling.py " + " ".join(sys.argv[1:])
    source = source_state()
    begin = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {model_name: [] for model_name in args.models}
    for model_name in args.models:
        for n_rows in all_rows:
            runs[model_name].append(run_child(model_name, n_rows, counts, args.timeout))
            # Written after each run: a run stopped part-way keeps what it measured.
            payload = {
                "quick": args.quick,
                "command": command.strip(),
                "seconds": time.perf_counter() - begin,
                "cpu_count": os.cpu_count(),
                "source": source,
                "bar": "rows per draw within 1.5x from 1e5 to 1e7 rows at fixed groups",
                "tune_draws": list(counts),
                "models": {k: summarise(v) for k, v in runs.items()},
                "runs": [run for model_runs in runs.values() for run in model_runs],
            }
            write_json(name, payload)
    for model_name, summary in payload["models"].items():
        print(
            model_name,
            {k: summary[k] for k in ("rows_per_draw", "rows_ratio_max_to_min", "within_1_5x")},
        )


if __name__ == "__main__":
    main()

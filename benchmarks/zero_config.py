"""Zero configuration: ``AusterityMH()`` and ``MinibatchBarkerMH()`` with no arguments against NUTS.

Issue 14's target: logistic regression with N = 1e6 rows and d = 10 coefficients
(``common.logistic_data``), one chain of 2,000 tuning and 20,000 kept draws for each step with
no arguments at all, against nutpie (``pip install nutpie``; PyMC's NUTS where it is absent) on
the same data, 1 chain of 1,000 + 1,000 draws. Each sampler runs in its own fresh process (so a
step cannot reuse functions another compiled) and reports:

- wall seconds of set-up (building the step: compilation, reference search, control-variate
  pass) and of ``pm.sample``; min ESS over the coefficients and min-ESS per second of the whole
  wall time, and its ratio to the NUTS run's;
- rows per draw (stat ``n_data``) and microseconds per draw;
- max |posterior mean error| in posterior sds and the range of sd ratios, against the Laplace
  approximation at the full-data mode (exact to O(1/sqrt(N)), about 0.001 sd here) and against
  the NUTS run;
- peak resident memory of the process, and its growth while building the step and sampling,
  over the data's size.

Run ``python benchmarks/zero_config.py`` (about 20 minutes on 2 cores, 17 of them nutpie);
``--rows 100000`` for a quick look; ``--reuse-nuts`` reruns the two steps only and takes the
NUTS run from the existing ``results/zero_config.json`` (same rows, same machine). Writes
``results/zero_config.json``. ``--steps-only --rows 10000000`` runs the two steps alone at
another N (memory and per-draw cost; no NUTS, no ratios) into
``results/zero_config_<rows>.json``. ``--proposal hmc --reuse-nuts`` runs the two steps with
``proposal="hmc"`` as their only argument (Hamiltonian trajectories instead of the default's
independent draws) against the saved NUTS run, into ``results/zero_config_hmc.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from common import RESULTS, logistic_data, logistic_model, write_json

import pymc_subsample as pms

SAMPLERS = ("austerity", "barker", "nuts")
STEP_DRAWS = {"tune": 2_000, "draws": 20_000}
NUTS_DRAWS = {"tune": 1_000, "draws": 1_000}


def laplace_reference(X: np.ndarray, y: np.ndarray, prior_sd: float = 2.0) -> dict[str, Any]:
    """Mode and covariance of the logistic posterior by full-data Newton (in numpy)."""
    beta = np.zeros(X.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-X @ beta))
        gradient = X.T @ (y - p) - beta / prior_sd**2
        precision = (X * (p * (1 - p))[:, None]).T @ X + np.eye(X.shape[1]) / prior_sd**2
        step = np.linalg.solve(precision, gradient)
        beta += step
        if float(step @ precision @ step) < 1e-20:
            break
    covariance = np.linalg.inv(precision)
    return {"mean": beta, "sd": np.sqrt(np.diag(covariance))}


def run_one(sampler: str, n_rows: int, proposal: str = "auto") -> dict[str, Any]:
    """Build and run one sampler in this process; return its measurements."""
    X, y = logistic_data(n_rows, 10)
    model = logistic_model(X, y)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    with model:
        if sampler == "nuts":
            try:
                import nutpie  # noqa: F401

                kwargs: dict[str, Any] = {"nuts_sampler": "nutpie"}
                name = "nutpie"
            except ImportError:
                kwargs, name = {}, "pymc-nuts"
            setup = 0.0
            idata = pm.sample(chains=1, random_seed=1, progressbar=False, **NUTS_DRAWS, **kwargs)
            stats: dict[str, Any] = {}
        else:
            step_class = pms.AusterityMH if sampler == "austerity" else pms.MinibatchBarkerMH
            step = step_class() if proposal == "auto" else step_class(proposal=proposal)
            setup = time.perf_counter() - start
            name = sampler
            idata = pm.sample(
                step=step,
                chains=1,
                cores=1,
                random_seed=1,
                progressbar=False,
                compute_convergence_checks=False,
                **STEP_DRAWS,
            )
            n_data = idata.sample_stats["n_data"].values
            stats = {
                "proposal": step.proposal_kind,
                "n_steps": float(idata.sample_stats["n_steps"].values.mean()),
                "n_grad_rows": float(idata.sample_stats["n_grad_rows"].values.mean()),
                "control_variate": step.control_variate,
                "batch_size": step.batch_size,
                "reference_rows": step.reference_rows,
                "rows_per_draw": float(n_data.mean()),
            }
    wall = time.perf_counter() - start
    draws = idata.posterior["beta"].values.reshape(-1, X.shape[1])
    n_draws = STEP_DRAWS if sampler != "nuts" else NUTS_DRAWS
    return {
        "sampler": name,
        "setup_seconds": setup,
        "wall_seconds": wall,
        "us_per_draw": (wall - setup) / (n_draws["tune"] + n_draws["draws"]) * 1e6,
        "min_ess": float(az.ess(idata, var_names=["beta"])["beta"].values.min()),
        "mean": draws.mean(0).tolist(),
        "sd": draws.std(0, ddof=1).tolist(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_growth_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before,
        "data_bytes": int(X.nbytes + y.nbytes),
        **stats,
    }


def compare(run: dict[str, Any], mean: np.ndarray, sd: np.ndarray) -> dict[str, float]:
    """Max |mean error| in sds of the reference, and the range of sd ratios."""
    error = np.abs(np.asarray(run["mean"]) - mean) / sd
    ratio = np.asarray(run["sd"]) / sd
    return {
        "max_abs_mean_error_sd": float(error.max()),
        "sd_ratio_min": float(ratio.min()),
        "sd_ratio_max": float(ratio.max()),
    }


def _run_child(sampler: str, rows: int, proposal: str = "auto") -> dict[str, Any]:
    """Run one sampler in a fresh process and return its measurements."""
    command = [sys.executable, str(Path(__file__)), "--child", sampler, "--rows", str(rows)]
    command += ["--proposal", proposal]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{sampler} failed:\n{done.stderr[-3000:]}")
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(sampler, {k: v for k, v in run.items() if k not in ("mean", "sd")})
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reuse-nuts", action="store_true", help="keep the last NUTS run")
    parser.add_argument("--child", choices=SAMPLERS, help=argparse.SUPPRESS)
    parser.add_argument(
        "--proposal",
        default="auto",
        choices=("auto", "hmc"),
        help="the steps' proposal argument (auto: none given); hmc writes zero_config_hmc.json",
    )
    parser.add_argument(
        "--steps-only",
        action="store_true",
        help="run the two steps without NUTS (no ratios) and write results/zero_config_<rows>.json:"
        " the memory and per-draw cost at another N",
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.rows, args.proposal)))
        return
    if args.steps_only:
        steps = {sampler: _run_child(sampler, args.rows) for sampler in ("austerity", "barker")}
        for run in steps.values():
            run["memory_growth_over_data"] = run["rss_growth_bytes"] / run["data_bytes"]
            run["peak_rss_over_data"] = run["peak_rss_bytes"] / run["data_bytes"]
        write_json(f"zero_config_{args.rows}", {"rows": args.rows, "features": 10, "runs": steps})
        return
    runs: dict[str, Any] = {}
    if args.reuse_nuts:
        previous = json.loads((RESULTS / "zero_config.json").read_text())
        if previous["rows"] != args.rows:
            raise ValueError(f"the saved NUTS run has {previous['rows']} rows, not {args.rows}")
        runs["nuts"] = previous["runs"]["nuts"]
        runs["nuts"]["reused_from"] = previous["machine"]
    for sampler in SAMPLERS:
        if sampler in runs:
            continue
        runs[sampler] = _run_child(sampler, args.rows, args.proposal)
    X, y = logistic_data(args.rows, 10)
    laplace = laplace_reference(X, y)
    nuts = runs["nuts"]
    nuts_rate = nuts["min_ess"] / nuts["wall_seconds"]
    for run in runs.values():
        run["min_ess_per_second"] = run["min_ess"] / run["wall_seconds"]
        run["ratio_to_nuts"] = run["min_ess_per_second"] / nuts_rate
        run["against_laplace"] = compare(run, laplace["mean"], laplace["sd"])
        run["against_nuts"] = compare(run, np.asarray(nuts["mean"]), np.asarray(nuts["sd"]))
        run["memory_growth_over_data"] = run["rss_growth_bytes"] / run["data_bytes"]
    write_json(
        "zero_config" if args.proposal == "auto" else f"zero_config_{args.proposal}",
        {
            "proposal": args.proposal,
            "rows": args.rows,
            "features": 10,
            "step_draws": STEP_DRAWS,
            "nuts_draws": NUTS_DRAWS,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()

"""``SGFS()`` with no arguments against the exact posterior of a conjugate linear regression.

Issue 37, item 3: on y ~ N(X beta, 1), beta ~ N(0, 10^2 I), N = 100,000 rows, d = 5 columns
of correlation 0.5 (the model of ``tests/test_sgfs_spread.py``), the former defaults (a
reference start, step size 40, the plain minibatch gradient) sampled the right spread over
50,000 draws but mixed at min ESS 6 to 23 per 5,000 draws. The target: min ESS >= 500 per
5,000 draws and E2 <= 0.5 at 5,000 draws, on 5 data seeds.

Per data seed, one chain of 1,000 tuning steps and 5,000 draws (``cores=1``), for

- ``new``: ``pms.SGFS()`` (the first-order control variate at the reference point, step size 2);
- ``old``: ``pms.SGFS(control_variate=None)``, which is exactly the former defaults.

Reported per run: min ESS over the 5 coefficients (ArviZ's rank-normalised bulk ESS), E2 =
sum|C - C_exact| / sum|C_exact| (Ahn et al. 2012, eq. 14) of the draws' covariance, the largest
error of a posterior mean in exact posterior sds, the smallest ESS the step's own check
estimated (``SGFS._ess``, lag-1 autocorrelation) and whether it warned, and wall time (step
construction, i.e. the reference search and the score sum, and ``pm.sample``).

Writes benchmarks/results/sgfs_defaults.json.

    python benchmarks/sgfs_defaults.py [--seeds 5] [--draws 5000] [--rows 100000]
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from common import write_json

import pymc_subsample as pms
from pymc_subsample.warnings import SubsampleWarning

D = 5
PRIOR_SD = 10.0
TUNE = 1000
TARGET_ESS, TARGET_E2 = 500, 0.5
RUNS: dict[str, dict[str, Any]] = {"new": {}, "old": {"control_variate": None}}


def make_data(n_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns of correlation 0.5 and unit noise (``tests/test_sgfs_spread.py``'s model)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, D)) @ np.linalg.cholesky(0.5 * np.eye(D) + 0.5).T
    return X, X @ rng.normal(size=D) + rng.normal(size=n_rows)


def exact_posterior(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of beta given y (conjugate Gaussian)."""
    covariance = np.linalg.inv(X.T @ X + np.eye(D) / PRIOR_SD**2)
    return covariance @ X.T @ y, covariance


def run(X: np.ndarray, y: np.ndarray, kwargs: dict[str, Any], draws: int) -> dict[str, Any]:
    """One chain of SGFS(**kwargs) and its errors against the exact posterior."""
    mean, covariance = exact_posterior(X, y)
    with pm.Model(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beta = pm.Normal("beta", 0.0, PRIOR_SD, shape=D)
        pm.Normal("y", X @ beta, 1.0, observed=y)
        start = time.perf_counter()
        step = pms.SGFS(**kwargs)
        built = time.perf_counter()
        idata = pm.sample(
            tune=TUNE,
            draws=draws,
            chains=1,
            cores=1,
            step=step,
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )
        end = time.perf_counter()
    samples = idata.posterior["beta"].values.reshape(-1, D)
    error = np.abs(np.cov(samples, rowvar=False) - covariance).sum() / np.abs(covariance).sum()
    mean_error = np.abs(samples.mean(axis=0) - mean) / np.sqrt(np.diag(covariance))
    messages = [str(w.message) for w in caught if issubclass(w.category, SubsampleWarning)]
    return {
        "min_ess": float(np.min(az.ess(idata)["beta"].values)),
        "E2": float(error),
        "max_mean_error_sd": float(mean_error.max()),
        "step_ess_estimate": step._ess.ess(),
        "low_ess_warning": any("effective sample size" in m for m in messages),
        "warnings": messages,
        "step_size": step.step_size,
        "control_variate": step.control,
        "build_seconds": built - start,
        "sample_seconds": end - built,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--draws", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNS}
    for seed in range(args.seeds):
        X, y = make_data(args.rows, seed)
        for name, kwargs in RUNS.items():
            outcome = {"seed": seed, **run(X, y, kwargs, args.draws)}
            results[name].append(outcome)
            print(
                f"seed {seed} {name:>3}: min ESS {outcome['min_ess']:7.0f}  E2 "
                f"{outcome['E2']:.3f}  mean error {outcome['max_mean_error_sd']:.2f} sd  "
                f"step's ESS {outcome['step_ess_estimate']:7.0f}  warned "
                f"{outcome['low_ess_warning']}  {outcome['sample_seconds']:.1f} s",
                flush=True,
            )
    summary = {
        name: {
            "min_ess": [min(r["min_ess"] for r in rows), max(r["min_ess"] for r in rows)],
            "E2": [min(r["E2"] for r in rows), max(r["E2"] for r in rows)],
            "max_mean_error_sd": max(r["max_mean_error_sd"] for r in rows),
            "meets_target": all(r["min_ess"] >= TARGET_ESS and r["E2"] <= TARGET_E2 for r in rows),
            "low_ess_warnings": sum(r["low_ess_warning"] for r in rows),
        }
        for name, rows in results.items()
    }
    for name, line in summary.items():
        print(name, line)
    write_json(
        "sgfs_defaults",
        {
            "config": {
                "rows": args.rows,
                "coefficients": D,
                "column_correlation": 0.5,
                "prior_sd": PRIOR_SD,
                "tune": TUNE,
                "draws": args.draws,
                "chains": 1,
                "data_seeds": list(range(args.seeds)),
                "runs": {name: kwargs for name, kwargs in RUNS.items()},
                "targets": {"min_ess": TARGET_ESS, "E2": TARGET_E2},
            },
            "summary": summary,
            "runs": results,
        },
    )


if __name__ == "__main__":
    main()

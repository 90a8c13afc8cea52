"""Zero configuration against NUTS on tall hierarchical and correlated models (issue 16).

Three synthetic models, generated with fixed seeds in the style of PyMC's example gallery
(``coords``/``dims``, ``pm.Data`` for the covariates):

- ``radon_centred`` and ``radon_noncentred``: a radon-style model with 85 groups of very
  unequal sizes (lognormal allocation; ``--rows`` rows in all, default 100,000), a row-level
  covariate (floor, 0/1) and a group-level one (log uranium), varying intercepts and slopes
  (``a[g] ~ Normal(mu_a + gamma * u[g], sigma_a)``, ``b[g] ~ Normal(mu_b, sigma_b)``, or their
  non-centred forms), HalfNormal scales and a Normal likelihood: 176 parameters;
- ``regression``: a linear regression with 30 coefficients on features with AR(1) correlation
  0.9 between neighbouring columns, ``--rows`` rows, Normal(0, 1) priors, HalfNormal noise.

Samplers, each in a fresh process on the same data: ``pm.sample()`` with its default NUTS
(nutpie where installed, as PyMC 6 picks it), 2 chains of 1,000 tuning + 1,000 draws;
``pms.AusterityMH()`` and ``pms.MinibatchBarkerMH()`` with no arguments, 2 chains of 1,000 +
2,000. All run with ``cores=1`` (chains one after the other). Reported per run: set-up seconds
(building the step), wall seconds including set-up, min bulk ESS over every free parameter and
min-ESS per wall second, its ratio to NUTS's, max |mean error| in NUTS's posterior sds and the
range of sd ratios against the NUTS run (all parameters), rows per draw (stat ``n_data``),
gradient rows per draw (``n_grad_rows``), leapfrog steps, acceptance, the proposal and control
variate in use, and the ``SubsampleWarning`` messages.

Run ``python benchmarks/tall_hierarchical.py`` (about 8 minutes on 2 cores); ``--rows 20000`` for
a quick look; ``--models radon_centred`` for one model. Writes
``results/tall_hierarchical.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from common import write_json

import pymc_subsample as pms

MODELS = ("radon_centred", "radon_noncentred", "regression")
SAMPLERS = ("nuts", "austerity", "barker")
N_GROUPS = 85


def radon_model(n_rows: int, centred: bool) -> pm.Model:
    """Varying intercepts and slopes over 85 groups of lognormal sizes (seed 0)."""
    rng = np.random.default_rng(0)
    weights = rng.lognormal(0.0, 1.0, N_GROUPS)
    sizes = np.maximum(1, np.round(weights / weights.sum() * n_rows)).astype(int)
    group = np.repeat(np.arange(N_GROUPS), sizes)
    rng.shuffle(group)
    floor = rng.binomial(1, 0.3, group.size).astype(float)
    uranium = rng.normal(0.0, 0.5, N_GROUPS)
    a_true = 1.5 + 0.7 * uranium + rng.normal(0.0, 0.3, N_GROUPS)
    b_true = -0.6 + rng.normal(0.0, 0.2, N_GROUPS)
    y = a_true[group] + b_true[group] * floor + rng.normal(0.0, 0.75, group.size)
    coords = {"county": np.arange(N_GROUPS), "obs": np.arange(group.size)}
    with pm.Model(coords=coords) as model:
        x = pm.Data("floor", floor, dims="obs")
        county = pm.Data("county_idx", group, dims="obs")
        mu_a = pm.Normal("mu_a", 0.0, 5.0)
        gamma = pm.Normal("gamma", 0.0, 5.0)
        mu_b = pm.Normal("mu_b", 0.0, 5.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        sigma_b = pm.HalfNormal("sigma_b", 1.0)
        if centred:
            a = pm.Normal("a", mu_a + gamma * uranium, sigma_a, dims="county")
            b = pm.Normal("b", mu_b, sigma_b, dims="county")
        else:
            z_a = pm.Normal("z_a", 0.0, 1.0, dims="county")
            z_b = pm.Normal("z_b", 0.0, 1.0, dims="county")
            a = pm.Deterministic("a", mu_a + gamma * uranium + sigma_a * z_a, dims="county")
            b = pm.Deterministic("b", mu_b + sigma_b * z_b, dims="county")
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", a[county] + b[county] * x, sigma, observed=y, dims="obs")
    return model


def regression_model(n_rows: int, n_coefficients: int = 30) -> pm.Model:
    """Linear regression on AR(1)-correlated features (0.9 between neighbours; seed 0)."""
    rng = np.random.default_rng(0)
    lags = np.abs(np.subtract.outer(np.arange(n_coefficients), np.arange(n_coefficients)))
    factor = np.linalg.cholesky(0.9**lags)
    X = rng.normal(size=(n_rows, n_coefficients)) @ factor.T
    beta = rng.normal(0.0, 0.5, n_coefficients)
    y = X @ beta + rng.normal(0.0, 1.0, n_rows)
    coords = {"feature": np.arange(n_coefficients), "obs": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        features = pm.Data("X", X, dims=("obs", "feature"))
        coefficients = pm.Normal("beta", 0.0, 1.0, dims="feature")
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", features @ coefficients, sigma, observed=y, dims="obs")
    return model


def build(name: str, n_rows: int) -> pm.Model:
    if name == "regression":
        return regression_model(n_rows)
    return radon_model(n_rows, centred=name == "radon_centred")


def run_one(model_name: str, sampler: str, n_rows: int) -> dict[str, Any]:
    """Build and run one sampler in this process; return its measurements and draws."""
    model = build(model_name, n_rows)
    names = [rv.name for rv in model.free_RVs]
    start = time.perf_counter()
    stats: dict[str, Any] = {}
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pms.SubsampleWarning)
        if sampler == "nuts":
            setup = 0.0
            idata = pm.sample(
                1000, tune=1000, chains=2, cores=1, random_seed=1, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip
        else:
            step_class = pms.AusterityMH if sampler == "austerity" else pms.MinibatchBarkerMH
            step = step_class()
            setup = time.perf_counter() - start
            idata = pm.sample(
                2000, tune=1000, chains=2, cores=1, step=step, random_seed=1, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip
            sample_stats = idata.sample_stats
            stats = {
                "proposal": step.proposal_kind,
                "control_variate": step.control_variate,
                "rows_per_draw": float(sample_stats["n_data"].mean()),
                "grad_rows_per_draw": float(sample_stats["n_grad_rows"].mean()),
                "n_steps": float(sample_stats["n_steps"].mean()),
                "acceptance": float(sample_stats["accepted"].mean()),
                "step_size": float(sample_stats["scaling"][:, -1].mean()),
            }
    wall = time.perf_counter() - start
    ess = az.ess(idata, var_names=names)
    min_ess = min(float(ess[name].min()) for name in names)
    posterior = idata.posterior
    draws = {
        name: posterior[name].values.reshape(-1, int(np.prod(posterior[name].shape[2:])))
        for name in names
    }
    return {
        "model": model_name,
        "sampler": "nuts" if sampler == "nuts" else sampler,
        "rows": int(model.rvs_to_values[model.observed_RVs[0]].data.shape[0]),
        "n_params": int(sum(d.shape[1] for d in draws.values())),
        "setup_seconds": setup,
        "wall_seconds": wall,
        "min_ess": min_ess,
        "min_ess_per_second": min_ess / wall,
        "mean": {k: v.mean(0).tolist() for k, v in draws.items()},
        "sd": {k: v.std(0, ddof=1).tolist() for k, v in draws.items()},
        "warnings": [
            str(w.message) for w in caught if issubclass(w.category, pms.SubsampleWarning)
        ],
        **stats,
    }


def compare(run: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """Max |mean error| in the baseline's sds and the range of sd ratios, over all parameters."""
    errors, ratios = [], []
    for name, mean in baseline["mean"].items():
        sd = np.asarray(baseline["sd"][name])
        errors.append(np.abs(np.asarray(run["mean"][name]) - np.asarray(mean)) / sd)
        ratios.append(np.asarray(run["sd"][name]) / sd)
    error, ratio = np.concatenate(errors), np.concatenate(ratios)
    return {
        "max_abs_mean_error_sd": float(error.max()),
        "sd_ratio_min": float(ratio.min()),
        "sd_ratio_max": float(ratio.max()),
    }


def _run_child(model_name: str, sampler: str, rows: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__)), "--child", model_name, sampler]
    command += ["--rows", str(rows)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{model_name} {sampler} failed:\n{done.stderr[-3000:]}")
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    shown = ("mean", "sd", "warnings")
    print(model_name, sampler, {k: v for k, v in run.items() if k not in shown}, flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "SAMPLER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child[0], args.child[1], args.rows)))
        return
    results = []
    for model_name in args.models:
        runs = {sampler: _run_child(model_name, sampler, args.rows) for sampler in SAMPLERS}
        baseline = runs["nuts"]
        for sampler, run in runs.items():
            summary = {k: v for k, v in run.items() if k not in ("mean", "sd")}
            if sampler != "nuts":
                summary.update(compare(run, baseline))
                summary["ratio_to_nuts"] = (
                    run["min_ess_per_second"] / baseline["min_ess_per_second"]
                )
            results.append(summary)
    write_json("tall_hierarchical", {"rows": args.rows, "runs": results})


if __name__ == "__main__":
    main()

"""Default batch size and error knob of the two MH tests with a ``taylor2`` control variate.

Logistic regression (``common.logistic_data(100_000, 10)``, prior N(0, 2^2) on the 10
coefficients), one reference point (``pms.find_reference_point(random_seed=1)``) shared by every
run, each chain started there (``initvals=ref.initvals``). Grid, each configuration one chain on
one core, 1,000 tuning steps then ``--draws`` draws (100,000 by default, the same for all, so
that the Monte-Carlo error of a mean is about 0.02 sd and a bias of 0.05 sd shows), seed 1:

- ``AusterityMH(control_variate="taylor2")``, ``batch_size`` in {50, 100, 200, 500} x
  ``error_tolerance`` in {0.001, 0.01, 0.05};
- ``MinibatchBarkerMH(control_variate="taylor2")``, ``batch_size`` in {50, 100, 200, 500}
  (default ``error_bound=None``).

Exact posterior: PyMC's default sampler (NUTS) on the full data, 4 chains x 2,000 draws after
1,000 tuning steps, run one after the other on one core; its means, sds and Monte-Carlo standard
errors are cached in ``results/default_knobs_reference.npz`` and reused on later runs
(``--refresh-reference`` runs it again).

Recorded for each configuration (draws after tuning only, unless said otherwise):

- ``mean_rows_per_draw``: mean of the step's ``n_data`` stat (rows read per draw);
- ``us_per_draw``: wall time of ``pm.sample`` (tuning included) over tune + draws, in
  microseconds; the step's construction (compilation, proxies' pass) is ``setup_seconds``;
- ``min_ess`` (``arviz.ess``, bulk, over the 10 coefficients) and ``min_ess_per_second``
  (over the same ``pm.sample`` wall time);
- ``max_abs_mean_error_sd``: max over coefficients of |mean - exact mean| / exact sd;
- ``max_z``: max over coefficients of |mean - exact mean| / sqrt(MCSE^2 + MCSE_exact^2), the
  chain's MCSE from ``arviz.mcse`` and the exact posterior's from its NUTS run (small);
  ``mcse_over_sd_max`` is the largest chain MCSE in exact sds, i.e. the resolution of the mean
  error with this many draws;
- ``sd_ratio_max`` and ``sd_ratio_min``: max and min over coefficients of sd / exact sd.

``recommendation``: for each test, the cheapest configuration (fewest rows per draw, then highest
min-ESS per second) with ``max_abs_mean_error_sd <= 0.1`` and every sd ratio in [0.9, 1.1].

Run ``python benchmarks/default_knobs.py [--draws 100000] [--refresh-reference]`` from the
repository root (about 10 minutes on one core, plus 10 for NUTS when the cache is missing).
Writes ``results/default_knobs.json``. At 10,000 draws the Monte-Carlo error (0.07 sd) is as
large as the errors sought, and which configurations "pass" is chance.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from common import RESULTS, logistic_data, logistic_model, write_json

import pymc_subsample as pms

N_ROWS = 100_000
N_FEATURES = 10
DATA_SEED = 0
TUNE = 1000
BATCH_SIZES = (50, 100, 200, 500)
ERROR_TOLERANCES = (0.001, 0.01, 0.05)
MAX_MEAN_ERROR_SD = 0.1
SD_RATIO_RANGE = (0.9, 1.1)
REFERENCE_CACHE = RESULTS / "default_knobs_reference.npz"
REFERENCE_CHAINS = 4
REFERENCE_DRAWS = 2000
REFERENCE_TUNE = 1000


def exact_posterior(model: pm.Model, cache: Path, refresh: bool) -> dict[str, Any]:
    """Posterior means, sds and MCSEs of ``beta`` from full-data NUTS, cached in ``cache``.

    Parameters
    ----------
    model : pm.Model
        The logistic regression.
    cache : Path
        ``.npz`` file holding an earlier run's summaries; reused unless ``refresh`` or it was
        made for other data.
    refresh : bool
        Run NUTS again even when ``cache`` exists.

    Returns
    -------
    dict
        ``mean``, ``sd``, ``mcse`` (arrays over coefficients) and ``info`` (run details).
    """
    key = np.array([N_ROWS, N_FEATURES, DATA_SEED, REFERENCE_CHAINS, REFERENCE_DRAWS])
    if cache.exists() and not refresh:
        saved = np.load(cache)
        if np.array_equal(saved["key"], key):
            info = {
                "seconds": float(saved["seconds"]),
                "min_ess": float(saved["ess"].min()),
                "cached": True,
            }
            return {"mean": saved["mean"], "sd": saved["sd"], "mcse": saved["mcse"], "info": info}
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=REFERENCE_DRAWS,
            tune=REFERENCE_TUNE,
            chains=REFERENCE_CHAINS,
            cores=1,
            random_seed=100,
            progressbar=False,
            compute_convergence_checks=False,
        )
    seconds = time.perf_counter() - start
    draws = idata.posterior["beta"].values.reshape(-1, N_FEATURES)
    mean, sd = draws.mean(0), draws.std(0)
    ess = az.ess(idata, var_names=["beta"])["beta"].values
    mcse = az.mcse(idata, var_names=["beta"])["beta"].values
    RESULTS.mkdir(exist_ok=True)
    np.savez(cache, key=key, mean=mean, sd=sd, mcse=mcse, ess=ess, seconds=seconds)
    print(f"exact posterior: NUTS {seconds:.0f} s, min ESS {ess.min():.0f}", flush=True)
    return {
        "mean": mean,
        "sd": sd,
        "mcse": mcse,
        "info": {"seconds": seconds, "min_ess": float(ess.min()), "cached": False},
    }


def run_configuration(
    model: pm.Model,
    ref: pms.ReferencePoint,
    exact: dict[str, Any],
    test: str,
    batch_size: int,
    error_tolerance: float | None,
    draws: int,
) -> dict[str, Any]:
    """One chain of one test with ``taylor2``; cost, ESS and errors against the exact posterior.

    Parameters
    ----------
    model : pm.Model
        The logistic regression.
    ref : pms.ReferencePoint
        Reference point of the control variate and start of the chain.
    exact : dict
        Output of :func:`exact_posterior`.
    test : {"austerity", "barker"}
        ``AusterityMH`` or ``MinibatchBarkerMH``.
    batch_size : int
        The step's ``batch_size``.
    error_tolerance : float or None
        ``AusterityMH``'s ``error_tolerance``; None for Barker.
    draws : int
        Draws kept after the 1,000 tuning steps.

    Returns
    -------
    dict
        The configuration and its measurements (see the module docstring).
    """
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        if test == "austerity":
            step = pms.AusterityMH(
                control_variate="taylor2",
                reference_point=ref,
                batch_size=batch_size,
                error_tolerance=error_tolerance,
            )
        else:
            step = pms.MinibatchBarkerMH(
                control_variate="taylor2", reference_point=ref, batch_size=batch_size
            )
        setup_seconds = time.perf_counter() - start
        start = time.perf_counter()
        idata = pm.sample(
            draws=draws,
            tune=TUNE,
            step=step,
            chains=1,
            cores=1,
            random_seed=1,
            initvals=ref.initvals,
            progressbar=False,
            compute_convergence_checks=False,
        )
        sample_seconds = time.perf_counter() - start
    samples = idata.posterior["beta"].values.reshape(-1, N_FEATURES)
    ess = az.ess(idata, var_names=["beta"])["beta"].values
    mcse = az.mcse(idata, var_names=["beta"])["beta"].values
    error = np.abs(samples.mean(0) - exact["mean"])
    sd_ratio = samples.std(0) / exact["sd"]
    stats = idata.sample_stats
    subsample_warnings = sorted(
        {str(w.message) for w in caught if issubclass(w.category, pms.SubsampleWarning)}
    )
    return {
        "test": test,
        "batch_size": batch_size,
        "error_tolerance": error_tolerance,
        "mean_rows_per_draw": float(stats["n_data"].mean()),
        "full_data_share": float(stats["full_data"].mean()),
        "acceptance": float(stats["accepted"].mean()),
        "setup_seconds": setup_seconds,
        "sample_seconds": sample_seconds,
        "us_per_draw": 1e6 * sample_seconds / (TUNE + draws),
        "min_ess": float(ess.min()),
        "min_ess_per_second": float(ess.min()) / sample_seconds,
        "max_abs_mean_error_sd": float(np.max(error / exact["sd"])),
        "max_z": float(np.max(error / np.sqrt(mcse**2 + exact["mcse"] ** 2))),
        "mcse_over_sd_max": float(np.max(mcse / exact["sd"])),
        "sd_ratio_max": float(sd_ratio.max()),
        "sd_ratio_min": float(sd_ratio.min()),
        "warnings": subsample_warnings,
    }


def passes(entry: dict[str, Any]) -> bool:
    """Whether a configuration's mean error and sd ratios are within the accuracy targets."""
    low, high = SD_RATIO_RANGE
    return (
        entry["max_abs_mean_error_sd"] <= MAX_MEAN_ERROR_SD
        and low <= entry["sd_ratio_min"]
        and entry["sd_ratio_max"] <= high
    )


def recommend(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """For each test, the passing configuration with fewest rows per draw, then most ESS/s.

    Parameters
    ----------
    runs : list of dict
        Outputs of :func:`run_configuration`.

    Returns
    -------
    dict
        For each test, its chosen configuration's entry (None when none passes) and the
        number of configurations that pass.
    """
    out: dict[str, Any] = {}
    for test in ("austerity", "barker"):
        candidates = [entry for entry in runs if entry["test"] == test and passes(entry)]
        candidates.sort(key=lambda e: (e["mean_rows_per_draw"], -e["min_ess_per_second"]))
        out[test] = {
            "choice": candidates[0] if candidates else None,
            "n_passing": len(candidates),
            "n_configurations": sum(entry["test"] == test for entry in runs),
        }
    return out


def main() -> None:
    """Run the grid and write ``results/default_knobs.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100_000, help="draws after tuning, per run")
    parser.add_argument(
        "--refresh-reference",
        action="store_true",
        help=f"run NUTS again instead of reusing {REFERENCE_CACHE.name}",
    )
    args = parser.parse_args()
    wall_start = time.perf_counter()

    model = logistic_model(*logistic_data(N_ROWS, N_FEATURES, seed=DATA_SEED))
    exact = exact_posterior(model, REFERENCE_CACHE, args.refresh_reference)
    with model:
        start = time.perf_counter()
        ref = pms.find_reference_point(random_seed=1)
        ref_seconds = time.perf_counter() - start

    grid: list[tuple[str, int, float | None]] = [
        ("austerity", batch_size, tolerance)
        for batch_size in BATCH_SIZES
        for tolerance in ERROR_TOLERANCES
    ]
    grid += [("barker", batch_size, None) for batch_size in BATCH_SIZES]
    runs = []
    for test, batch_size, tolerance in grid:
        entry = run_configuration(model, ref, exact, test, batch_size, tolerance, args.draws)
        print(
            f"{test:9s} B={batch_size:3d} eps={tolerance!s:5s} "
            f"rows/draw={entry['mean_rows_per_draw']:7.1f} us/draw={entry['us_per_draw']:6.0f} "
            f"minESS/s={entry['min_ess_per_second']:6.1f} "
            f"err={entry['max_abs_mean_error_sd']:.3f} sd (z={entry['max_z']:.2f}) "
            f"sd ratio=[{entry['sd_ratio_min']:.3f}, {entry['sd_ratio_max']:.3f}]",
            flush=True,
        )
        runs.append(entry)

    write_json(
        "default_knobs",
        {
            "settings": {
                "model": "logistic regression, prior N(0, 2^2)",
                "N": N_ROWS,
                "d": N_FEATURES,
                "data_seed": DATA_SEED,
                "control_variate": "taylor2",
                "tune": TUNE,
                "draws": args.draws,
                "chains": 1,
                "random_seed": 1,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "max_abs_mean_error_sd": MAX_MEAN_ERROR_SD,
                "sd_ratio_range": list(SD_RATIO_RANGE),
            },
            "reference_point": {
                "seconds": ref_seconds,
                "data_passes": ref.n_row_evaluations / N_ROWS,
            },
            "exact_posterior": {
                "sampler": "NUTS",
                "chains": REFERENCE_CHAINS,
                "draws": REFERENCE_DRAWS,
                "tune": REFERENCE_TUNE,
                "mcse_over_sd_max": float(np.max(exact["mcse"] / exact["sd"])),
                **exact["info"],
            },
            "runs": runs,
            "recommendation": recommend(runs),
            "total_seconds": time.perf_counter() - wall_start,
        },
    )


if __name__ == "__main__":
    main()

"""Per-step cost of AusterityMH against full-data pm.Metropolis on logistic regression.

For N in {1e4, 1e5, 1e6} and D in {10, 50} (standard-normal features, prior N(0, 2^2)):

* ``first_batch``: steps per second of ``step.step`` when every decision is made on the first
  batch of 500 rows (proposals far outside the posterior, rejected at once). This is the cost
  of the machinery per step; it should not depend on N.
* ``tuned``: a real run through ``pm.sample`` (1000 tuning + 500 draws, error_tolerance 0.05,
  untempered): steps per second and the distribution of rows per step.
* ``metropolis``: full-data ``pm.Metropolis(blocked=True)`` side by side on the same data:
  steps per second of ``step.step`` and MH decisions per second (PyMC's Metropolis makes one
  full-data decision per coordinate per step).

Writes benchmarks/results/austerity_throughput.json.

    python benchmarks/austerity_throughput.py [--rows 10000 100000 1000000] [--features 10 50]
"""

from __future__ import annotations

import argparse

import numpy as np
import pymc as pm
from common import logistic_data, logistic_model, steps_per_second, timed_sample, write_json

import pymc_subsample as pms


def first_batch_rate(model: pm.Model) -> dict:
    with model:
        step = pms.AusterityMH(error_tolerance=0.05, batch_size=500, scaling=1.0, rng=0)
    step.stop_tuning()
    point = model.initial_point()
    n_data, n_batches = [], []

    def one_step() -> None:
        _, stats = step.step(point)
        n_data.append(stats[0]["n_data"])
        n_batches.append(stats[0]["n_batches"])

    rate, calls = steps_per_second(one_step)
    return {
        "steps_per_second": rate,
        "microseconds_per_step": 1e6 / rate,
        "steps_timed": calls,
        "mean_rows_per_step": float(np.mean(n_data)),
        "share_decided_on_first_batch": float(np.mean(np.array(n_batches) == 1)),
    }


def tuned_run(model: pm.Model) -> dict:
    with model:
        step = pms.AusterityMH(error_tolerance=0.05, batch_size=500)
        idata, wall = timed_sample(draws=500, tune=1000, chains=1, step=step)
    n_data = idata.sample_stats["n_data"].values.ravel()
    return {
        "error_tolerance": 0.05,
        "temperature": 1.0,
        "steps_per_second_in_pm_sample": 1500 / wall,
        "mean_rows_per_step": float(n_data.mean()),
        "rows_per_step_quantiles_10_50_90_99": np.quantile(n_data, [0.1, 0.5, 0.9, 0.99]).tolist(),
        "full_data_share": float(idata.sample_stats["full_data"].values.mean()),
        "acceptance": float(idata.sample_stats["accepted"].values.mean()),
    }


def metropolis_rate(model: pm.Model, n_rows: int) -> dict:
    with model:
        step = pm.Metropolis(blocked=True, rng=0)
    step.stop_tuning()
    point = model.initial_point()
    rate, calls = steps_per_second(lambda: step.step(point))
    # PyMC's Metropolis updates one coordinate at a time (elemwise_update), so one of its steps
    # is D full-data MH decisions; AusterityMH makes one (block) decision per step.
    decisions = len(step.enum_dims) if step.elemwise_update else 1
    return {
        "steps_per_second": rate,
        "mh_decisions_per_step": decisions,
        "mh_decisions_per_second": rate * decisions,
        "steps_timed": calls,
        "rows_per_decision": n_rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--features", type=int, nargs="+", default=[10, 50])
    args = parser.parse_args()

    runs = []
    for n_features in args.features:
        for n_rows in args.rows:
            X, y = logistic_data(n_rows, n_features)
            model = logistic_model(X, y)
            run = {
                "rows": n_rows,
                "features": n_features,
                "first_batch": first_batch_rate(model),
                "tuned": tuned_run(model),
                "metropolis": metropolis_rate(model, n_rows),
            }
            first = run["first_batch"]["steps_per_second"]
            run["first_batch_decisions_per_second_over_metropolis"] = (
                first / run["metropolis"]["mh_decisions_per_second"]
            )
            runs.append(run)
            print(
                f"N={n_rows:>9,} D={n_features}: first-batch {first:8.0f} steps/s, "
                f"tuned {run['tuned']['steps_per_second_in_pm_sample']:8.1f} steps/s "
                f"({run['tuned']['mean_rows_per_step']:,.0f} rows/step), "
                f"Metropolis {run['metropolis']['mh_decisions_per_second']:8.1f} decisions/s"
            )
    growth = {}
    for n_features in args.features:
        times = {
            r["rows"]: r["first_batch"]["microseconds_per_step"]
            for r in runs
            if r["features"] == n_features
        }
        growth[str(n_features)] = times[max(times)] / times[min(times)]
    write_json(
        "austerity_throughput",
        {"runs": runs, "first_batch_time_ratio_largest_to_smallest_N_by_D": growth},
    )


if __name__ == "__main__":
    main()

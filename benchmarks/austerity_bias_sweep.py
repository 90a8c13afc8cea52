"""What error_tolerance costs on an untempered posterior: rows per step against bias.

Conjugate linear regression (N = 50,000 rows, 3 coefficients, unit noise, prior N(0, 10^2)),
AusterityMH with batch_size 500, error_tolerance in {0.05, 0.01, 0.001, 0} (0 = exact MH).
Every run uses the same fixed proposal, the optimal random walk for this posterior (covariance
2.38^2 / 3 times the exact posterior covariance), and starts at the posterior mean without
tuning: the bias then depends on the tolerance alone (tuned proposals land at different scales
and the bias grows with the proposal scale). Reports, per tolerance, the share of rows used per
step, the ratio of posterior sds to the exact ones, the error of the means in exact sds, wall
time and min ESS per second. Writes benchmarks/results/austerity_bias_sweep.json.

    python benchmarks/austerity_bias_sweep.py [--rows 50000] [--draws 3000]
"""

from __future__ import annotations

import argparse

import arviz as az
import numpy as np
import pymc as pm
from common import timed_sample, write_json

import pymc_subsample as pms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--chains", type=int, default=4)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.rows, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=args.rows)
    precision = X.T @ X + np.eye(3) / 100.0
    cov = np.linalg.inv(precision)
    exact_mean, exact_sd = cov @ X.T @ y, np.sqrt(np.diag(cov))

    rows = []
    for tolerance in (0.05, 0.01, 0.001, 0.0):
        with pm.Model():
            beta = pm.Normal("beta", 0.0, 10.0, shape=3)
            pm.Normal("y", X @ beta, 1.0, observed=y)
            step = pms.AusterityMH(error_tolerance=tolerance, batch_size=500, proposal_cov=cov)
            idata, wall = timed_sample(
                draws=args.draws,
                tune=0,
                initvals={"beta": exact_mean},
                chains=args.chains,
                cores=1,
                step=step,
            )
        draws = idata.posterior["beta"].values.reshape(-1, 3)
        n_data = idata.sample_stats["n_data"].values
        ess = np.asarray(az.ess(idata, var_names=["beta"])["beta"]).ravel()
        row = {
            "error_tolerance": tolerance,
            "temperature": 1.0,
            "mean_rows_per_step": float(n_data.mean()),
            "mean_decision_rows_per_step": float(
                np.where(
                    idata.sample_stats["full_data"].values,
                    args.rows,
                    np.minimum(idata.sample_stats["n_batches"].values * 500, args.rows),
                ).mean()
            ),
            "share_of_rows_per_step": float(n_data.mean() / args.rows),
            "rows_per_step_quantiles_10_50_90": np.quantile(n_data, [0.1, 0.5, 0.9]).tolist(),
            "full_data_share": float(idata.sample_stats["full_data"].values.mean()),
            "sd_ratio_to_exact": (draws.std(0) / exact_sd).tolist(),
            "mean_error_in_exact_sds": ((draws.mean(0) - exact_mean) / exact_sd).tolist(),
            "acceptance": float(idata.sample_stats["accepted"].values.mean()),
            "wall_seconds": wall,
            "min_ess": float(ess.min()),
            "min_ess_per_second": float(ess.min() / wall),
        }
        rows.append(row)
        print({k: (np.round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    write_json(
        "austerity_bias_sweep",
        {"rows": args.rows, "draws_per_chain": args.draws, "chains": args.chains, "runs": rows},
    )


if __name__ == "__main__":
    main()

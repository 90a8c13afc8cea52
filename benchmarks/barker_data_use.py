"""Where the Barker test's data use on Seita et al.'s section 6.1 comes from, and how to lower it.

Issue 17 (part 5) asks why ``MinibatchBarkerMH`` reads more rows per step than the 172 (182.3
+- 11.4 over 10 runs) the paper reports on its mixture experiment (``barker_mixture.py``: a
million rows, temperature 10,000, 3,000 random-walk samples from (0, 1), batches of 100). The
test is Algorithm 1 as written (start at m = 100, grow by m while ``s^2 >= 1``, correction for
sigma = 1), so the rows a decision needs are set by the spread of the minibatch estimate of
each proposal's log ratio, which grows with the proposal's step. This runs the step over 10
seeds at each of several proposal standard deviations (the paper's "diag(0.15, 0.15)", read as
standard deviations) and reports, per sd, the mean final minibatch size (rows the decision
used, the paper's measure) over the seeds with its sd, the acceptance, and each run's posterior
means and sds against the grid posterior of the binned data (``barker_mixture.BinnedPosterior``).
It does so for each correction sigma (``correction_sd``, eq. 14; the paper's Algorithm 1 takes
1): a batch passes once ``s^2 < sigma^2``. One 3,000-draw run of this two-mode posterior scatters
far more than the test's error (up to 0.8 sd in the mean, as exact chains of that length do), so
the accuracy is measured apart, on 10 further seeds of ``--accuracy-samples`` draws each (from
the same start), pooled: their means against the grid posterior's, in its sds, and their sds as
ratios.

Writes ``benchmarks/results/barker_data_use.json``. About 3 minutes per correction sd:

    python benchmarks/barker_data_use.py [--rows 1000000] [--samples 3000] [--seeds 10]
        [--correction-sds 1.0 1.1 1.2] [--proposal-sds 0.10 0.12 0.14 0.15 0.17 0.20]
        [--accuracy-samples 30000]
"""

from __future__ import annotations

import argparse

import numpy as np
import pymc as pm
from barker_mixture import (
    TEMPERATURE,
    THETA1,
    THETA2,
    BinnedPosterior,
    make_data,
    mixture_model,
)
from common import write_json

import pymc_subsample as pms

PROPOSAL_SDS = (0.10, 0.12, 0.14, 0.15, 0.17, 0.20)
PAPER = {"mean": 182.3, "sd_over_runs": 11.4, "reported": 172}


def grid_moments(posterior: BinnedPosterior) -> tuple[np.ndarray, np.ndarray]:
    """Means and sds of (theta1, theta2) under the grid posterior."""
    grid1, grid2 = np.meshgrid(THETA1, THETA2, indexing="ij")
    log_p = np.stack([posterior.log_density(grid1[i], grid2[i]) for i in range(THETA1.size)])
    weights = np.exp(log_p - log_p.max())
    weights /= weights.sum()
    points = np.stack([grid1.ravel(), grid2.ravel()], axis=1)
    mean = weights.ravel() @ points
    sd = np.sqrt(weights.ravel() @ (points - mean) ** 2)
    return mean, sd


def one_run(
    model: pm.Model, sd: float, correction_sd: float, n_samples: int, seed: int
) -> dict[str, object]:
    with model:
        step = pms.MinibatchBarkerMH(
            correction_sd=correction_sd,
            batch_size=100,
            proposal_cov=np.full(2, sd**2),
            scaling=1.0,
            temperature=TEMPERATURE,
        )
        idata = pm.sample(
            draws=n_samples,
            tune=0,
            chains=1,
            step=step,
            initvals={"theta1": 0.0, "theta2": 1.0},
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    used = np.where(
        stats["full_data"].values,
        step.n_rows,
        np.minimum(stats["n_batches"].values * step.batch_size, step.n_rows),
    ).ravel()
    draws = np.column_stack(
        [idata.posterior["theta1"].values.ravel(), idata.posterior["theta2"].values.ravel()]
    )
    return {
        "mean_final_minibatch_size": float(used.mean()),
        "acceptance": float(stats["accepted"].values.mean()),
        "mean": draws.mean(0).tolist(),
        "sd": draws.std(0).tolist(),
        "draws": draws,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--correction-sds", type=float, nargs="+", default=[1.0, 1.1, 1.2])
    parser.add_argument("--proposal-sds", type=float, nargs="+", default=list(PROPOSAL_SDS))
    parser.add_argument("--accuracy-samples", type=int, default=30_000)
    args = parser.parse_args()

    x = make_data(args.rows)
    model = mixture_model(x)
    grid_mean, grid_sd = grid_moments(BinnedPosterior(x, TEMPERATURE))
    by_correction_sd = {}
    for correction_sd in args.correction_sds:
        by_sd = {}
        for sd in args.proposal_sds:
            runs = [
                one_run(model, sd, correction_sd, args.samples, seed) for seed in range(args.seeds)
            ]
            sizes = np.array([r["mean_final_minibatch_size"] for r in runs])
            errors = np.array([np.abs(np.subtract(r["mean"], grid_mean)) / grid_sd for r in runs])
            ratios = np.array([np.divide(r["sd"], grid_sd) for r in runs])
            for run in runs:
                del run["draws"]
            long_runs = [
                one_run(model, sd, correction_sd, args.accuracy_samples, 1000 + seed)
                for seed in range(args.seeds)
            ]
            pooled = np.concatenate([r["draws"] for r in long_runs])
            by_sd[f"{sd:.2f}"] = {
                "mean_final_minibatch_size": float(sizes.mean()),
                "sd_over_seeds": float(sizes.std(ddof=1)),
                "acceptance": float(np.mean([r["acceptance"] for r in runs])),
                "pooled_abs_mean_error_sd": (np.abs(pooled.mean(0) - grid_mean) / grid_sd).tolist(),
                "pooled_sd_ratio": (pooled.std(0) / grid_sd).tolist(),
                "pooled_draws": int(pooled.shape[0]),
                "pooled_mean_final_minibatch_size": float(
                    np.mean([r["mean_final_minibatch_size"] for r in long_runs])
                ),
                "max_abs_mean_error_sd_per_run": errors.max(1).tolist(),
                "sd_ratio_range_per_run": [[float(r.min()), float(r.max())] for r in ratios],
                "runs": runs,
            }
            entry = by_sd[f"{sd:.2f}"]
            print(
                f"sigma {correction_sd:.2f} sd {sd:.2f}: {entry['mean_final_minibatch_size']:.1f}"
                f" +- {entry['sd_over_seeds']:.1f} rows; pooled mean error "
                f"{max(entry['pooled_abs_mean_error_sd']):.3f} sd, sd ratios "
                f"{entry['pooled_sd_ratio']}",
                flush=True,
            )
        by_correction_sd[f"{correction_sd:.2f}"] = by_sd
    write_json(
        "barker_data_use",
        {
            "rows": args.rows,
            "samples": args.samples,
            "accuracy_samples": args.accuracy_samples,
            "seeds": args.seeds,
            "temperature": TEMPERATURE,
            "grid_mean": grid_mean.tolist(),
            "grid_sd": grid_sd.tolist(),
            "paper_final_minibatch_size": PAPER,
            "by_correction_sd": by_correction_sd,
        },
    )


if __name__ == "__main__":
    main()

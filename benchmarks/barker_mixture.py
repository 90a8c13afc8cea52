"""Seita et al. section 6.1: the Gaussian mixture of Welling and Teh with a million rows.

theta1 ~ N(0, 10), theta2 ~ N(0, 1), x_i ~ 0.5 N(theta1, 2) + 0.5 N(theta1 + theta2, 2), with
(theta1, theta2) = (0, 1) and N = 1,000,000 rows, temperature 10,000 (so the tempered posterior
is the two-mode posterior of the original 100-point experiment). Random-walk proposals with
covariance diag(0.15, 0.15), no tuning, 3000 samples from (0, 1), batches of 100 rows.

Compares MinibatchBarkerMH with AusterityMH (error_tolerance 0.005): the final minibatch sizes
(rows the decision used; the paper reports means of 172 and 12,562) and the rows evaluated, and
the sample quality against the grid posterior with the paper's chi-squared over bins. The same
chi-squared for exact chains (same acceptance rule, proposal and length, on the binned
likelihood) shows what autocorrelation alone gives. Also MinibatchBarkerMH with 0.15 read as
a proposal standard deviation, and MinibatchBarkerMH at temperature 1 (tuned proposals).

Writes benchmarks/results/barker_mixture.json and barker_mixture.png.

    python benchmarks/barker_mixture.py [--rows 1000000] [--samples 3000]
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from common import RESULTS, timed_sample, write_json
from scipy.special import logsumexp

import pymc_subsample as pms

TEMPERATURE = 10_000.0
PROPOSAL_VARIANCES = np.array([0.15, 0.15])
THETA1 = np.linspace(-1.5, 2.5, 201)  # grid for the posterior, step 0.02
THETA2 = np.linspace(-3.0, 3.0, 301)
BIN_EDGES = (np.linspace(-1.5, 2.5, 21), np.linspace(-3.0, 3.0, 31))  # chi-squared bins, 0.2


def make_data(n_rows: int) -> np.ndarray:
    rng = np.random.default_rng(2018)
    means = np.where(rng.integers(0, 2, size=n_rows) == 0, 0.0, 1.0)
    return rng.normal(means, np.sqrt(2.0))


def mixture_model(x: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta1 = pm.Normal("theta1", 0.0, np.sqrt(10.0))
        theta2 = pm.Normal("theta2", 0.0, 1.0)
        components = pt.stack([theta1, theta1 + theta2])
        pm.NormalMixture("x", w=np.array([0.5, 0.5]), mu=components, sigma=np.sqrt(2.0), observed=x)
    return model


class BinnedPosterior:
    """Tempered log posterior from the data binned at width 0.005 (exact up to binning)."""

    def __init__(self, x: np.ndarray, temperature: float) -> None:
        counts, edges = np.histogram(x, bins=np.arange(x.min() - 0.005, x.max() + 0.01, 0.005))
        keep = counts > 0
        self.centres, self.counts = 0.5 * (edges[1:] + edges[:-1])[keep], counts[keep]
        self.temperature = temperature

    def log_density(self, theta1: np.ndarray, theta2: np.ndarray) -> np.ndarray:
        t1, t2 = theta1[..., None], theta2[..., None]
        z = self.centres
        per_bin = logsumexp([-((z - t1) ** 2) / 4, -((z - t1 - t2) ** 2) / 4], axis=0)
        loglik = (per_bin * self.counts).sum(-1) / self.temperature
        return loglik - theta1**2 / 20 - theta2**2 / 2

    def bin_probabilities(self) -> np.ndarray:
        grid1, grid2 = np.meshgrid(THETA1, THETA2, indexing="ij")
        log_p = np.stack([self.log_density(grid1[i], grid2[i]) for i in range(THETA1.size)])
        weights = np.exp(log_p - log_p.max())
        weights /= weights.sum()
        probabilities, _, _ = np.histogram2d(
            grid1.ravel(), grid2.ravel(), bins=BIN_EDGES, weights=weights.ravel()
        )
        return probabilities

    def exact_chain(
        self, n_samples: int, seed: int, barker: bool, proposal_variances: np.ndarray
    ) -> np.ndarray:
        """Exact MH (or exact Barker, logistic noise) on the binned posterior, from (0, 1)."""
        rng = np.random.default_rng(seed)
        theta = np.array([0.0, 1.0])
        current = self.log_density(theta[0], theta[1])
        samples = np.empty((n_samples, 2))
        for t in range(n_samples):
            proposal = theta + np.sqrt(proposal_variances) * rng.standard_normal(2)
            log_target = self.log_density(proposal[0], proposal[1])
            if barker:
                accept = log_target - current + rng.logistic() > 0
            else:
                accept = np.log(rng.uniform()) < log_target - current
            if accept:
                theta, current = proposal, log_target
            samples[t] = theta
        return samples


def chi_squared(samples: np.ndarray, probabilities: np.ndarray) -> dict:
    """Pearson chi-squared over bins with expected count >= 5; the others pooled in one bin."""
    counts, _, _ = np.histogram2d(samples[:, 0], samples[:, 1], bins=BIN_EDGES)
    expected = probabilities * samples.shape[0]
    outside = samples.shape[0] - counts.sum()  # samples outside the binned region
    large = expected >= 5
    observed = np.append(counts[large], counts[~large].sum() + outside)
    expected = np.append(expected[large], expected[~large].sum())
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return {"chi_squared": statistic, "bins": int(observed.size)}


def run_step(model: pm.Model, step_factory, n_samples: int, tune: int = 0) -> dict:
    with model:
        step = step_factory()
        idata, wall = timed_sample(
            draws=n_samples,
            tune=tune,
            chains=1,
            step=step,
            initvals={"theta1": 0.0, "theta2": 1.0},
        )
    stats = idata.sample_stats
    n_rows = step.n_rows
    used = np.where(
        stats["full_data"].values,
        n_rows,
        np.minimum(stats["n_batches"].values * step.batch_size, n_rows),
    ).ravel()
    samples = np.column_stack(
        [idata.posterior["theta1"].values.ravel(), idata.posterior["theta2"].values.ravel()]
    )
    return {
        "temperature": float(stats["temperature"].values.ravel()[0]),
        "batch_size": step.batch_size,
        "mean_final_minibatch_size": float(used.mean()),
        "final_minibatch_size_quantiles_50_90_99_max": np.quantile(
            used, [0.5, 0.9, 0.99, 1.0]
        ).tolist(),
        "mean_rows_evaluated": float(stats["n_data"].values.mean()),
        "full_data_share": float(stats["full_data"].values.mean()),
        "acceptance": float(stats["accepted"].values.mean()),
        "wall_seconds": wall,
        "_used": used,
        "_samples": samples,
    }


def plot(results: dict, path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    bins = np.logspace(2, 6, 41)
    for ax, name in zip(axes, ["MinibatchBarkerMH", "AusterityMH"], strict=True):
        used = results[name]["_used"]
        ax.hist(used, bins=bins, color="C0" if name.startswith("Mini") else "C1")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("final minibatch size (rows the decision used)")
        ax.set_title(f"{name}: mean {used.mean():,.0f} (T = {TEMPERATURE:,.0f})")
    axes[0].set_ylabel("draws")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--reference-chains", type=int, default=20)
    args = parser.parse_args()

    x = make_data(args.rows)
    model = mixture_model(x)
    posterior = BinnedPosterior(x, TEMPERATURE)
    probabilities = posterior.bin_probabilities()

    common = {"proposal_cov": PROPOSAL_VARIANCES, "scaling": 1.0, "temperature": TEMPERATURE}
    small = {**common, "proposal_cov": PROPOSAL_VARIANCES**2}  # 0.15 read as a standard deviation
    runs = {
        "MinibatchBarkerMH": (lambda: pms.MinibatchBarkerMH(batch_size=100, **common), True),
        "AusterityMH": (
            lambda: pms.AusterityMH(error_tolerance=0.005, batch_size=100, **common),
            False,
        ),
        "MinibatchBarkerMH_proposal_sd_0.15": (
            lambda: pms.MinibatchBarkerMH(batch_size=100, **small),
            True,
        ),
    }
    results = {}
    for name, (factory, barker) in runs.items():
        result = run_step(model, factory, args.samples)
        result.update(chi_squared(result["_samples"], probabilities))
        variances = PROPOSAL_VARIANCES**2 if name.endswith("0.15") else PROPOSAL_VARIANCES
        reference = [
            chi_squared(
                posterior.exact_chain(args.samples, seed, barker, variances), probabilities
            )["chi_squared"]
            for seed in range(args.reference_chains)
        ]
        result["exact_chain_chi_squared_same_test_and_proposal"] = {
            "test": "Barker" if barker else "MH",
            "chains": args.reference_chains,
            "quantiles_10_50_90": np.quantile(reference, [0.1, 0.5, 0.9]).tolist(),
        }
        results[name] = result
    untempered = run_step(
        model,
        lambda: pms.MinibatchBarkerMH(batch_size=100),
        args.samples // 6,
        tune=args.samples // 6,
    )
    plot(results, RESULTS / "barker_mixture.png")
    clean = {
        name: {k: v for k, v in r.items() if not k.startswith("_")} for name, r in results.items()
    }
    clean["MinibatchBarkerMH_temperature_1"] = {
        k: v for k, v in untempered.items() if not k.startswith("_")
    }
    clean["paper_mean_final_minibatch_size"] = {"MinibatchBarkerMH": 172, "AusterityMH": 12562}
    for name, result in clean.items():
        print(name, result)
    write_json("barker_mixture", {"rows": args.rows, "samples": args.samples, "results": clean})


if __name__ == "__main__":
    main()

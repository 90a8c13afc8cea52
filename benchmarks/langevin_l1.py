"""Korattikara et al. (2016), section 4.2.4: SGLD's excursions on an L1 toy, and their correction.

One-dimensional L1-regularised regression: ``y_i = 0.5 x_i + xi``, ``xi ~ N(0, 1/3)``,
N = 10,000 rows, likelihood ``exp(-(lambda/2) (y_i - theta x_i)^2)`` with lambda = 3 and a Laplace
prior ``exp(-lambda0 |theta|)`` with lambda0 = 4950. The paper does not give the distribution of
``x``; we take ``x ~ U(-1, 1)``, for which ``lambda sum x_i^2`` is about ``2 lambda0``: the prior
then cancels the likelihood's pull towards 0.5 and the mode sits next to the kink at 0, with the
steep side (log-density slope about 10^4) to the left, as in the paper's Figure 9.

Chains of 100,000 samples with the Langevin step alpha = 5e-6 on minibatch gradients of 500 rows,
all started at the mode:

- uncorrected SGLD (every proposal accepted), on the package's compiled per-row gradients;
- ``pms.AusterityMH(proposal="langevin")`` at error tolerance 0 (exact MH test), 0.1 and 0.2,
  with ``scaling = sqrt(alpha)`` and no tuning.

Compared with the exact density on a grid: total-variation distance of the histogram (bins of
0.002), the probability mass the chain puts beyond the exact 99.9% quantile, the largest
excursion, and the data each test used.

Writes benchmarks/results/langevin_l1.json and langevin_l1.png.

    python benchmarks/langevin_l1.py [--samples 100000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
from common import RESULTS, sgld_chain, write_json

import pymc_subsample as pms

N_ROWS = 10_000
LAMBDA, LAMBDA0 = 3.0, 4950.0
ALPHA = 5e-6
BATCH_SIZE = 500
TOLERANCES = (0.0, 0.1, 0.2)
GRID = np.linspace(-0.05, 0.1, 3001)
BINS = np.arange(-0.05, 0.1 + 1e-9, 0.002)


def make_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2016)
    x = rng.uniform(-1.0, 1.0, size=N_ROWS)
    return x, 0.5 * x + rng.normal(0.0, np.sqrt(1 / 3), size=N_ROWS)


def l1_model(x: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        theta = pm.Laplace("theta", mu=0.0, b=1 / LAMBDA0)
        pm.Normal("y", mu=theta * x, sigma=1 / np.sqrt(LAMBDA), observed=y)
    return model


def exact_log_density(x: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    sxx, sxy = float(x @ x), float(x @ y)
    return -0.5 * LAMBDA * (theta**2 * sxx - 2 * theta * sxy) - LAMBDA0 * np.abs(theta)


def exact_gradient(x: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    return -LAMBDA * (theta * float(x @ x) - float(x @ y)) - LAMBDA0 * np.sign(theta)


def corrected(model: pm.Model, start: float, samples: int, tolerance: float, seed: int):
    with model:
        step = pms.AusterityMH(
            proposal="langevin",
            error_tolerance=tolerance,
            batch_size=BATCH_SIZE,
            scaling=np.sqrt(ALPHA),
        )
        idata = pm.sample(
            draws=samples,
            tune=0,
            chains=1,
            step=step,
            initvals={"theta": start},
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    return idata.posterior["theta"].values.ravel(), {
        "acceptance": float(stats["accepted"].mean()),
        "mean_rows_per_test": float(stats["n_data"].mean()),
        "share_of_rows_per_test": float(stats["n_data"].mean() / N_ROWS),
        "full_data_share": float(stats["full_data"].mean()),
        "gradient_rows_per_step": int(stats["n_grad_rows"].values.ravel()[0]),
    }


def compare(draws: np.ndarray, grid_cdf: np.ndarray, quantile_999: float) -> dict[str, float]:
    counts, _ = np.histogram(np.clip(draws, BINS[0], BINS[-1]), bins=BINS)
    exact_mass = np.diff(np.interp(BINS, GRID, grid_cdf))
    return {
        "total_variation": float(0.5 * np.abs(counts / draws.size - exact_mass).sum()),
        "mass_beyond_exact_q999": float(np.mean(draws > quantile_999)),
        "max": float(draws.max()),
        "min": float(draws.min()),
        "mean": float(draws.mean()),
        "sd": float(draws.std()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    args = parser.parse_args()
    x, y = make_data()
    model = l1_model(x, y)

    log_density = exact_log_density(x, y, GRID)
    density = np.exp(log_density - log_density.max())
    density /= np.trapezoid(density, GRID)
    grid_cdf = np.concatenate(
        [[0.0], np.cumsum(0.5 * (density[1:] + density[:-1]) * np.diff(GRID))]
    )
    mode = float(GRID[np.argmax(density)])
    exact_mean = float(np.trapezoid(GRID * density, GRID))
    exact_sd = float(np.sqrt(np.trapezoid((GRID - exact_mean) ** 2 * density, GRID)))
    quantile_999 = float(np.interp(0.999, grid_cdf, GRID))

    results: dict[str, dict[str, Any]] = {}
    chains: dict[str, np.ndarray] = {}
    start = time.perf_counter()
    draws, _ = sgld_chain(
        model,
        np.array([mode]),
        step_size=ALPHA,
        batch_size=BATCH_SIZE,
        burn_in=0,
        steps=args.samples,
        seed=1,
    )
    chains["SGLD, uncorrected"] = draws[:, 0]
    results["SGLD, uncorrected"] = {
        "seconds": time.perf_counter() - start,
        "rows_per_step": BATCH_SIZE,
    }
    for tolerance in TOLERANCES:
        name = f"corrected, error_tolerance={tolerance:g}"
        start = time.perf_counter()
        chains[name], cost = corrected(model, mode, args.samples, tolerance, seed=1)
        results[name] = {"seconds": time.perf_counter() - start, **cost}
    for name, draws in chains.items():
        results[name].update(compare(draws, grid_cdf, quantile_999))
        print(name, {k: round(v, 4) for k, v in results[name].items()})

    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    axes[0, 0].plot(GRID, density)
    axes[0, 0].set_title("(a) posterior density")
    axes[0, 1].plot(GRID, exact_gradient(x, y, GRID))
    axes[0, 1].set_title("(b) gradient of the log posterior")
    for axis, (name, draws) in zip(axes.ravel()[2:], chains.items(), strict=True):
        axis.hist(np.clip(draws, BINS[0], BINS[-1]), bins=BINS, density=True, alpha=0.6)
        axis.plot(GRID, density, color="black", linewidth=1)
        tv = results[name]["total_variation"]
        used = results[name].get("share_of_rows_per_test")
        label = f"TV {tv:.3f}" + (f", {100 * used:.0f}% rows/test" if used is not None else "")
        axis.set_title(f"{name}\n{label}", fontsize=9)
    for axis in axes.ravel():
        axis.set_xlabel("theta")
    fig.tight_layout()
    fig.savefig(RESULTS / "langevin_l1.png", dpi=110)
    write_json(
        "langevin_l1",
        {
            "config": {
                "rows": N_ROWS,
                "lambda": LAMBDA,
                "lambda0": LAMBDA0,
                "alpha": ALPHA,
                "batch_size": BATCH_SIZE,
                "samples": args.samples,
                "x_distribution": "uniform(-1, 1)",
            },
            "exact": {"mode": mode, "mean": exact_mean, "sd": exact_sd, "q999": quantile_999},
            "runs": results,
        },
    )


if __name__ == "__main__":
    main()

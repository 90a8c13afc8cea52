"""The sequential t-test's rows per draw from N = 1e4 to 1e7: a rare long tail, a flat mean.

Issue "A composable sampling core and a fused per-draw kernel" asks that a draw's cost stay
flat within 1.2x from N = 1e4 to 1e7. ``draw_cost.py`` measures 10,000 draws per N; for
``AusterityMH`` their mean is not a stable estimate. A draw's t-test (Korattikara et al.
2014, Algorithm 1) reads more than its first batch only near a tie, ``|Delta - log u|``
within a few standard errors of the estimate; with the second-order control variate that
standard error shrinks like ``N^(-1/2)`` (the residuals are cubic in the step, whose size is
the posterior's), so such draws become rarer as ``N^(-1/2)`` while the rows a tie can need
grow like N: the expected rows stay flat, and their mean over 10,000 draws is carried by
one or two draws (at 1e7 one draw read 1.1 million rows).

This benchmark measures that tail directly: logistic regression with d = 10
(``common.logistic_data``), ``AusterityMH(proposal="random_walk")`` with its defaults
(taylor2, batch 100, fused draw), three chains of 50,000 draws after 200 tuning draws at each
N, each from its own seed. For each N it reports the rows per draw (mean with its standard
error over all draws, the three chains' means, the share of draws reading more than one
batch and more than 1,000 rows, the largest draw), and microseconds per draw inside
``pm.sample`` (mean with standard error, median; a clock read after every draw, as in
``draw_cost.py``). Writes ``results/austerity_tail.json``.

    python benchmarks/austerity_tail.py [--rows 10000 100000 1000000 10000000]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pymc as pm
from common import logistic_data, logistic_model, runs_per_rows, write_json

import pymc_subsample as pms

TUNE, DRAWS, SEEDS = 200, 50_000, (1, 2, 3)


def run_rows(n_rows: int) -> dict[str, Any]:
    """Three chains at one N, in this process."""
    model = logistic_model(*logistic_data(n_rows, 10))
    with model:
        step = pms.AusterityMH(proposal="random_walk")
    assert step.draw_path == "fused", step.draw_path
    rows: list[np.ndarray] = []
    intervals: list[np.ndarray] = []
    for seed in SEEDS:
        stamps: list[float] = []

        def clock(stamps: list[float] = stamps, **_: Any) -> None:
            stamps.append(time.perf_counter())

        with model:
            idata = pm.sample(
                step=step,
                tune=TUNE,
                draws=DRAWS,
                chains=1,
                random_seed=seed,
                callback=clock,
                progressbar=False,
                compute_convergence_checks=False,
            )
        rows.append(idata.sample_stats["n_data"].values.ravel())
        intervals.append(np.diff(stamps[TUNE - 1 :]) * 1e6)
    all_rows, all_us = np.concatenate(rows), np.concatenate(intervals)
    return {
        "rows": n_rows,
        "rows_per_draw": float(all_rows.mean()),
        "rows_per_draw_se": float(all_rows.std() / np.sqrt(all_rows.size)),
        "rows_per_draw_by_chain": [float(chain.mean()) for chain in rows],
        "share_over_one_batch": float(np.mean(all_rows > step.batch_size)),
        "share_over_1000_rows": float(np.mean(all_rows > 1000)),
        "max_rows_in_a_draw": int(all_rows.max()),
        "us_per_draw": float(all_us.mean()),
        "us_per_draw_se": float(all_us.std() / np.sqrt(all_us.size)),
        "median_us_per_draw": float(np.median(all_us)),
    }


def main() -> None:
    runs = runs_per_rows(__file__, run_rows, __doc__.splitlines()[0])
    if runs is None:  # a child process: its one N is printed
        return
    spread = {
        key: max(run[key] for run in runs) / min(run[key] for run in runs)
        for key in ("rows_per_draw", "us_per_draw", "median_us_per_draw")
    }
    write_json(
        "austerity_tail",
        {
            "features": 10,
            "batch_size": 100,
            "tune": TUNE,
            "draws_per_chain": DRAWS,
            "seeds": list(SEEDS),
            "runs": runs,
            "max_over_min_across_rows": spread,
        },
    )


if __name__ == "__main__":
    main()

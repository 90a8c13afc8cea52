"""Rows per draw of the trajectory steps from N = 1e4 to 1e7: O(1) in N.

Issue 16's last target: the rows a draw reads (the test's rows, stat ``n_data``, plus the
trajectory's gradient rows, ``n_grad_rows``) stay within 1.5x from N = 1e4 to 1e7. For each N,
``AusterityMH(proposal="hmc")`` and ``MinibatchBarkerMH(proposal="hmc")`` run on the logistic
regression of ``common.logistic_data`` (d = 10; the automatic reference, second-order control
variate and Laplace mass matrix), each in its own process (``zero_config.py``'s runner: one
chain, 2,000 tuning + 20,000 kept draws), and report rows per draw, leapfrog steps, set-up
seconds, microseconds per draw, min ESS and the max |mean error| in posterior sds against the
Laplace approximation at the full-data mode. Writes ``results/trajectory_rows_scan.json``
with, per step, the ratio of the largest to the smallest mean rows per draw over N. About 10
minutes (N = 1e7 needs about 2 GB).
"""

from __future__ import annotations

import argparse
from typing import Any

from common import logistic_data, write_json
from zero_config import _run_child, compare, laplace_reference

SIZES = (10_000, 100_000, 1_000_000, 10_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(SIZES))
    args = parser.parse_args()
    runs: dict[str, dict[str, Any]] = {"austerity": {}, "barker": {}}
    for n_rows in args.rows:
        X, y = logistic_data(n_rows, 10)
        laplace = laplace_reference(X, y)
        del X, y
        for sampler, by_rows in runs.items():
            run = _run_child(sampler, n_rows, "hmc")
            run["total_rows_per_draw"] = run["rows_per_draw"] + run["n_grad_rows"]
            run["against_laplace"] = compare(run, laplace["mean"], laplace["sd"])
            by_rows[str(n_rows)] = {k: v for k, v in run.items() if k not in ("mean", "sd")}
    spread = {
        sampler: max(r["total_rows_per_draw"] for r in by_rows.values())
        / min(r["total_rows_per_draw"] for r in by_rows.values())
        for sampler, by_rows in runs.items()
    }
    write_json(
        "trajectory_rows_scan",
        {"features": 10, "proposal": "hmc", "runs": runs, "max_over_min_rows_per_draw": spread},
    )


if __name__ == "__main__":
    main()

"""NumPyro's HMCECS against our steps with no arguments, on the same logistic regression.

Issue 16's first target: logistic regression with N = 1e6 rows and d = 10 coefficients
(``common.logistic_data``), wall time including set-up, one chain, all samplers in one run:

- NumPyro's HMCECS (``benchmarks/hmcecs/run_hmcecs.py``): NUTS on the perturbed target with
  a second-order Taylor proxy at a full-data Newton reference, subsample 1,000, 100 blocks,
  run in the optional environment of ``benchmarks/hmcecs/requirements.txt`` (``--python``,
  default ``.venv-hmcecs/bin/python``);
- ``AusterityMH()`` and ``MinibatchBarkerMH()`` with no arguments, and with
  ``proposal="hmc"`` (our trajectories) as their only argument, each in its own process
  (``zero_config.py``'s runner);
- the NUTS run saved in ``results/zero_config.json`` (nutpie, same rows and machine), for the
  ratio to NUTS.

Every sampler runs 2,000 tuning + 20,000 kept draws (NUTS: 1,000 + 1,000). ESS (ArviZ, min
over the coefficients), min-ESS per wall second and its ratio to HMCECS's, max |mean error| in
posterior sds and the sd ratios against the Laplace approximation at the full-data mode (exact
to about 0.001 sd here), and rows per draw (HMCECS: subsample size times the leapfrog steps,
plus the subsample's MH update) go to ``results/hmcecs_logistic.json``. About 6 minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
from common import RESULTS, logistic_data, write_json
from zero_config import STEP_DRAWS, _run_child, compare, laplace_reference

ROOT = Path(__file__).resolve().parent.parent
SEED = 1


def run_hmcecs(python: Path, X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Run NumPyro's HMCECS in its own environment; return the same measurements as ours."""
    with tempfile.TemporaryDirectory() as folder:
        data, out = Path(folder) / "data.npz", Path(folder) / "out.npz"
        np.savez(data, X=X, y=y)
        command = [
            str(python),
            str(Path(__file__).parent / "hmcecs" / "run_hmcecs.py"),
            str(data),
            str(out),
            str(STEP_DRAWS["tune"]),
            str(STEP_DRAWS["draws"]),
            str(SEED),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"HMCECS failed:\n{done.stderr[-3000:]}")
        result = dict(np.load(out))
    beta = result["beta"]
    steps = result["num_steps"].astype(float)
    subsample = int(result["subsample_size"])
    wall = float(result["wall_seconds"])
    return {
        "sampler": "numpyro-hmcecs",
        "versions": {"numpyro": str(result["versions"][0]), "jax": str(result["versions"][1])},
        "setup_seconds": float(result["setup_seconds"]),
        "wall_seconds": wall,
        "us_per_draw": (wall - float(result["setup_seconds"]))
        / (STEP_DRAWS["tune"] + STEP_DRAWS["draws"])
        * 1e6,
        "min_ess": float(np.min(az.ess(az.convert_to_dataset({"beta": beta[None]}))["beta"])),
        "mean": beta.mean(0).tolist(),
        "sd": beta.std(0, ddof=1).tolist(),
        "leapfrog_steps_per_draw": float(steps.mean()),
        # Each leapfrog step reads the subsample's gradient; the block update reads it once.
        "rows_per_draw": float(subsample * (steps.mean() + 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--python", type=Path, default=ROOT / ".venv-hmcecs" / "bin" / "python")
    args = parser.parse_args()
    if not args.python.exists():
        raise SystemExit(
            f"{args.python} not found: make NumPyro's environment first, "
            "python3.12 -m venv .venv-hmcecs && .venv-hmcecs/bin/pip install -r "
            "benchmarks/hmcecs/requirements.txt"
        )
    X, y = logistic_data(args.rows, 10)
    runs: dict[str, Any] = {"hmcecs": run_hmcecs(args.python, X, y)}
    print("hmcecs", {k: v for k, v in runs["hmcecs"].items() if k not in ("mean", "sd")})
    for sampler in ("austerity", "barker"):
        runs[sampler] = _run_child(sampler, args.rows)
        runs[f"{sampler}_hmc"] = _run_child(sampler, args.rows, "hmc")
    saved = json.loads((RESULTS / "zero_config.json").read_text())
    if saved["rows"] == args.rows:
        runs["nuts"] = {**saved["runs"]["nuts"], "reused_from": "results/zero_config.json"}
    laplace = laplace_reference(X, y)
    hmcecs_rate = runs["hmcecs"]["min_ess"] / runs["hmcecs"]["wall_seconds"]
    nuts_rate = runs["nuts"]["min_ess"] / runs["nuts"]["wall_seconds"] if "nuts" in runs else None
    for run in runs.values():
        run["min_ess_per_second"] = run["min_ess"] / run["wall_seconds"]
        run["ratio_to_hmcecs"] = run["min_ess_per_second"] / hmcecs_rate
        if nuts_rate is not None:
            run["ratio_to_nuts"] = run["min_ess_per_second"] / nuts_rate
        run["against_laplace"] = compare(run, laplace["mean"], laplace["sd"])
    write_json(
        "hmcecs_logistic",
        {"rows": args.rows, "features": 10, "draws": STEP_DRAWS, "runs": runs},
    )


if __name__ == "__main__":
    main()

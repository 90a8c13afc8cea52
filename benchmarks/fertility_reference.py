"""Cached full-data NUTS reference for the AER Fertility gallery notebook.

NUTS on all 254,654 rows of AER Fertility (the logistic regression of
``control_variates.fertility_model``) takes about seven minutes on 2 cores, too long to run in
every docs build. This script runs it once (2 chains of 2,000 draws after 1,000 tuning steps)
and writes the posterior means, sds, the Monte Carlo standard errors of the means and the ESS
to ``docs/gallery/data/fertility_nuts.json``, which the notebook compares against.

    python benchmarks/fertility_reference.py
"""

from __future__ import annotations

import json
from pathlib import Path

import arviz as az
import numpy as np
from common import machine, timed_sample
from control_variates import fertility_model

OUTPUT = Path(__file__).parents[1] / "docs" / "gallery" / "data" / "fertility_nuts.json"


def main() -> None:
    model = fertility_model()
    with model:
        idata, seconds = timed_sample(draws=2000, tune=1000, chains=2, cores=2)
    draws = idata.posterior["beta"].values.reshape(-1, 7)
    ess = np.asarray(az.ess(idata, var_names=["beta"])["beta"]).ravel()
    mcse = np.asarray(az.mcse(idata, var_names=["beta"])["beta"]).ravel()
    payload = {
        "machine": machine(),
        "sampler": "NUTS, 2 chains x 2000 draws after 1000 tuning steps, random_seed=1",
        "seconds": seconds,
        "mean": draws.mean(0).tolist(),
        "sd": draws.std(0).tolist(),
        "mcse_mean": mcse.tolist(),
        "ess": ess.tolist(),
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {OUTPUT} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()

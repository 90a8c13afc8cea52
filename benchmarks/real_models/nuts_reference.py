"""One-off: long NUTS references for the posteriors that posteriordb has no reference draws for.

Run once (about 5 minutes on 2 cores); it writes the ``reference`` entry of each data file:

    python benchmarks/real_models/nuts_reference.py

PyMC's NUTS (not this package), 4 chains of 5,000 draws after 2,000 tuning steps, target
acceptance 0.95. Both radon posteriors (centred and non-centred forms of one distribution) get
the summary of one run of the non-centred form, which NUTS samples without divergences.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

import pymc as pm

sys.path.insert(0, str(Path(__file__).parent))
from models import DATA_DIR, MODELS, load
from summary import summarise

DRAWS, TUNE, CHAINS = 5000, 2000, 4
# posterior whose reference is written -> posterior whose model NUTS runs on
RADON = "radon_mn-radon_variable_intercept_noncentered"
RUNS = {
    "wells_data-wells_daae_c_model": "wells_data-wells_daae_c_model",
    RADON: RADON,
    "radon_mn-radon_variable_intercept_centered": RADON,
}


def nuts_reference(posterior: str) -> dict[str, Any]:
    """Summary of a long NUTS run on ``posterior``'s model."""
    model, _ = MODELS[posterior].build(load(posterior)["data"])
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            DRAWS, tune=TUNE, chains=CHAINS, cores=2, target_accept=0.95, random_seed=2024
        )
    divergences = int(idata.sample_stats["diverging"].values.sum())
    params = summarise(idata.posterior)
    return {
        "source": f"PyMC {pm.__version__} NUTS run once by nuts_reference.py on {posterior}",
        "method": {"draws": DRAWS, "tune": TUNE, "chains": CHAINS, "target_accept": 0.95},
        "divergences": divergences,
        "wall_s": round(time.perf_counter() - start, 1),
        "n_draws": DRAWS * CHAINS,
        "n_chains": CHAINS,
        "params": params,
    }


def update(posterior: str, reference: dict[str, Any]) -> None:
    """Write ``reference`` into ``posterior``'s data file, keeping its layout."""
    payload = load(posterior)
    payload["reference"] = reference
    data = json.dumps(payload["data"], separators=(",", ":"))
    text = json.dumps({**payload, "data": "@DATA@"}, indent=1).replace('"@DATA@"', data)
    path = DATA_DIR / f"{posterior}.json"
    if path.exists():
        path.write_text(text + "\n")
    else:
        (DATA_DIR / f"{posterior}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))


def main(names: list[str]) -> None:
    done: dict[str, dict[str, Any]] = {}
    for target, source in RUNS.items():
        if names and target not in names:
            continue
        if source not in done:
            done[source] = nuts_reference(source)
        update(target, done[source])
        print(f"{target}: {done[source]['divergences']} divergences")


if __name__ == "__main__":
    main(sys.argv[1:])

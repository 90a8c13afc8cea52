"""Radon-style hierarchical model and its cached full-data NUTS reference (issue 13).

A synthetic stand-in for the radon data (Gelman and Hill 2007, ch. 12): 919 rows in 85 groups of
unbalanced sizes, one binary covariate, varying intercepts. The model is written centred
(``a ~ Normal(mu_a, sigma_a)``) and non-centred (``a = mu_a + sigma_a * z``). This script runs
NUTS on both, on a small centred variant (10 groups, 300 rows) and on a tall non-centred one
(10 groups, 20,000 rows), 4 chains of 5,000 draws after
2,000 tuning steps each, and writes the posterior means and sds of every scalar (``a`` on the
constrained scale for both forms) to ``tests/data/hierarchical_nuts.json``, which
``tests/test_hierarchical.py`` compares against. Name keys to rerun only those:

    python benchmarks/hierarchical_reference.py [centred] [non_centred] [small_centred]
        [tall_non_centred]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pymc as pm

OUTPUT = Path(__file__).parents[1] / "tests" / "data" / "hierarchical_nuts.json"
N_GROUPS, N_ROWS = 85, 919


def radon_like_data(
    seed: int = 13, n_groups: int = N_GROUPS, n_rows: int = N_ROWS
) -> dict[str, np.ndarray]:
    """Group index, covariate and response of the synthetic radon-style data set."""
    rng = np.random.default_rng(seed)
    # Unbalanced group sizes (1 to 49 rows at the defaults, like the radon counties).
    weights = rng.lognormal(0.0, 1.2, size=n_groups)
    sizes = 1 + rng.multinomial(n_rows - n_groups, weights / weights.sum())
    group = np.repeat(np.arange(n_groups), sizes)
    floor = rng.binomial(1, 0.2, size=n_rows).astype("float64")
    intercepts = rng.normal(1.5, 0.35, size=n_groups)
    y = intercepts[group] - 0.7 * floor + rng.normal(0.0, 0.75, size=n_rows)
    return {"group": group, "floor": floor, "y": y}


def radon_model(
    centred: bool, seed: int = 13, n_groups: int = N_GROUPS, n_rows: int = N_ROWS
) -> pm.Model:
    """Varying-intercept model; ``a`` is a free variable (centred) or a Deterministic."""
    data = radon_like_data(seed, n_groups, n_rows)
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 5.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        if centred:
            a = pm.Normal("a", mu_a, sigma_a, shape=n_groups)
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=n_groups)
            a = pm.Deterministic("a", mu_a + sigma_a * z)
        b = pm.Normal("b", 0.0, 2.0)
        sigma_y = pm.HalfNormal("sigma_y", 2.0)
        pm.Normal("y", a[data["group"]] + b * data["floor"], sigma_y, observed=data["y"])
    return model


#: Scalars compared (``a`` expands to its entries).
NAMES = ("mu_a", "sigma_a", "a", "b", "sigma_y")
#: The small centred variant the default test suite samples (10 groups, 300 rows): the same
#: recipe, with a random walk in 12 dimensions that mixes in a few thousand draws.
SMALL = {"n_groups": 10, "n_rows": 300}
#: A tall non-centred variant (10 groups, 20,000 rows, ~2,000 per group): its posterior in the
#: sampled variables is a narrow curved ridge (scale times standardised effects fixed by the
#: data), where the default control variate is expanded in the likelihood's parameters.
TALL = {"n_groups": 10, "n_rows": 20_000}


def summarise(posterior) -> dict[str, list[float]]:
    """Means and sds of every scalar in NAMES, pooled over chains, in one flat list each."""
    columns = [
        np.asarray(posterior[name].values).reshape(-1, int(np.prod(posterior[name].shape[2:])))
        for name in NAMES
    ]
    draws = np.concatenate(columns, axis=1)
    return {"mean": draws.mean(0).tolist(), "sd": draws.std(0).tolist()}


def _nuts(model: pm.Model) -> dict[str, object]:
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=5000,
            tune=2000,
            chains=4,
            cores=2,
            random_seed=1,
            progressbar=False,
            target_accept=0.95,
        )
    return {**summarise(idata.posterior), "seconds": time.perf_counter() - start}


def main(keys: list[str]) -> None:
    """Rerun NUTS for ``keys`` (all when empty) and rewrite the JSON, keeping the others."""
    payload: dict[str, object] = {
        "sampler": "NUTS, 4 chains x 5000 draws after 2000 tuning steps, random_seed=1, "
        "target_accept=0.95",
        "names": list(NAMES),
    }
    if OUTPUT.exists():
        payload = {**json.loads(OUTPUT.read_text()), **payload}
    models = {
        "centred": lambda: radon_model(True),
        "non_centred": lambda: radon_model(False),
        "small_centred": lambda: radon_model(True, **SMALL),
        "tall_non_centred": lambda: radon_model(False, **TALL),
    }
    for key in keys or list(models):
        payload[key] = _nuts(models[key]())
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main(sys.argv[1:])

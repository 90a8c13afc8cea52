"""Quickstart: logistic regression on 50,000 rows with ``AusterityMH()``, no arguments.

At temperature 1 (the plain posterior) the test needs O(1) rows per step only with control
variates, which are the default: the step finds a point near the mode on minibatches and
expands each row's log-likelihood to second order around it (``control_variate="taylor2"``).

Run with ``python examples/quickstart.py``. It prints the posterior summary, the mean number of
rows looked at per draw, and the posterior means next to full-data NUTS on the same data.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm

import pymc_subsample as pms


def make_data(n_rows: int = 50_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_rows), rng.normal(size=(n_rows, 3))])
    true_beta = np.array([-0.5, 1.0, -0.7, 0.3])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ true_beta)))
    return X, y, true_beta


def main() -> None:
    X, y, true_beta = make_data()
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 2.0, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)

        idata = pm.sample(draws=5000, tune=1000, chains=2, step=pms.AusterityMH(), random_seed=1)
        reference = pm.sample(draws=500, tune=500, chains=2, random_seed=1, progressbar=False)

    print(az.summary(idata, var_names=["beta"]))
    n_data = idata.sample_stats["n_data"].values
    print(
        f"rows per draw: mean {n_data.mean():,.0f} of N = {len(y):,} ({n_data.mean() / len(y):.2%})"
    )
    print(f"full-data decisions: {idata.sample_stats['full_data'].values.mean():.1%} of draws")
    austerity_mean = idata.posterior["beta"].mean(("chain", "draw")).values
    nuts_mean = reference.posterior["beta"].mean(("chain", "draw")).values
    nuts_sd = reference.posterior["beta"].std(("chain", "draw")).values
    print("true beta:       ", np.round(true_beta, 3))
    print("AusterityMH mean:", np.round(austerity_mean, 3))
    print("NUTS mean:       ", np.round(nuts_mean, 3))
    print("difference in NUTS sds:", np.round((austerity_mean - nuts_mean) / nuts_sd, 2))
    print(
        "sd ratio AusterityMH / NUTS:",
        np.round(idata.posterior["beta"].std(("chain", "draw")).values / nuts_sd, 2),
    )


if __name__ == "__main__":
    main()

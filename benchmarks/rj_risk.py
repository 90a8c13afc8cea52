"""Risk in predictive mean against wall time for reversible-jump variable selection.

Korattikara et al. (2014), section 6.3, supplementary E, figure 4. The paper selects features
of a logistic regression on MiniBooNE (130,065 rows, 50 features and a constant, 80% for
training) by reversible jump: update, birth and death moves on (gamma, beta), each accepted by
its sequential t-test (batches of m = 500), with sigma_update = 0.01 and sigma_birth = 0.1. Its
ground truth is the predictive mean on the 20% test rows from 400,000 draws of exact reversible
jump (epsilon = 0); it then runs 10 chains per epsilon for about 3,500 s, each started with one
feature included, and plots the risk (mean over test rows of the squared error of a chain's
running predictive mean) against time. Figure 4: the lowest risk at the budget is at
epsilon > 0.

This redoes it with ``pms.ReversibleJumpMH`` and the Bayesian-lasso logistic model of
``examples/variable_selection.py`` (``lasso_logistic_model``: Laplace slab of scale 1,
independent Bernoulli(0.1) indicators; the paper integrates out a shrinkage scale and puts a
truncated Poisson prior on the model size), on synthetic data (MiniBooNE cannot be downloaded
here), scaled to fit this machine:

1. Data: ``make_logistic_data(--rows, --features, --relevant)``: a column of ones and
   standard normal covariates, the first ``--relevant`` coefficients (the intercept among them)
   nonzero; a random 80% trains the model, the other 20% are the test rows.
2. Ground truth: exact reversible jump (``error_tolerance=0``: every decision on all training
   rows) started at the data-generating (gamma, beta), run for ``--reference-seconds`` of wall
   time; its first ``--reference-burn`` draws are dropped. I is the mean over its draws of
   ``sigmoid(x (gamma * beta))`` on each test row. Its Monte Carlo error is estimated by batch
   means (20 batches) per test row; the mean over rows of its square is the floor below which
   a risk cannot be resolved.
3. For each epsilon in ``--tolerances`` (0 is exact), ``--chains`` chains of
   ``ReversibleJumpMH(birth_sd=--birth-sd, update_sd=--update-sd, batch_size=500)``, each run
   for ``--seconds`` of wall time (PyMC's ``callback`` stops it; ``tune=0``: the moves have no
   scale to tune). ``--start reference`` (the default, as ``benchmarks/ica_risk.py``): chain c
   of every setting starts at the same draw of the ground-truth run (draws spread over its
   second half, so each starts in the exact posterior and the risk measures what the test
   trades, bias against draws per second; the chains thereby share a few draws' worth of
   information with the ground truth). ``--start intercept``: as in the paper, one feature, the
   intercept, included and all coefficients 0, so the risk includes the burn-in
   (``benchmarks/results/rj_risk_intercept.json``: 3 chains of 60 s; risk at 60 s 1.6e-3 for
   exact jumps, 1.6e-4, 1.1e-4, 9.8e-5 and 2.4e-4 at 0.01, 0.05, 0.1 and 0.2, almost all
   bias^2 of the transient: the paper's figure 4 shape, lowest at epsilon > 0).

   The risk at time t is the mean over chains and test rows of (running predictive mean over
   the draws made by t - I)^2, split into bias^2 (of the chains' average) and variance over
   the chains, with its standard error over the chains.

Posterior sds of the coefficients at these sizes are about 0.005 to 0.01: the default
``update_sd`` 0.015 is about 2.4 conditional sds (update acceptance near 0.5, the paper's),
and ``birth_sd`` 0.1, the paper's, is the scale of a coefficient that matters. Per epsilon the
JSON records rows per draw, draws per second, acceptance (all moves and, from the trace, per
move: a change of k tells a birth or death, an accepted draw at the same k an update, divided
by the expected number of proposals of each kind given k), model size, and the test error of the
predictive mean.

Wall time is the time of the ``pm.sample`` call (its start-up included, compilation not: each
setting's step is built once and reused by its chains), on one core of a machine whose two
cores other work shares: the load average is recorded at the start and the end.

Writes ``benchmarks/results/rj_risk.json`` (``rj_risk_intercept.json`` with ``--start
intercept``). About 8 minutes with the defaults:

    python benchmarks/rj_risk.py [--rows 100000] [--features 21] [--relevant 5]
        [--chains 3] [--seconds 15] [--reference-seconds 240] [--reference-burn 500]
        [--start {reference,intercept}] [--birth-sd 0.1] [--update-sd 0.015]
        [--tolerances 0 0.01 0.05 0.1 0.2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from common import risk_over_time, timed_chain, write_json
from scipy.special import expit

import pymc_subsample as pms

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
import variable_selection as vs

BATCH_SIZE = 500  # the paper's m for experiments 6.1 to 6.4 (its section 5.2)
TEST_SHARE = 0.2
PAPER = {
    "data": "MiniBooNE: 130,065 rows (28% positive), 50 features and a constant, 80/20 split",
    "model": "logistic, Laplace prior with scale nu (p(nu) ~ 1/nu, integrated out), truncated "
    "Poisson prior on the model size with lambda = 1e-10",
    "sigma_update": 0.01,
    "sigma_birth": 0.1,
    "batch_size": 500,
    "chains_per_setting": 10,
    "seconds_per_chain": 3500,
    "ground_truth": "exact reversible jump (epsilon = 0), 400,000 draws",
    "start": "one feature included",
    "tolerances": [0.0, 0.01, 0.05, 0.1, 0.2],
    "finding": "the lowest risk in predictive mean at the budget is obtained with epsilon > 0; "
    "birth/death acceptance falls from about 20% to about 2% once a good model is found, "
    "update acceptance about 50%",
}


def predictive_sums(
    theta: np.ndarray, cuts: np.ndarray, X_test: np.ndarray, chunk: int = 500
) -> np.ndarray:
    """Sums of ``sigmoid(X_test theta_t)`` over the draws ``t < c`` for each cut ``c``.

    Shape (len(cuts), test rows). Runs of repeated draws (rejections) are evaluated once.
    """
    changed = np.r_[True, np.any(theta[1:] != theta[:-1], axis=1)]
    starts = np.flatnonzero(changed)
    lengths = np.diff(np.r_[starts, len(theta)])
    sums = np.zeros((len(cuts), X_test.shape[0]))
    for lo in range(0, len(starts), chunk):
        s, n = starts[lo : lo + chunk], lengths[lo : lo + chunk]
        counts = np.clip(cuts[:, None] - s[None, :], 0, n[None, :]).astype(float)
        if counts.any():
            sums += counts @ expit(X_test @ theta[s].T).T
    return sums


def move_acceptance(
    k: np.ndarray, accepted: np.ndarray, k_start: int, d: int, weights: np.ndarray
) -> dict[str, float | None]:
    """Acceptance per move: accepted moves (from the trace) over expected proposals (given k)."""
    before = np.r_[k_start, k[:-1]]
    possible = np.column_stack([before >= 1, before < d, before >= 1]).astype(float)
    probabilities = possible * weights
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    proposed = probabilities.sum(axis=0)
    made = [
        np.sum((k == before) & (accepted > 0.5)),
        np.sum(k > before),
        np.sum(k < before),
    ]
    return {
        name: (float(m / p) if p > 0 else None)
        for name, m, p in zip(("update", "birth", "death"), made, proposed, strict=True)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=21)
    parser.add_argument("--relevant", type=int, default=5)
    parser.add_argument("--chains", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--reference-seconds", type=float, default=240.0)
    parser.add_argument("--reference-burn", type=int, default=500)
    parser.add_argument("--start", choices=["reference", "intercept"], default="reference")
    parser.add_argument("--birth-sd", type=float, default=0.1)
    parser.add_argument("--update-sd", type=float, default=0.015)
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.0, 0.01, 0.05, 0.1, 0.2])
    args = parser.parse_args()
    started, load_start = time.perf_counter(), os.getloadavg()
    warnings.filterwarnings("ignore", category=pms.SubsampleWarning)

    X, y, truth = vs.make_logistic_data(args.rows, args.features, args.relevant, seed=0)
    test = np.random.default_rng(1).permutation(args.rows) < round(TEST_SHARE * args.rows)
    X_train, y_train, X_test, y_test = X[~test], y[~test], X[test], y[test]
    d = args.features
    model = vs.lasso_logistic_model(X_train, y_train)
    step_options = {
        "birth_sd": args.birth_sd,
        "update_sd": args.update_sd,
        "batch_size": BATCH_SIZE,
    }

    def build(eps: float) -> tuple[Any, float]:
        with model:
            begin = time.perf_counter()
            step = pms.ReversibleJumpMH("gamma", "beta", error_tolerance=eps, **step_options)
        return step, time.perf_counter() - begin

    def summary(idata: Any, k_start: int, weights: np.ndarray) -> dict[str, Any]:
        gamma = idata.posterior["gamma"].values[0]
        beta = idata.posterior["beta"].values[0]
        stats = idata.sample_stats
        k = gamma.sum(axis=1)
        accepted = stats["accepted"].values[0]
        return {
            "theta": gamma * beta,
            "gamma": gamma,
            "beta": beta,
            "k": k,
            "rows_per_draw": float(stats["n_data"].values.mean()),
            "acceptance": float(accepted.mean()),
            "move_acceptance": move_acceptance(k, accepted, k_start, d, weights),
            "full_data_share": float(stats["full_data"].values.mean()),
        }

    # Ground truth: a long exact run from the data-generating point, burn-in dropped.
    reference_start = {"gamma": (truth != 0).astype(np.int64), "beta": truth.copy()}
    exact_step, _ = build(0.0)
    weights = np.asarray(exact_step.moves.move_probabilities)
    idata, stamps, _ = timed_chain(model, exact_step, reference_start, args.reference_seconds, 0)
    reference = summary(idata, int(reference_start["gamma"].sum()), weights)
    theta = reference["theta"][args.reference_burn :]
    n_reference = len(theta)
    batch_cuts = np.linspace(0, n_reference, 21).astype(int)
    cumulative = predictive_sums(theta, batch_cuts, X_test)
    batch_means = np.diff(cumulative, axis=0) / np.diff(batch_cuts)[:, None]
    truth_mean = cumulative[-1] / n_reference
    mcse_sq = batch_means.var(axis=0, ddof=1) / len(batch_means)
    floor = float(mcse_sq.mean())
    reference_rate = len(stamps) / float(stamps[-1])
    inclusion = reference["gamma"][args.reference_burn :].mean(axis=0)
    k_ref = reference["k"][args.reference_burn :]
    print(
        f"ground truth: {n_reference} draws after {args.reference_burn} dropped, "
        f"{reference_rate:.1f} draws/s, acceptance {reference['acceptance']:.2f}, "
        f"model size {k_ref.mean():.2f}, MCSE^2 floor {floor:.2e}",
        flush=True,
    )

    if args.start == "reference":
        picks = np.linspace(len(stamps) // 2, len(stamps) - 1, args.chains).astype(int)
        starts = [
            {"gamma": reference["gamma"][i].astype(np.int64), "beta": reference["beta"][i]}
            for i in picks
        ]
        start_text = (
            "draws " + ", ".join(str(i) for i in picks) + " of the ground-truth run (chain c "
            "of every setting at the c-th)"
        )
    else:
        intercept_only = np.zeros(d, dtype=np.int64)
        intercept_only[0] = 1
        starts = [{"gamma": intercept_only, "beta": np.zeros(d)}] * args.chains
        start_text = "intercept only included (gamma = e_0), all coefficients 0"
    times = np.geomspace(0.5, args.seconds, 14)
    results = {}
    for s, eps in enumerate(args.tolerances):
        name = f"eps={eps:g}"
        step, build_seconds = build(eps)
        chains = []
        for c in range(args.chains):
            idata, stamps, done = timed_chain(
                model, step, starts[c], args.seconds, seed=1000 * (s + 1) + c
            )
            chain = summary(idata, int(starts[c]["gamma"].sum()), weights)
            made = np.searchsorted(stamps, times, side="right")  # draws made by each time
            sums = predictive_sums(chain["theta"], made, X_test)
            with np.errstate(invalid="ignore", divide="ignore"):
                estimates = np.where(made[:, None] > 0, sums / made[:, None], np.nan)
            final = estimates[-1]
            half = len(chain["k"]) // 2
            chains.append(
                {
                    **chain,
                    "estimates": estimates,
                    "draws": stamps.size,
                    "seconds": float(stamps[-1]),
                    "done": bool(done),
                    "mean_model_size": float(chain["k"].mean()),
                    "mean_model_size_second_half": float(chain["k"][half:].mean()),
                    "final_model_size": int(chain["k"][-1]),
                    "test_error": float(np.mean((final > 0.5) != y_test)),
                }
            )
        estimates = np.array([chain["estimates"] for chain in chains])  # chains, times, rows
        draws = np.array([chain["draws"] for chain in chains])
        seconds = np.array([chain["seconds"] for chain in chains])
        per_move = {
            move: float(np.mean([chain["move_acceptance"][move] or 0.0 for chain in chains]))
            for move in ("update", "birth", "death")
        }
        results[name] = {
            "error_tolerance": eps,
            "build_seconds": build_seconds,
            **risk_over_time(estimates, truth_mean),
            "rows_per_draw": float(np.mean([chain["rows_per_draw"] for chain in chains])),
            "rows_share": float(np.mean([chain["rows_per_draw"] for chain in chains]))
            / len(y_train),
            "draws_per_second": float(draws.sum() / seconds.sum()),
            "draws_per_chain": draws.tolist(),
            "acceptance": float(np.mean([chain["acceptance"] for chain in chains])),
            "move_acceptance": per_move,
            "full_data_share": float(np.mean([chain["full_data_share"] for chain in chains])),
            "mean_model_size": float(np.mean([chain["mean_model_size"] for chain in chains])),
            "mean_model_size_second_half": float(
                np.mean([chain["mean_model_size_second_half"] for chain in chains])
            ),
            "final_model_sizes": [chain["final_model_size"] for chain in chains],
            "inclusion_second_half": np.mean(
                [chain["gamma"][len(chain["k"]) // 2 :].mean(axis=0) for chain in chains], axis=0
            ).tolist(),
            "test_error_at_budget": float(np.mean([chain["test_error"] for chain in chains])),
            "all_chains_reached_budget": all(chain["done"] for chain in chains),
        }
        entry = results[name]
        print(
            f"{name}: risk at {args.seconds:g} s {entry['risk_at_budget']:.3g} +- "
            f"{entry['risk_se_at_budget']:.2g} (bias^2 {entry['bias_sq_at_budget']:.3g}, "
            f"variance {entry['variance_at_budget']:.3g}); {entry['rows_per_draw']:.0f} "
            f"rows/draw, {entry['draws_per_second']:.1f} draws/s, acceptance "
            f"{entry['acceptance']:.3f} (update {per_move['update']:.2f}, birth "
            f"{per_move['birth']:.3f}, death {per_move['death']:.3f}), model size "
            f"{entry['mean_model_size_second_half']:.2f}",
            flush=True,
        )

    truth_test_error = float(np.mean((truth_mean > 0.5) != y_test))
    write_json(
        "rj_risk" if args.start == "reference" else "rj_risk_intercept",
        {
            "rows": args.rows,
            "train_rows": len(y_train),
            "test_rows": len(y_test),
            "features": d,
            "relevant": args.relevant,
            "true_coefficients": truth.tolist(),
            "model": "examples/variable_selection.py lasso_logistic_model (Laplace slab scale 1, "
            "Bernoulli(0.1) indicators)",
            "step": {**step_options, "move_probabilities": weights.tolist()},
            "chains": args.chains,
            "seconds_per_chain": args.seconds,
            "times": times.tolist(),
            "start": args.start,
            "chain_starts": start_text,
            "ground_truth": {
                "start": "the data-generating gamma and beta",
                "draws": n_reference,
                "burn": args.reference_burn,
                "seconds": args.reference_seconds,
                "draws_per_second": reference_rate,
                "rows_per_draw": reference["rows_per_draw"],
                "acceptance": reference["acceptance"],
                "move_acceptance": reference["move_acceptance"],
                "mean_model_size": float(k_ref.mean()),
                "inclusion_probabilities": inclusion.tolist(),
                "predictive_mcse_sq_mean": floor,
                "mean_predictive": float(truth_mean.mean()),
                "test_error": truth_test_error,
            },
            "settings": results,
            "paper": PAPER,
            "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
            "total_seconds": time.perf_counter() - started,
        },
    )


if __name__ == "__main__":
    main()

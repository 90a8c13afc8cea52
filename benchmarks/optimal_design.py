"""Optimal sequential test design against the fixed-m heuristic (Korattikara et al. 2014, 6.5).

Section 6.5 of the paper designs the test of its ICA experiment (section 6.2) two ways, the
"average design" of eq. 7 from 100 training samples ``(theta, theta')`` of the chain and the
"worst-case design" of eq. 8, and compares them on 100 new test samples with the heuristic of
a fixed first batch m = 600 and a varying epsilon (figure 6): at large error the optimal design
uses half the data. This redoes it with ``pms.design_test`` on the ICA model of
``examples/ica_stiefel.py`` (4 sources, two of them Gaussian as in the paper):

1. An exact MH chain with the paper's random walk on the orthogonal group gives 200 states
   after a tuned burn-in; the first 100, each with a proposal from it, are the training set and
   the last 100 the test set. Every pair's ``l_i`` are computed on all N rows, so its ``mu`` and
   ``sigma_l`` are exact, as in the paper.
2. Designs: the heuristic (m = 600, epsilon from 0.001 to 0.2), the average design for bounds
   ``max_error`` from 0.002 to 0.15 on the training set, and the worst-case design for the same
   bounds.
3. Each design is measured on the test set by simulation: for each pair, 400 sequential tests
   stage by stage (Algorithm 1 as the fused draw runs it, with the package's t-statistics and
   the design's per-stage tolerances) on random row orders, each with its own u, against the
   exact MH decision for the same u. The measured error of a pair is the mean difference of
   the two decisions (``Delta``, eq. 21), its rows the mean rows read; the table reports the
   mean ``|Delta|`` over the pairs (with its noise floor, the mean standard error), the mean
   rows, and the programme's predictions for the same pairs. All designs see the same row
   orders and u (common random numbers).

The ratio reported is the optimal design's measured rows over the heuristic's at the same
measured error (the heuristic's curve interpolated in log rows).

Writes ``benchmarks/results/optimal_design.json``. About 12 minutes at the default size:

    python benchmarks/optimal_design.py [--rows 50000] [--tests 400]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from common import write_json
from scipy.special import stdtr

import pymc_subsample as pms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from ica_stiefel import make_data, orthogonal_walk

HEURISTIC_BATCH = 600
HEURISTIC_TOLERANCES = (0.001, 0.003, 0.01, 0.03, 0.06, 0.1, 0.2)
MAX_ERRORS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15)


def row_log_likelihoods(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``log p(x_i | W)`` of section 6.2 for orthonormal W: ``-sum_j log(4 cosh^2(s_j / 2))``."""
    s = x @ W.T
    return -2.0 * np.logaddexp(s / 2.0, -s / 2.0).sum(axis=1)


def polar(W: np.ndarray) -> np.ndarray:
    """The nearest orthogonal matrix (a start on the manifold near the truth)."""
    u, _, vt = np.linalg.svd(W)
    return u @ vt


def exact_chain(x: np.ndarray, start: np.ndarray, n_states: int, rng: np.random.Generator):
    """Exact MH with the orthogonal random walk: tuned burn-in, then every 10th of 10 n_states."""
    W, loglik, scaling = start, row_log_likelihoods(x, start).sum(), 0.05
    for _ in range(20):  # burn-in, scaling tuned to 25-50% acceptance
        accepted = 0
        for _ in range(100):
            q, _ = orthogonal_walk(rng, W.ravel(), scaling)
            proposal = q.reshape(W.shape)
            new = row_log_likelihoods(x, proposal).sum()
            if math.log(rng.uniform()) < new - loglik:
                W, loglik, accepted = proposal, new, accepted + 1
        scaling *= 1.3 if accepted > 50 else 0.7 if accepted < 25 else 1.0
    states = []
    for k in range(10 * n_states):
        q, _ = orthogonal_walk(rng, W.ravel(), scaling)
        proposal = q.reshape(W.shape)
        new = row_log_likelihoods(x, proposal).sum()
        if math.log(rng.uniform()) < new - loglik:
            W, loglik = proposal, new
        if k % 10 == 9:
            states.append(W)
    return states, scaling


def pair_values(x: np.ndarray, states, scaling: float, rng: np.random.Generator):
    """The ``l_i`` of a proposal from each state, on all rows."""
    values = []
    for W in states:
        q, _ = orthogonal_walk(rng, W.ravel(), scaling)
        values.append(row_log_likelihoods(x, q.reshape(W.shape)) - row_log_likelihoods(x, W))
    return values


def sample_of(values, n_rows: int) -> pms.ProposalSample:
    means = np.array([v.mean() for v in values])
    sds = np.array([v.std(ddof=1) for v in values])
    return pms.ProposalSample.from_estimates(means, sds, np.zeros(len(values)), n_rows)


def simulate(design: pms.SequentialDesign, orders, log_u, full_mean: float):
    """Algorithm 1 stage by stage on the row orders: (approximate - exact) decisions and rows."""
    sums, squares, n_rows = orders
    n_values = np.minimum(np.arange(1, design.n_stages(n_rows) + 1) * design.batch_size, n_rows)
    tolerances = design.stage_tolerances(n_rows)
    threshold = log_u / n_rows  # eq. 2 with a symmetric proposal and a uniform prior
    total, total_sq = sums[:, n_values - 1], squares[:, n_values - 1]
    n = n_values.astype(float)
    mean = total / n
    variance = np.maximum(total_sq - total * mean, 0.0) / (n - 1)
    std_error = np.sqrt(variance * (1.0 - (n - 1) / (n_rows - 1)) / n)  # eq. 4
    with np.errstate(divide="ignore", invalid="ignore"):
        error = stdtr(n - 1, -np.abs(mean - threshold[:, None]) / std_error)  # eq. 5
    stop = (error < tolerances) | (n_values == n_rows)
    stage = np.argmax(stop, axis=1)
    rows = n_values[stage]
    exact = full_mean > threshold
    approximate = np.where(rows == n_rows, exact, mean[np.arange(len(stage)), stage] > threshold)
    return approximate.astype(float) - exact.astype(float), rows


def measure(designs, test_values, n_tests: int, rng: np.random.Generator):
    """Per design: mean |Delta|, its noise floor, signed mean Delta and mean rows, by pair."""
    n_rows = test_values[0].size
    deltas = {name: [] for name in designs}
    errors = {name: [] for name in designs}
    rows = {name: [] for name in designs}
    for values in test_values:
        permuted = rng.permuted(np.broadcast_to(values, (n_tests, n_rows)), axis=1)
        orders = (np.cumsum(permuted, axis=1), np.cumsum(permuted**2, axis=1), n_rows)
        del permuted
        log_u = np.log(rng.uniform(size=n_tests))
        for name, design in designs.items():
            difference, used = simulate(design, orders, log_u, values.mean())
            deltas[name].append(difference.mean())
            errors[name].append(difference.std(ddof=1) / math.sqrt(n_tests))
            rows[name].append(used.mean())
    return {
        name: {
            "measured_mean_abs_delta": float(np.mean(np.abs(deltas[name]))),
            "noise_floor": float(np.mean(errors[name])),
            "measured_mean_delta": float(np.mean(deltas[name])),
            "measured_rows": float(np.mean(rows[name])),
        }
        for name in designs
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--tests", type=int, default=400)
    args = parser.parse_args()
    rng = np.random.default_rng(2014)
    data = make_data(args.rows, 4, n_gaussian=2, seed=6)
    start = time.perf_counter()
    states, scaling = exact_chain(data.x, polar(data.unmixing), 200, rng)
    train = pair_values(data.x, states[:100], scaling, rng)
    test = pair_values(data.x, states[100:], scaling, rng)
    train_sample, test_sample = sample_of(train, args.rows), sample_of(test, args.rows)
    chain_seconds = time.perf_counter() - start

    designs: dict[str, pms.SequentialDesign] = {}
    choices: dict[str, dict[str, object]] = {}
    for tolerance in HEURISTIC_TOLERANCES:
        designs[f"heuristic eps={tolerance}"] = pms.SequentialDesign(HEURISTIC_BATCH, tolerance)
    design_seconds = {}
    for max_error in MAX_ERRORS:
        for kind, sample in (("average", train_sample), ("worst", None)):
            start = time.perf_counter()
            choice = pms.design_test(args.rows, max_error, sample)
            design_seconds[f"{kind} {max_error}"] = time.perf_counter() - start
            name = f"{kind} max_error={max_error}"
            designs[name] = choice.design
            choices[name] = {
                "design": choice.design._asdict(),
                "predicted_training_error": choice.predicted_error,
                "predicted_training_rows": choice.predicted_rows,
            }
        print(max_error, "designed", flush=True)
    start = time.perf_counter()
    measured = measure(designs, test, args.tests, rng)
    measure_seconds = time.perf_counter() - start
    results = {}
    for name, design in designs.items():
        delta, fraction = pms.acceptance_error(design, args.rows, test_sample)
        results[name] = {
            **measured[name],
            "predicted_mean_abs_delta": float(np.mean(np.abs(delta))),
            "predicted_rows": float(np.mean(fraction) * args.rows),
            **choices.get(name, {"design": design._asdict()}),
        }
        print(name, {k: round(v, 5) for k, v in results[name].items() if isinstance(v, float)})

    heuristic = sorted(
        (
            results[f"heuristic eps={t}"]["measured_mean_abs_delta"],
            results[f"heuristic eps={t}"]["measured_rows"],
        )
        for t in HEURISTIC_TOLERANCES
    )
    errors = np.array([e for e, _ in heuristic])
    log_rows = np.log([r for _, r in heuristic])
    ratios = {}
    for max_error in MAX_ERRORS:
        for kind in ("average", "worst"):
            entry = results[f"{kind} max_error={max_error}"]
            error = entry["measured_mean_abs_delta"]
            if errors.min() <= error <= errors.max():
                at_same_error = math.exp(float(np.interp(error, errors, log_rows)))
                ratios[f"{kind} max_error={max_error}"] = {
                    "measured_error": error,
                    "heuristic_rows_at_that_error": at_same_error,
                    "rows_ratio": entry["measured_rows"] / at_same_error,
                }
    for name, ratio in ratios.items():
        print(name, {k: round(v, 4) for k, v in ratio.items()})
    write_json(
        "optimal_design",
        {
            "rows": args.rows,
            "tests_per_pair": args.tests,
            "n_training_pairs": len(train),
            "n_test_pairs": len(test),
            "walk_scaling": scaling,
            "chain_seconds": chain_seconds,
            "design_seconds": design_seconds,
            "measure_seconds": measure_seconds,
            "designs": results,
            "ratio_to_heuristic_at_same_measured_error": ratios,
        },
    )


if __name__ == "__main__":
    main()

"""Optimal sequential test design against the fixed-m heuristic (Korattikara et al. 2014, 6.5).

Section 6.5 of the paper designs the test of its ICA experiment (section 6.2) two ways, the
"average design" of eq. 7 from 100 training samples ``(theta, theta')`` of the chain and the
"worst-case design" of eq. 8, and compares them on 100 new test samples with the heuristic of
a fixed first batch m = 600 and a varying epsilon (figure 6): at large error the optimal design
uses half the data. This redoes it with ``pms.design_test`` on the ICA model of
``examples/ica_stiefel.py`` (4 sources, two of them Gaussian as in the paper):

1. At the paper's N = 1.95 million rows, an exact MH chain with the paper's random walk on the
   orthogonal group gives 200 states (every 5th after a burn-in that tunes the walk to 25-50%
   acceptance); the first 100, each with a proposal from it, are the training set and the last
   100 the test set. Every pair's ``l_i`` are computed on all N rows, so its ``mu`` and
   ``sigma_l`` are exact, as in the paper.
2. Designs: the heuristic (m = 600, epsilon from 1e-4 to 0.2), the average design for bounds
   ``max_error`` from 0.002 to 0.2 on the training set, and the worst-case design for the same
   bounds.
3. Each design is measured on the test set by simulation: for each pair, 64 random row orders,
   each tested at 16 stratified values of u (one in each sixteenth of (0, 1)), stage by stage
   (Algorithm 1 as the fused draw runs it, with the package's t-statistics and the design's
   per-stage tolerances), against the exact MH decision for the same u. The measured error of
   a pair is the mean difference of the two decisions (``Delta``, eq. 21), its rows the mean
   rows read; the table reports the mean ``|Delta|`` over the pairs (with its noise floor, the
   mean standard error of a pair's ``Delta`` over its row orders), the mean rows, and the
   programme's predictions for the same pairs. All designs see the same row orders and u
   (common random numbers).

The ratio reported is the optimal design's measured rows over the heuristic's at the same
measured error (the heuristic's curve interpolated in log rows).

Writes ``benchmarks/results/optimal_design.json``. About 25 minutes at the default size:

    python benchmarks/optimal_design.py [--rows 1950000] [--orders 64] [--u-per-order 16]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from common import write_json

import pymc_subsample as pms
from pymc_subsample.step_methods.fused_path import _critical_values

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from ica_stiefel import make_data, orthogonal_walk

HEURISTIC_BATCH = 600
#: The walk's scale times sqrt(N): 0.0156 tuned at N = 50,000 (the posterior's width is N^-1/2).
WALK_SCALE = 3.5
BURN_ROUNDS, ROUND_STEPS, THIN = 8, 50, 5
#: Row orders simulated together (their cumulative sums are ORDERS_AT_ONCE x N floats).
ORDERS_AT_ONCE = 8
HEURISTIC_TOLERANCES = (1e-4, 3e-4, 0.001, 0.003, 0.01, 0.03, 0.06, 0.1, 0.2)
MAX_ERRORS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2)
#: Training and test proposals (the paper's 100 samples of the chain each).
N_PAIRS = 100


def row_log_likelihoods(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``log p(x_i | W)`` of section 6.2 for orthonormal W: ``-sum_j log(4 cosh^2(s_j / 2))``.

    ``log(4 cosh^2(s / 2)) = |s| + 2 log1p(exp(-|s|))``, five times faster than ``logaddexp``.
    """
    s = np.abs(x @ W.T)
    return -(s + 2.0 * np.log1p(np.exp(-s))).sum(axis=1)


def polar(W: np.ndarray) -> np.ndarray:
    """The nearest orthogonal matrix (a start on the manifold near the truth)."""
    u, _, vt = np.linalg.svd(W)
    return u @ vt


def exact_chain(x: np.ndarray, start: np.ndarray, n_states: int, rng: np.random.Generator):
    """Exact MH with the orthogonal random walk: tuned burn-in, then every THIN-th state.

    The walk's scale starts at its tuned value at N = 50,000 scaled by ``N^-1/2`` (the
    posterior's width) and is tuned to 25-50% acceptance over BURN_ROUNDS rounds.
    """
    W, loglik = start, row_log_likelihoods(x, start).sum()
    scaling = WALK_SCALE / math.sqrt(x.shape[0])
    for _ in range(BURN_ROUNDS):
        accepted = 0
        for _ in range(ROUND_STEPS):
            q, _ = orthogonal_walk(rng, W.ravel(), scaling)
            proposal = q.reshape(W.shape)
            new = row_log_likelihoods(x, proposal).sum()
            if math.log(rng.uniform()) < new - loglik:
                W, loglik, accepted = proposal, new, accepted + 1
        rate = accepted / ROUND_STEPS
        scaling *= 1.3 if rate > 0.5 else 0.7 if rate < 0.25 else 1.0
    states = []
    for k in range(THIN * n_states):
        q, _ = orthogonal_walk(rng, W.ravel(), scaling)
        proposal = q.reshape(W.shape)
        new = row_log_likelihoods(x, proposal).sum()
        if math.log(rng.uniform()) < new - loglik:
            W, loglik = proposal, new
        if k % THIN == THIN - 1:
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


def critical_values(design: pms.SequentialDesign, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows read at each stage and the t critical value at which it stops (eq. 5).

    The fused draw's own quantiles (``stdtr(n_j - 1, -|t|) < epsilon_j`` exactly when ``|t|``
    exceeds them; +inf where the design does not test). The last stage reads all rows and
    decides exactly, whatever its value.
    """
    n_values = np.minimum(np.arange(1, design.n_stages(n_rows) + 1) * design.batch_size, n_rows)
    critical = _critical_values(n_rows, design.batch_size, design.stage_tolerances(n_rows))
    return n_values, critical


def simulate(stages, sums, squares, log_u, full_mean: float):
    """Algorithm 1 stage by stage on row orders: (approximate - exact) decisions and rows.

    ``sums`` and ``squares`` are the orders' cumulative sums (orders x N), ``log_u`` one row
    of uniforms' logarithms per order (orders x K, each order tried at K values of u).
    """
    n_values, critical = stages
    n_rows = sums.shape[1]
    threshold = log_u / n_rows  # eq. 2 with a symmetric proposal and a uniform prior
    total, total_sq = sums[:, n_values - 1], squares[:, n_values - 1]
    n = n_values.astype(float)
    mean = total / n
    variance = np.maximum(total_sq - total * mean, 0.0) / np.maximum(n - 1.0, 1.0)
    std_error = np.sqrt(variance * (1.0 - (n - 1.0) / (n_rows - 1.0)) / n)  # eq. 4
    # |t| > critical value, for each order, u and stage (eq. 5)
    gap = np.abs(mean[:, None, :] - threshold[:, :, None])
    stop = gap > critical * std_error[:, None, :]
    stop[..., -1] = True
    stage = np.argmax(stop, axis=2)
    rows = n_values[stage]
    decided_mean = np.take_along_axis(mean, stage, axis=1)
    exact = full_mean > threshold
    approximate = np.where(rows == n_rows, exact, decided_mean > threshold)
    return approximate.astype(float) - exact.astype(float), rows


def measure(designs, test_values, n_orders: int, u_per_order: int, rng: np.random.Generator):
    """Per design: mean |Delta|, its noise floor, signed mean Delta and mean rows, by pair.

    Each pair is tested on ``n_orders`` random row orders, each at ``u_per_order`` stratified
    values of u (one in each of K equal slices of (0, 1)), so that the mean over u of one
    order is nearly the integral of eq. 21 for that order; a pair's noise is then the spread
    of those means over the orders.
    """
    n_rows = test_values[0].size
    stages = {name: critical_values(design, n_rows) for name, design in designs.items()}
    deltas = {name: [] for name in designs}
    errors = {name: [] for name in designs}
    rows = {name: [] for name in designs}
    for values in test_values:
        per_order = {name: [] for name in designs}
        used_rows = {name: [] for name in designs}
        for start in range(0, n_orders, ORDERS_AT_ONCE):
            n_here = min(ORDERS_AT_ONCE, n_orders - start)
            permuted = rng.permuted(np.broadcast_to(values, (n_here, n_rows)), axis=1)
            sums = np.cumsum(permuted, axis=1)
            np.square(permuted, out=permuted)
            squares = np.cumsum(permuted, axis=1)
            del permuted
            slices = np.arange(u_per_order) + rng.uniform(size=(n_here, u_per_order))
            log_u = np.log(slices / u_per_order)
            for name in designs:
                difference, used = simulate(stages[name], sums, squares, log_u, values.mean())
                per_order[name].append(difference.mean(axis=1))
                used_rows[name].append(used.mean(axis=1))
        for name in designs:
            order_deltas = np.concatenate(per_order[name])
            deltas[name].append(order_deltas.mean())
            errors[name].append(order_deltas.std(ddof=1) / math.sqrt(n_orders))
            rows[name].append(np.concatenate(used_rows[name]).mean())
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
    parser.add_argument("--rows", type=int, default=1_950_000)
    parser.add_argument("--orders", type=int, default=64)
    parser.add_argument("--u-per-order", type=int, default=16)
    args = parser.parse_args()
    rng = np.random.default_rng(2014)
    data = make_data(args.rows, 4, n_gaussian=2, seed=6)
    start = time.perf_counter()
    states, scaling = exact_chain(data.x, polar(data.unmixing), 2 * N_PAIRS, rng)
    train_sample = sample_of(pair_values(data.x, states[:N_PAIRS], scaling, rng), args.rows)
    test = pair_values(data.x, states[N_PAIRS:], scaling, rng)
    test_sample = sample_of(test, args.rows)
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
    measured = measure(designs, test, args.orders, args.u_per_order, rng)
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
            "row_orders_per_pair": args.orders,
            "u_per_order": args.u_per_order,
            "n_training_pairs": N_PAIRS,
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

"""AusterityGibbs on a dense Boltzmann machine against exact Gibbs and enumeration.

Korattikara, Chen and Welling (2014), supplementary F.1, run Gibbs sampling on a densely
connected binary Markov random field (D = 100 units, 4,851 potential terms per update,
minibatches of 500) and report, for epsilon in {0.01, ..., 0.25}, the error of the approximate
update's conditional probability (their figure 14: "when epsilon = 0.01, the observed maximum
error is within 0.01") and the L1 error of the joint over cliques of 5 units against running
time (figure 15). This redoes it on the dense Boltzmann machine of
``examples/boltzmann_gibbs.py`` (every one of the N terms reads every unit) with D small
enough that the distribution is known exactly by enumerating its 2^D states:

1. Chains: exact Gibbs (``error_tolerance=0``: every update reads all N terms) and
   ``pms.AusterityGibbs`` at each epsilon of ``--tolerances`` (``--batch-size`` 500, the
   paper's), each one chain of ``--sweeps`` sweeps through ``pm.sample`` (random scan order,
   same seed, no tuning). Per setting: rows read per update (``n_data / n_updates``) and its
   ratio to N, microseconds per update (wall time of ``pm.sample`` over the updates; the step
   is compiled beforehand), the max and mean absolute error of the D marginals against
   enumeration (with batch-means Monte Carlo standard errors and ArviZ's ESS), the L1
   distance between the chain's empirical joint over all 2^D states and the exact one, and the
   paper's eq. 48, the mean L1 error of the joint over every subset of 5 units. Exact Gibbs, in
   the same run, is the baseline of the ratios, and its errors are the Monte Carlo floor of
   this chain length: at beta = 8 the units follow two prototypes and the chain switches
   between them slowly (an ESS of a few hundred per 4,000 sweeps for most units), so the
   chains' errors are mostly Monte Carlo noise; part 2 measures the test's bias directly.
2. Conditional probabilities (figure 14): ``--pairs`` pairs (state, unit) drawn among the
   states the exact chain visited, spread over the exact conditional ``sigmoid(Delta_j)``
   (enumerated log-probabilities), and for each epsilon ``--repeats`` single updates from
   each pair's state through the kernel ``pymc_subsample.kernels.gibbs.binary_gibbs_sweep``
   with the step's own oracles and row sampler. The kernel draws each update's ``u`` first
   (then its rows), so the exact update with the same ``u`` is known: ``x_j = 1`` iff
   ``logit(u) < Delta_j``. The error of the approximate conditional probability is estimated
   both plainly (fraction of ``x_j = 1`` minus ``sigmoid(Delta_j)``, binomial standard error)
   and coupled (mean of the approximate minus the exact indicator at the same ``u``: the same
   expectation, with a standard error set by the wrong decisions alone). A few updates with
   ``error_tolerance=0`` check the coupling (the kernel's exact decisions must equal the
   enumerated ones). The largest coupled error over the pairs is the measured Delta_max (a
   lower bound on the max over all states, up to noise).

Writes ``benchmarks/results/gibbs_dense.json``. About 2 minutes with the defaults:

    python benchmarks/gibbs_dense.py [--rows 100000] [--units 10] [--beta 8] [--sweeps 4000]
        [--tolerances 0.01 0.05 0.1 0.2] [--batch-size 500] [--pairs 40] [--repeats 2000]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
from common import timed_sample, write_json

import pymc_subsample as pms
from pymc_subsample.kernels.gibbs import binary_gibbs_sweep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from boltzmann_gibbs import boltzmann_model, exact_distribution, make_patterns

PAPER = {
    "units": 100,
    "terms_per_update": 4851,
    "batch_size": 500,
    "tolerances": [0.01, 0.05, 0.1, 0.15, 0.2, 0.25],
    "figure_14": "the approximate conditional underestimates large probabilities and "
    "overestimates small ones; when epsilon = 0.01 the observed maximum error is within 0.01",
    "figure_15": "approximate samplers decay faster at first and level at a bias floor; exact "
    "Gibbs has the lowest error at about 1000 s",
}
CLIQUE_SIZE = 5  # the paper's eq. 48: L1 error of the joint over subsets of 5 units
MCSE_BATCHES = 20


def state_index(states: np.ndarray) -> np.ndarray:
    """Row of each binary state in ``exact_distribution``'s enumeration (itertools.product)."""
    weights = 2 ** np.arange(states.shape[-1] - 1, -1, -1)
    return np.asarray(states, dtype=np.int64) @ weights


def exact_conditionals(log_p: np.ndarray, n_units: int) -> np.ndarray:
    """``Delta[s, j] = log p(s with x_j = 1) - log p(s with x_j = 0)`` for every state and unit."""
    index = np.arange(2**n_units)
    delta = np.empty((index.size, n_units))
    for j in range(n_units):
        bit = 1 << (n_units - 1 - j)
        delta[:, j] = log_p[index | bit] - log_p[index & ~bit]
    return delta


def clique_l1(counts: np.ndarray, probabilities: np.ndarray, states: np.ndarray) -> float:
    """Mean over all subsets of ``CLIQUE_SIZE`` units of the L1 error of their joint (eq. 48)."""
    n_units = states.shape[1]
    empirical = counts / counts.sum()
    errors = []
    for subset in itertools.combinations(range(n_units), CLIQUE_SIZE):
        sub_index = state_index(states[:, subset])
        exact = np.bincount(sub_index, weights=probabilities, minlength=2**CLIQUE_SIZE)
        approx = np.bincount(sub_index, weights=empirical, minlength=2**CLIQUE_SIZE)
        errors.append(np.abs(approx - exact).sum())
    return float(np.mean(errors))


def chain_run(
    model: Any,
    tolerance: float,
    args: argparse.Namespace,
    states: np.ndarray,
    probabilities: np.ndarray,
) -> tuple[dict[str, Any], Any, np.ndarray]:
    """One chain of ``args.sweeps`` sweeps; returns its summary, the step, and its draws."""
    with model:
        step = pms.AusterityGibbs(error_tolerance=tolerance, batch_size=args.batch_size)
        idata, wall = timed_sample(draws=args.sweeps, tune=0, chains=1, step=step)
    stats = idata.sample_stats
    draws = idata.posterior["x"].to_numpy().reshape(-1, states.shape[1]).astype(np.int64)
    n_updates = int(stats["n_updates"].sum())
    n_data = int(stats["n_data"].sum())
    exact_marginals = probabilities @ states
    marginals = draws.mean(0)
    batch_means = draws[: draws.shape[0] // MCSE_BATCHES * MCSE_BATCHES]
    batch_means = batch_means.reshape(MCSE_BATCHES, -1, draws.shape[1]).mean(1)
    mcse = batch_means.std(0, ddof=1) / math.sqrt(MCSE_BATCHES)
    counts = np.bincount(state_index(draws), minlength=states.shape[0]).astype(float)
    abs_error = np.abs(marginals - exact_marginals)
    summary = {
        "error_tolerance": tolerance,
        "sweeps": args.sweeps,
        "updates": n_updates,
        "wall_seconds": wall,
        "microseconds_per_update": 1e6 * wall / n_updates,
        "rows_per_update": n_data / n_updates,
        "rows_per_update_over_n": n_data / n_updates / args.rows,
        "full_data_share": float(stats["n_full_data"].sum()) / n_updates,
        "nonfinite_updates": int(stats["n_nonfinite"].sum()),
        "changed_per_sweep": float(stats["n_changed"].mean()),
        "marginals": marginals.tolist(),
        "marginal_max_abs_error": float(abs_error.max()),
        "marginal_mean_abs_error": float(abs_error.mean()),
        "marginal_mcse_batch_means": mcse.tolist(),
        "marginal_max_abs_error_in_mcse": float((abs_error / mcse).max()),
        "marginal_ess": az.ess(idata, var_names=["x"])["x"].to_numpy().tolist(),
        "joint_l1": float(np.abs(counts / counts.sum() - probabilities).sum()),
        "states_visited": int((counts > 0).sum()),
        f"clique{CLIQUE_SIZE}_mean_l1": clique_l1(counts, probabilities, states),
    }
    return summary, step, draws


def choose_pairs(
    visited: np.ndarray, delta: np.ndarray, n_pairs: int, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """Pairs (state index, unit) among visited states, spread over the exact conditional."""
    candidates = np.array([(s, j) for s in visited for j in range(delta.shape[1])])
    p_one = 1.0 / (1.0 + np.exp(-delta[candidates[:, 0], candidates[:, 1]]))
    bins = np.minimum((p_one * 10).astype(int), 9)
    chosen: list[int] = []
    per_bin = max(1, n_pairs // 10)
    for b in range(10):
        members = np.flatnonzero(bins == b)
        chosen.extend(rng.choice(members, size=min(per_bin, members.size), replace=False))
    rest = np.setdiff1d(np.arange(candidates.shape[0]), chosen)
    chosen.extend(rng.choice(rest, size=min(n_pairs - len(chosen), rest.size), replace=False))
    return [(int(candidates[i, 0]), int(candidates[i, 1])) for i in sorted(chosen)]


def single_updates(
    step: Any,
    state: np.ndarray,
    unit: int,
    delta: float,
    tolerance: float,
    batch_size: int,
    repeats: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``repeats`` updates of ``unit`` from ``state``: approximate and exact (same u) values."""
    q = state.astype(np.float64)
    position = np.array([unit])
    approx = np.empty(repeats)
    exact = np.empty(repeats)
    rows = 0
    for r in range(repeats):
        saved = rng.bit_generator.state
        u = rng.uniform()  # the kernel's first draw: the update's u (Barker: logit(u) < Delta)
        exact[r] = u > 0.0 and math.log(u) - math.log1p(-u) < delta
        rng.bit_generator.state = saved
        q_new, info = binary_gibbs_sweep(
            rng,
            q,
            position,
            step.oracles.loglik_ratio_rows,
            step.oracles.log_prior_ratio,
            step.row_sampler,
            tolerance,
            batch_size,
        )
        approx[r] = q_new[unit]
        rows += info.n_data
    return approx, exact, rows


def conditional_errors(
    steps: dict[float, Any],
    pairs: list[tuple[int, int]],
    states: np.ndarray,
    delta: np.ndarray,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Figure 14: the approximate update's P(x_j = 1) against sigmoid(Delta_j) per pair."""
    exact_step = steps[0.0]
    check_rng = np.random.default_rng([args.seed, 99])
    mismatches = checked = 0
    for s, j in pairs[:: max(1, len(pairs) // 5)]:
        approx, exact, _ = single_updates(
            exact_step, states[s], j, delta[s, j], 0.0, args.batch_size, 20, check_rng
        )
        mismatches += int((approx != exact).sum())
        checked += approx.size
    p_exact = [float(1.0 / (1.0 + math.exp(-delta[s, j]))) for s, j in pairs]
    by_tolerance = {}
    for tolerance in args.tolerances:
        start = time.perf_counter()
        rng = np.random.default_rng([args.seed, round(1e4 * tolerance)])
        fraction, coupled, coupled_se, raw_se, rows, wrong = [], [], [], [], [], []
        for (s, j), p in zip(pairs, p_exact, strict=True):
            approx, exact, n_data = single_updates(
                steps[tolerance],
                states[s],
                j,
                delta[s, j],
                tolerance,
                args.batch_size,
                args.repeats,
                rng,
            )
            difference = approx - exact
            fraction.append(float(approx.mean()))
            coupled.append(float(difference.mean()))
            coupled_se.append(float(difference.std(ddof=1) / math.sqrt(args.repeats)))
            raw_se.append(math.sqrt(p * (1 - p) / args.repeats))
            rows.append(n_data / args.repeats)
            wrong.append(float(np.mean(difference != 0)))
        raw = np.subtract(fraction, p_exact)
        worst = int(np.argmax(np.abs(coupled)))
        by_tolerance[f"{tolerance:g}"] = {
            "max_abs_error_coupled": float(abs(coupled[worst])),
            "max_abs_error_coupled_se": coupled_se[worst],
            "max_abs_error_at_exact_p": p_exact[worst],
            "mean_abs_error_coupled": float(np.mean(np.abs(coupled))),
            "max_abs_error_plain": float(np.abs(raw).max()),
            "plain_se_at_half": math.sqrt(0.25 / args.repeats),
            "wrong_decision_share": float(np.mean(wrong)),
            "rows_per_update": float(np.mean(rows)),
            "fraction_one": fraction,
            "error_coupled": coupled,
            "error_coupled_se": coupled_se,
            "error_plain": raw.tolist(),
            "error_plain_se": raw_se,
            "seconds": time.perf_counter() - start,
        }
        entry = by_tolerance[f"{tolerance:g}"]
        print(
            f"  conditional, epsilon {tolerance:g}: max |error| "
            f"{entry['max_abs_error_coupled']:.4f} +- {entry['max_abs_error_coupled_se']:.4f} "
            f"(exact p {entry['max_abs_error_at_exact_p']:.3f}), plain max "
            f"{entry['max_abs_error_plain']:.4f}, {entry['rows_per_update']:.0f} rows/update, "
            f"{entry['seconds']:.0f} s",
            flush=True,
        )
    return {
        "pairs": [{"state": states[s].tolist(), "unit": j} for s, j in pairs],
        "exact_p_one": p_exact,
        "repeats": args.repeats,
        "coupling_check": {"updates": checked, "mismatches": mismatches},
        "by_tolerance": by_tolerance,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--units", type=int, default=10)
    parser.add_argument("--beta", type=float, default=8.0)
    parser.add_argument("--sweeps", type=int, default=4000)
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2])
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    script_start = time.perf_counter()

    patterns = make_patterns(args.rows, args.units, seed=args.seed)
    bias = np.random.default_rng(args.seed + 1).normal(scale=0.5, size=args.units)
    model = boltzmann_model(patterns, beta=args.beta, bias=bias)
    states, probabilities = exact_distribution(model)
    log_p = np.log(probabilities)
    delta = exact_conditionals(log_p, args.units)
    exact_marginals = probabilities @ states
    print(f"exact marginals {np.round(exact_marginals, 3).tolist()}", flush=True)

    runs, steps = [], {}
    exact_draws = None
    for tolerance in [0.0, *args.tolerances]:
        summary, step, draws = chain_run(model, tolerance, args, states, probabilities)
        steps[tolerance] = step
        if tolerance == 0.0:
            exact_draws = draws
        runs.append(summary)
        print(
            f"epsilon {tolerance:g}: {summary['rows_per_update']:9.0f} rows/update "
            f"({100 * summary['rows_per_update_over_n']:.2f}% of N), "
            f"{summary['microseconds_per_update']:7.0f} us/update, marginal error max "
            f"{summary['marginal_max_abs_error']:.4f} mean {summary['marginal_mean_abs_error']:.4f}"
            f", joint L1 {summary['joint_l1']:.3f}, clique-5 L1 "
            f"{summary[f'clique{CLIQUE_SIZE}_mean_l1']:.3f}",
            flush=True,
        )
    baseline = runs[0]
    for run in runs:
        run["rows_ratio_to_exact"] = run["rows_per_update"] / baseline["rows_per_update"]
        run["time_ratio_to_exact"] = (
            run["microseconds_per_update"] / baseline["microseconds_per_update"]
        )

    assert exact_draws is not None
    visited = np.unique(state_index(exact_draws))
    pairs = choose_pairs(visited, delta, args.pairs, np.random.default_rng(args.seed + 2))
    conditional = conditional_errors(steps, pairs, states, delta, args)
    for run in runs[1:]:
        entry = conditional["by_tolerance"][f"{run['error_tolerance']:g}"]
        run["conditional_max_abs_error"] = entry["max_abs_error_coupled"]

    write_json(
        "gibbs_dense",
        {
            "rows": args.rows,
            "units": args.units,
            "beta": args.beta,
            "bias": bias.tolist(),
            "batch_size": args.batch_size,
            "sweeps": args.sweeps,
            "order": "random",
            "exact_marginals": exact_marginals.tolist(),
            "largest_state_probability": float(probabilities.max()),
            "paper": PAPER,
            "runs": runs,
            "conditional_probability": conditional,
            "script_seconds": time.perf_counter() - script_start,
        },
    )


if __name__ == "__main__":
    main()

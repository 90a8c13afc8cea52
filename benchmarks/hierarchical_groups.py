"""The default steps against nutpie on tall hierarchies with many uneven groups (issue 35).

Four synthetic models, generated with fixed seeds in the style of PyMC's example gallery
(``coords``/``dims``, ``pm.Data`` for the group index and the covariates); group sizes are
uneven (Dirichlet(0.7) shares, every group at least one row):

- ``noncentred_logistic_1000``: 1,000 groups, 1,000,000 rows, 4 fixed effects ``beta``,
  ``a = mu + sigma * z`` (``z ~ Normal(0, 1)`` per group, ``mu ~ Normal(0, 2)``,
  ``sigma ~ HalfNormal(2)``), ``Bernoulli(logit_p=a[g] + X @ beta)``: 1,006 parameters;
- ``noncentred_logistic_200``: the same with 200 groups and 200,000 rows: 206 parameters;
- ``centred_poisson``: 100 groups, 100,000 rows, centred varying intercepts and slopes
  (``a ~ Normal(mu_a, sd_a)``, ``b ~ Normal(mu_b, sd_b)``), ``Poisson(exp(a[g] + b[g] * x))``:
  204 parameters;
- ``crossed_normal``: two crossed factors (100 and 30 levels), 200,000 rows, centred Normal
  effects with HalfNormal scales, an intercept, one covariate and a Normal likelihood with
  HalfNormal noise: 135 parameters.

Samplers, each in a fresh process on the same data: nutpie through
``pm.sample(nuts_sampler="nutpie")``, 2 chains of 1,000 tuning + 1,000 draws (``--nutpie-draws
MODEL=TUNE:DRAWS`` shortens them on a model); ``pms.AusterityMH()`` and ``pms.MinibatchBarkerMH()``
with no arguments, 2 chains of 1,000 + 2,000 (on these models both build ``pms.GroupEffectsMH`` with
their test: one test per group on its own rows, the hyperparameters moved with the groups'
parameters held), and ``one_block``, ``pms.AusterityMH(group_effects=False)``, the one-block step
they were before (``--samplers`` picks among the three); all with ``cores=1`` (one chain after the
other). The accuracy reference is a longer nutpie run (sampler ``reference``: 2 chains of 1,000 +
3,000, another seed) on every model but those named by ``--no-reference`` (default
``noncentred_logistic_1000``, too slow to run twice), where it is the nutpie run itself, so that
nutpie's own error there is zero by construction (the JSON's ``models`` entry says which). On
``crossed_normal`` (``--low-rank-reference``) the reference adapts nutpie's low-rank mass matrix:
with the diagonal one its min ESS was 25 in 6,000 draws.

Before the timed runs, an untimed run of both group steps on a small model fills this
package's Numba cache (its compiled kernels are cached beside their source, so a fresh
checkout compiles them once, about 5 s; ``--no-warm-up`` skips it, and ``warm_up_seconds`` in
each model's entry says what it took): the timed runs are a user's second session, as
PyTensor's cache of the model's functions already is. The first session is
``benchmarks/first_build.py``'s.

Reported per run: set-up seconds (building the step; for nutpie, ``pm.sample``'s time outside
``nutpie.sample``: compiling the model), wall seconds including set-up, min bulk ESS over every
free parameter and min-ESS per wall second, its ratio to nutpie's, max |mean - reference mean| in
reference sds (and their median and 90th percentile, and ``monte_carlo_error_sd_at_min_ess``, the
sd of one parameter's error from Monte Carlo noise alone at both runs' smallest ESS) and max |sd /
reference sd - 1| over every free parameter (hyperparameters included), the same per variable
(deterministics such as the non-centred ``a`` included), rows per draw (stat ``n_data``), gradient
rows per draw (``n_grad_rows``), leapfrog steps (``n_steps``), acceptance, the step's ``repr``, the
``SubsampleWarning`` messages, the load average before and after the run (other work shares the
machine), and an error's text where a run failed or ran past ``--timeout`` (the benchmark goes on).

Cost: nutpie's numba gradient of the logistic models takes about 130 ns a row on a loaded
2-core machine (``X @ beta`` and the Bernoulli log-density; the Poisson and Normal models about
5 ns), so nutpie on ``noncentred_logistic_1000`` takes about 3 s an iteration (one chain of
150 + 100 took 742 s; the default 2 x 2,000 would take over 3 hours) and on
``noncentred_logistic_200`` about 0.6 s. ``results/hierarchical_groups.json`` holds (see its
``models`` entries) runs from three commits. On the latest two (a group step's later sweeps
starting from the last sweep's parts; the second changed nothing the benchmark runs):
``--models centred_poisson --timeout 1200`` (4 minutes, nutpie, its reference and the one-block
step included; its entry's ``note`` compares the commit before, rerun the same day), ``--models
crossed_normal --timeout 1200`` (3 minutes) and ``--models noncentred_logistic_200
--nutpie-draws noncentred_logistic_200=150:150 --exact-reference noncentred_logistic_200`` (13
minutes, the exact reference 9 of them). On an earlier commit: ``--models
noncentred_logistic_1000 --samplers austerity barker --nutpie-draws
noncentred_logistic_1000=100:100 --exact-reference noncentred_logistic_1000 --reuse
nutpie=FILE exact=FILE``, whose reused runs are JSON lines that ``--child`` processes printed
on a commit before it: the exact group step's (41 minutes at 1e6 rows, 2 x (400 + 1,500))
and nutpie's (2 x (100 + 100), 509 s). ``--quick``
is a smoke test (groups / 10, rows / 50, short chains; about 5 minutes for the four models). Writes
``results/hierarchical_groups.json`` (``--quick``: ``results/hierarchical_groups_quick.json``);
models not run keep their earlier results there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import arviz as az
import numpy as np
import pymc as pm
from common import RESULTS, write_json

import pymc_subsample as pms

#: Model name: (groups per factor, rows) of the full run (``--quick``: see ``build``).
MODELS: dict[str, tuple[tuple[int, ...], int]] = {
    "noncentred_logistic_1000": ((1000,), 1_000_000),
    "noncentred_logistic_200": ((200,), 200_000),
    "centred_poisson": ((100,), 100_000),
    "crossed_normal": ((100, 30), 200_000),
}
SAMPLERS = ("nutpie", "austerity", "barker", "one_block", "reference", "exact")
#: Sampler: (tune, draws) per chain of the full run and of ``--quick``.
DRAWS = {
    "nutpie": ((1000, 1000), (100, 100)),
    "austerity": ((1000, 2000), (100, 200)),
    "barker": ((1000, 2000), (100, 200)),
    "one_block": ((1000, 2000), (100, 200)),
    "reference": ((1000, 3000), (100, 300)),
    "exact": ((1000, 3000), (100, 300)),
}
SEEDS = {"nutpie": 1, "austerity": 1, "barker": 1, "one_block": 1, "reference": 2, "exact": 2}
#: The steps each sampler builds, with no other argument.
STEPS = {
    "austerity": lambda: pms.AusterityMH(),
    "barker": lambda: pms.MinibatchBarkerMH(),
    "one_block": lambda: pms.AusterityMH(group_effects=False),
    # The exact reference: every decision on all the group's (or all N) rows.
    "exact": lambda: pms.GroupEffectsMH(error_tolerance=0.0),
}
#: Models whose accuracy reference is the exact group step (``exact``) rather than nutpie,
#: where nutpie cannot run long enough (``--exact-reference``). None by default: on
#: ``noncentred_logistic_1000`` it reads every row about twice per draw (0.3 to 0.6 s), too
#: slow for the benchmark's hour.
EXACT_REFERENCE: tuple[str, ...] = ()
#: The model too slow for a second, longer nutpie run: its nutpie run is the reference.
NO_REFERENCE_RUN = "noncentred_logistic_1000"
#: Models whose reference run adapts nutpie's low-rank mass matrix: with the default diagonal
#: one, nutpie mixes slowly along the intercept and the crossed effects' common shift (min ESS
#: about 25 in 6,000 draws), too slowly for a reference.
LOW_RANK_REFERENCE = ("crossed_normal",)
CHILD_TIMEOUT_S = 3600


def group_index(n_groups: int, n_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Each row's group: every group once, the rest by Dirichlet(0.7) shares, shuffled."""
    shares = rng.dirichlet(np.full(n_groups, 0.7))
    rest = rng.choice(n_groups, size=n_rows - n_groups, p=shares)
    group = np.concatenate([np.arange(n_groups), rest])
    rng.shuffle(group)
    return group


def noncentred_logistic(n_groups: int, n_rows: int) -> pm.Model:
    """Non-centred varying intercepts and 4 shared coefficients, Bernoulli rows (seed 0)."""
    rng = np.random.default_rng(0)
    group = group_index(n_groups, n_rows, rng)
    X = rng.normal(size=(n_rows, 4))
    a_true = -0.3 + 0.8 * rng.normal(size=n_groups)
    eta = a_true[group] + X @ rng.normal(0.0, 0.5, 4)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-eta)))
    coords = {"group": np.arange(n_groups), "feature": np.arange(4), "obs": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        g = pm.Data("group_idx", group, dims="obs")
        features = pm.Data("X", X, dims=("obs", "feature"))
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        a = pm.Deterministic("a", mu + sigma * z, dims="group")
        beta = pm.Normal("beta", 0.0, 1.0, dims="feature")
        pm.Bernoulli("y", logit_p=a[g] + features @ beta, observed=y, dims="obs")
    return model


def centred_poisson(n_groups: int, n_rows: int) -> pm.Model:
    """Centred varying intercepts and slopes on a log link, Poisson counts (seed 0)."""
    rng = np.random.default_rng(0)
    group = group_index(n_groups, n_rows, rng)
    x = rng.normal(0.0, 1.0, n_rows)
    a_true = 1.0 + 0.5 * rng.normal(size=n_groups)
    b_true = 0.3 + 0.2 * rng.normal(size=n_groups)
    y = rng.poisson(np.exp(a_true[group] + b_true[group] * x))
    coords = {"group": np.arange(n_groups), "obs": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        g = pm.Data("group_idx", group, dims="obs")
        covariate = pm.Data("x", x, dims="obs")
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        mu_b = pm.Normal("mu_b", 0.0, 1.0)
        sd_a = pm.HalfNormal("sd_a", 1.0)
        sd_b = pm.HalfNormal("sd_b", 1.0)
        a = pm.Normal("a", mu_a, sd_a, dims="group")
        b = pm.Normal("b", mu_b, sd_b, dims="group")
        pm.Poisson("y", pm.math.exp(a[g] + b[g] * covariate), observed=y, dims="obs")
    return model


def crossed_normal(n_first: int, n_second: int, n_rows: int) -> pm.Model:
    """Two crossed factors with centred Normal effects, one covariate, Normal rows (seed 0)."""
    rng = np.random.default_rng(0)
    first = group_index(n_first, n_rows, rng)
    second = group_index(n_second, n_rows, rng)
    x = rng.normal(0.0, 1.0, n_rows)
    u_true = 0.5 * rng.normal(size=n_first)
    v_true = 0.3 * rng.normal(size=n_second)
    y = 1.0 + u_true[first] + v_true[second] + 0.4 * x + rng.normal(0.0, 1.0, n_rows)
    coords = {"site": np.arange(n_first), "year": np.arange(n_second), "obs": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        site = pm.Data("site_idx", first, dims="obs")
        year = pm.Data("year_idx", second, dims="obs")
        covariate = pm.Data("x", x, dims="obs")
        intercept = pm.Normal("intercept", 0.0, 5.0)
        slope = pm.Normal("slope", 0.0, 1.0)
        sd_site = pm.HalfNormal("sd_site", 1.0)
        sd_year = pm.HalfNormal("sd_year", 1.0)
        u = pm.Normal("u", 0.0, sd_site, dims="site")
        v = pm.Normal("v", 0.0, sd_year, dims="year")
        sigma = pm.HalfNormal("sigma", 2.0)
        mean = intercept + u[site] + v[year] + slope * covariate
        pm.Normal("y", mean, sigma, observed=y, dims="obs")
    return model


def sizes(name: str, quick: bool) -> tuple[tuple[int, ...], int]:
    """Groups per factor and rows; ``--quick`` divides the groups by 10 and the rows by 50."""
    groups, rows = MODELS[name]
    if quick:
        return tuple(max(3, n // 10) for n in groups), rows // 50
    return groups, rows


def build(name: str, quick: bool) -> pm.Model:
    groups, rows = sizes(name, quick)
    if name.startswith("noncentred_logistic"):
        return noncentred_logistic(groups[0], rows)
    if name == "centred_poisson":
        return centred_poisson(groups[0], rows)
    return crossed_normal(groups[0], groups[1], rows)


def nutpie_draws(specs: list[str]) -> dict[str, tuple[int, int]]:
    """``--nutpie-draws MODEL=TUNE:DRAWS`` as {model: (tune, draws)}."""
    out = {}
    for spec in specs:
        name, _, counts = spec.partition("=")
        tune, _, draws = counts.partition(":")
        out[name] = (int(tune), int(draws))
    return out


def summaries(idata: Any, names: list[str]) -> dict[str, dict[str, list[float]]]:
    """Each variable's posterior means and sds, flattened."""
    posterior = idata.posterior
    out: dict[str, dict[str, list[float]]] = {"mean": {}, "sd": {}}
    for name in names:
        values = posterior[name].values
        values = values.reshape(values.shape[0] * values.shape[1], -1)
        out["mean"][name] = values.mean(0).tolist()
        out["sd"][name] = values.std(0, ddof=1).tolist()
    return out


def run_one(
    model_name: str, sampler: str, quick: bool, tune: int, draws: int, adaptation: str | None
) -> dict[str, Any]:
    """Build and run one sampler in this process; return its measurements and summaries.

    ``adaptation`` is nutpie's mass-matrix adaptation (its default, ``"diag"``, where None).
    """
    model = build(model_name, quick)
    free = [rv.name for rv in model.free_RVs]
    deterministic = [rv.name for rv in model.deterministics]
    kwargs = {"tune": tune, "draws": draws, "chains": 2, "cores": 1, "random_seed": SEEDS[sampler]}
    kwargs.update(progressbar=False, compute_convergence_checks=False)
    stats: dict[str, Any] = {}
    start = time.perf_counter()
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pms.SubsampleWarning)
        if sampler in ("nutpie", "reference"):
            nuts = {} if adaptation is None else {"adaptation": adaptation}
            idata = pm.sample(nuts_sampler="nutpie", nuts=nuts, **kwargs)
            wall = time.perf_counter() - start
            setup = wall - float(idata.posterior.attrs["sampling_time"])
            sample_stats = idata.sample_stats
            stats = {
                "n_steps": float(sample_stats["n_steps"].mean()),
                "acceptance": float(sample_stats["mean_tree_accept"].mean()),
                "divergences": int(sample_stats["diverging"].sum()),
                "step_size": float(sample_stats["step_size"].mean()),
            }
        else:
            step = STEPS[sampler]()
            setup = time.perf_counter() - start
            idata = pm.sample(step=step, **kwargs)
            wall = time.perf_counter() - start
            sample_stats = idata.sample_stats
            stats = {
                "step": type(step).__name__,
                "rows_per_draw": float(sample_stats["n_data"].mean()),
            }
            if isinstance(step, pms.GroupEffectsMH):  # the defaults' group route
                stats |= {
                    "test": step.test.kind,
                    "groups_read_whole": float(sample_stats["n_full_groups"].mean()),
                    "acceptance": float(sample_stats["accept_rate"].mean()),
                    "hyper_acceptance": float(sample_stats["hyper_accept_rate"].mean()),
                    "shared_rows_per_draw": float(sample_stats["shared_n_data"].mean()),
                }
            else:
                stats |= {
                    "repr": repr(step),
                    "grad_rows_per_draw": float(sample_stats["n_grad_rows"].mean()),
                    "n_steps": float(sample_stats["n_steps"].mean()),
                    "acceptance": float(sample_stats["accepted"].mean()),
                    "divergences": int(sample_stats["diverging"].sum()),
                    "step_size": float(sample_stats["scaling"][:, -1].mean()),
                }
    ess = az.ess(idata, var_names=free)
    min_ess = min(float(np.min(ess[name].values)) for name in free)
    return {
        "model": model_name,
        "sampler": sampler,
        "rows": int(np.asarray(model.rvs_to_values[model.observed_RVs[0]].data).shape[0]),
        "n_params": int(sum(np.size(value) for value in model.initial_point().values())),
        "tune": tune,
        "draws": draws,
        "setup_seconds": setup,
        "wall_seconds": wall,
        "min_ess": min_ess,
        "min_ess_per_second": min_ess / wall,
        **stats,
        "warnings": [
            str(w.message) for w in caught if issubclass(w.category, pms.SubsampleWarning)
        ],
        "free": free,
        **summaries(idata, free + deterministic),
    }


def compare(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Mean errors in reference sds and sd ratios: the max over free parameters, per variable."""
    per_variable: dict[str, dict[str, float]] = {}
    errors, ratios = [], []
    for name, mean in reference["mean"].items():
        sd = np.asarray(reference["sd"][name])
        error = np.abs(np.asarray(run["mean"][name]) - np.asarray(mean)) / sd
        ratio = np.abs(np.asarray(run["sd"][name]) / sd - 1.0)
        per_variable[name] = {"mean_error_sd": float(error.max()), "sd_error": float(ratio.max())}
        if name in reference["free"]:
            errors.append(error)
            ratios.append(ratio)
    all_errors = np.concatenate(errors)
    # The sd of one parameter's mean difference from Monte Carlo error alone, at both runs'
    # smallest ESS (most parameters mix better): over P parameters the largest error from
    # noise alone is about Phi^-1(1 - 1 / (2 P)) times this (3.3 at P = 1,000).
    noise = float(np.sqrt(1.0 / run["min_ess"] + 1.0 / reference["min_ess"]))
    return {
        "max_abs_mean_error_sd": float(all_errors.max()),
        "median_abs_mean_error_sd": float(np.median(all_errors)),
        "p90_abs_mean_error_sd": float(np.quantile(all_errors, 0.9)),
        "monte_carlo_error_sd_at_min_ess": noise,
        "max_abs_sd_ratio_error": float(np.concatenate(ratios).max()),
        "per_variable": per_variable,
    }


def _run_child(
    model_name: str, sampler: str, counts: tuple[int, int], args: argparse.Namespace
) -> dict[str, Any]:
    """Run one sampler in a fresh process; its JSON, or the error's text (ours may fail)."""
    command = [sys.executable, str(Path(__file__)), "--child", model_name, sampler]
    command += ["--tune", str(counts[0]), "--draws", str(counts[1])]
    command += ["--quick"] if args.quick else []
    if sampler == "reference" and model_name in args.low_rank_reference:
        command += ["--adaptation", "low_rank"]
    load_before = os.getloadavg()
    begin = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=args.timeout
        )
        error = None if done.returncode == 0 else done.stderr[-3000:]
    except subprocess.TimeoutExpired:
        error = f"timed out after {args.timeout} s"
    load = {"load_before": list(load_before), "load_after": list(os.getloadavg())}
    if error is not None:
        run = {"model": model_name, "sampler": sampler, "tune": counts[0], "draws": counts[1]}
        run.update(error=error, wall_seconds=time.perf_counter() - begin)
        print(model_name, sampler, "FAILED", error, flush=True)
        return {**run, **load}
    run = {**json.loads(done.stdout.strip().splitlines()[-1]), **load}
    shown = ("mean", "sd", "free", "warnings", "per_variable")
    print(model_name, sampler, {k: v for k, v in run.items() if k not in shown}, flush=True)
    return run


def warm_numba_caches(args: argparse.Namespace) -> float:
    """Run both group steps once on a small model, untimed; return the seconds it took.

    The group steps' compiled kernels (``kernels/fused_groups.py``, ``kernels/group_newton.py``)
    are cached on disk by Numba beside their source, so a fresh checkout compiles them at its
    first sampling (about 5 s on this machine), once; PyTensor's cache of the models' own
    functions lives in the user's home and is warm from any earlier run. This run puts both
    caches in the state of a user's second session, which the timed runs then measure; the
    first session's cost is measured by ``benchmarks/first_build.py``.
    """
    begin = time.perf_counter()
    for sampler in ("austerity", "barker"):
        command = [sys.executable, str(Path(__file__)), "--child", "centred_poisson", sampler]
        command += ["--quick", "--tune", "30", "--draws", "30"]
        subprocess.run(command, capture_output=True, check=False, timeout=args.timeout)
    return time.perf_counter() - begin


def run_model(model_name: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    """Every sampler on one model; the model's settings and the runs' summaries."""
    begin = time.perf_counter()
    counts = {sampler: DRAWS[sampler][int(args.quick)] for sampler in SAMPLERS}
    counts["nutpie"] = nutpie_draws(args.nutpie_draws).get(model_name, counts["nutpie"])
    long_reference = model_name not in args.no_reference
    exact_reference = model_name in args.exact_reference
    samplers = ["nutpie", *(s for s in SAMPLERS if s in args.samplers)]
    if exact_reference:
        samplers.append("exact")
    elif long_reference:
        samplers.append("reference")
    reused = dict(spec.split("=", 1) for spec in args.reuse)
    runs = {
        sampler: json.loads(Path(reused[sampler]).read_text().strip().splitlines()[-1])
        if sampler in reused
        else _run_child(model_name, sampler, counts[sampler], args)
        for sampler in samplers
    }
    reference = runs["exact" if exact_reference else "reference" if long_reference else "nutpie"]
    nutpie = runs["nutpie"]
    summaries = []
    for sampler, run in runs.items():
        summary = {k: v for k, v in run.items() if k not in ("mean", "sd", "free")}
        if sampler in reused:
            summary["reused_from"] = "an earlier process of this benchmark (--reuse)"
        # The means and sds of the variables of at most 10 entries (the gallery compares them).
        for moment in ("mean", "sd"):
            if moment in run:
                summary[f"small_{moment}"] = {
                    name: values for name, values in run[moment].items() if len(values) <= 10
                }
        if "error" not in run and "error" not in nutpie:
            summary["ratio_to_nutpie"] = run["min_ess_per_second"] / nutpie["min_ess_per_second"]
        if (
            "error" not in run
            and "error" not in reference
            and sampler not in ("reference", "exact")
        ):
            summary.update(compare(run, reference))
        summaries.append(summary)
    groups, rows = sizes(model_name, args.quick)
    settings = {
        "groups": list(groups),
        "rows": rows,
        "tune_draws": {
            sampler: [runs[sampler]["tune"], runs[sampler]["draws"]]
            if sampler in reused
            else list(counts[sampler])
            for sampler in samplers
        },
        "reference": (
            "the exact group step, pms.GroupEffectsMH(error_tolerance=0.0), every decision on "
            "all the rows it concerns (sampler 'exact', another seed): Metropolis-within-Gibbs "
            "with the same moves, so it checks the subsampled tests' error, not the moves"
            if exact_reference
            else "nutpie, a longer run with another seed (sampler 'reference'), "
            + (
                "with its low-rank mass-matrix adaptation"
                if model_name in args.low_rank_reference
                else "with its default diagonal mass matrix"
            )
            if long_reference
            else "the nutpie run itself (no second, longer run): nutpie's errors are 0 by "
            "construction and the others' include its Monte Carlo error"
        ),
        # This process's time: runs taken from files (--reuse) cost it nothing.
        "seconds": time.perf_counter() - begin,
        "reused": sorted(reused),
    }
    return settings, summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--quick", action="store_true", help="groups / 10, rows / 50, short chains (smoke test)"
    )
    parser.add_argument(
        "--nutpie-draws",
        nargs="+",
        default=[],
        metavar="MODEL=TUNE:DRAWS",
        help="nutpie's tuning and draws per chain on a model (default 1000:1000)",
    )
    parser.add_argument(
        "--no-reference",
        nargs="+",
        default=[NO_REFERENCE_RUN],
        metavar="MODEL",
        help=f"models whose reference is the nutpie run (default {NO_REFERENCE_RUN})",
    )
    parser.add_argument(
        "--low-rank-reference",
        nargs="*",
        default=list(LOW_RANK_REFERENCE),
        metavar="MODEL",
        help="models whose reference run adapts nutpie's low-rank mass matrix "
        f"(default {' '.join(LOW_RANK_REFERENCE)})",
    )
    parser.add_argument(
        "--exact-reference",
        nargs="*",
        default=list(EXACT_REFERENCE),
        metavar="MODEL",
        help="models whose reference is the exact group step (default "
        f"{' '.join(EXACT_REFERENCE)})",
    )
    parser.add_argument(
        "--samplers",
        nargs="+",
        choices=[s for s in SAMPLERS if s not in ("nutpie", "reference", "exact")],
        default=[s for s in SAMPLERS if s not in ("nutpie", "reference", "exact")],
        help="our samplers to run beside nutpie (and the reference run)",
    )
    parser.add_argument(
        "--reuse",
        nargs="*",
        default=[],
        metavar="SAMPLER=FILE",
        help="take a sampler's run from FILE (the JSON line a --child run printed)",
    )
    parser.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S, help="s per run")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the untimed first run that fills this package's Numba cache",
    )
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "SAMPLER"), help=argparse.SUPPRESS)
    parser.add_argument("--tune", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--draws", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--adaptation", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child = args.child
        run = run_one(child[0], child[1], args.quick, args.tune, args.draws, args.adaptation)
        print(json.dumps(run))
        return
    name = "hierarchical_groups_quick" if args.quick else "hierarchical_groups"
    # Models not run this time keep their results from an earlier run (--models on a part).
    path = RESULTS / f"{name}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {"models": {}, "runs": []}
    models = {k: v for k, v in earlier["models"].items() if k not in args.models}
    runs = [run for run in earlier["runs"] if run["model"] not in args.models]
    warm_up = warm_numba_caches(args) if args.warm_up else None
    for model_name in args.models:
        models[model_name], summaries = run_model(model_name, args)
        models[model_name]["warm_up_seconds"] = warm_up
        runs += summaries
    order = list(MODELS)
    payload = {
        "quick": args.quick,
        "cpu_count": os.cpu_count(),
        "models": {k: models[k] for k in order if k in models},
        "runs": sorted(runs, key=lambda run: order.index(run["model"])),
    }
    write_json(name, payload)


if __name__ == "__main__":
    main()

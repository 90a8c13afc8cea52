"""A user's first build: ``AusterityMH()`` against NUTS's set-up, cold and warm caches (issue 37).

Three models a new user brings, each at ``--rows`` rows (default 1e5 and 1e6), generated with
fixed seeds:

- ``glm``: logistic regression, 10 coefficients (``common.logistic_model``);
- ``student_t``: a Student-t regression with free ``nu``, 5 coefficients and a free scale;
- ``hierarchy``: a non-centred hierarchical logistic regression written with ``coords``/``dims``
  and ``pm.Data``, ``--groups`` groups (default 200) whose shares follow Dirichlet(0.7) (from a
  handful of rows to thousands), 4 fixed effects. ``AusterityMH()`` builds the group step
  there (``pms.GroupEffectsMH``), which compiles its functions at its first draw.

Each measurement runs in a fresh process with its own PyTensor compile directory and Numba
cache directory. "Cold" is the first process on an empty pair (a first model after installing);
"warm" a second process on the same directories (every run after it). Per process:
``setup_seconds`` is the time to build the sampler after the model is built: for ours,
``pms.AusterityMH()``; for NUTS, ``pm.NUTS()`` and one full-data evaluation of the log density
and its gradient (what NUTS pays before its first draw, as ``setup_cost.py`` measures it).
``first_draw_seconds`` is ours' first draw after it: ``pm.sample`` of one draw without tuning,
from its call to the moment its ``callback`` reports the draw made (PyMC's own set-up of a run
included; ``sample_call_seconds`` is the whole call, which then makes the InferenceData, about
0.5 s more, and was the first draw's time in runs before 2026-11-30). Where a step compiles at
its first draw (the fused draw, the group step's functions), that is part of what the user waits
for before sampling, so ``ratio_to_first_draw`` compares their sum with NUTS's set-up.
``pm.sample`` builds the trace before either's first draw (its point function compiles: cold,
1-2 s on the hierarchy), which ours' first draw includes and NUTS's set-up does not:
``trace_seconds`` times the same ``init_traces`` call after NUTS's set-up, and
``ratio_to_sampling`` compares ours' set-up and first draw with NUTS's set-up and trace, each up
to where its sampler starts drawing.
Both include starting PyTensor's Numba backend, which the first compile of a process pays.
"New model" runs on caches that a process building two small Poisson models (sharing no graph
with these) filled first: what a user's second model meets, the package's own Numba kernels
and PyTensor's per-operation code cached, the model's graphs not.
Reported: the seconds, ``ratio`` (ours over NUTS's, per state), the proposal, control
variate and expansion the step chose, and the compile time of each of the step's compiled
functions at its first call and at the call that compiles it (``first_calls``: which graphs
cost the build; with ``compiled.INTERPRETED_SECONDS`` above 0 the set-up's functions run on
PyTensor's Python linker first, and the first call and the compiling one differ).

Run ``python benchmarks/first_build.py`` (``--rows 100000``: about 12 minutes on 2 cores,
``--rows 1000000`` about 15); ``--models hierarchy`` for a part. ``--cold-pairs K`` adds K cold
builds of ours and NUTS's, one after the other, per case (``cold_pairs``: each pair's seconds and
ratio, and their median; ``ratios_to_sampling`` likewise), since one cold ratio moves by about
0.4 from run to run on a shared machine. Writes ``results/first_build.json`` after each case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np
from common import RESULTS, child_json, logistic_data, logistic_model, nuts_setup, write_json

MODELS = ("glm", "student_t", "hierarchy")
#: Models built before a "new model" run on the same caches, sharing no graph with the
#: benchmark's models (a Poisson likelihood): what a user's second model finds cached.
PREWARM = ("poisson_glm", "poisson_hierarchy")
STATES = ("cold", "new_model", "warm")
SAMPLERS = ("austerity", "nuts")
N_GROUPS = 200


def build_model(name: str, n_rows: int, n_groups: int = N_GROUPS) -> Any:
    """The model ``name`` on ``n_rows`` rows of its synthetic data (fixed seeds)."""
    import pymc as pm

    rng = np.random.default_rng(0)
    if name.startswith("poisson"):
        return _poisson_model(rng, n_rows, n_groups if name.endswith("hierarchy") else 0)
    if name == "glm":
        return logistic_model(*logistic_data(n_rows, 10))
    if name == "student_t":
        X = rng.normal(size=(n_rows, 5))
        y = X @ rng.normal(size=5) + 0.5 * rng.standard_t(4.0, size=n_rows)
        with pm.Model() as model:
            beta = pm.Normal("beta", 0.0, 5.0, shape=5)
            scale = pm.HalfNormal("scale", 2.0)
            nu = pm.Gamma("nu", 2.0, 0.1)
            pm.StudentT("y", nu=nu, mu=X @ beta, sigma=scale, observed=y)
        return model
    shares = rng.dirichlet(np.full(n_groups, 0.7))
    group = rng.choice(n_groups, size=n_rows, p=shares)
    X = rng.normal(size=(n_rows, 4))
    eta = rng.normal(0.0, 0.8, n_groups)[group] + X @ rng.normal(0.0, 0.5, 4)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-eta)))
    coords = {"group": np.arange(n_groups), "feature": np.arange(4), "obs": np.arange(n_rows)}
    with pm.Model(coords=coords) as model:
        features = pm.Data("X", X, dims=("obs", "feature"))
        group_index = pm.Data("group_index", group, dims="obs")
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        effect = pm.Deterministic("effect", mu + sigma * z, dims="group")
        b = pm.Normal("b", 0.0, 1.0, dims="feature")
        pm.Bernoulli("y", logit_p=effect[group_index] + features @ b, observed=y, dims="obs")
    return model


def _poisson_model(rng: np.random.Generator, n_rows: int, n_groups: int) -> Any:
    """A Poisson regression, with varying intercepts where ``n_groups`` is positive."""
    import pymc as pm

    X = rng.normal(size=(n_rows, 3))
    group = rng.integers(0, max(n_groups, 1), size=n_rows)
    y = rng.poisson(np.exp(0.5 + 0.2 * X[:, 0]))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        eta = X @ b
        if n_groups:
            scale = pm.HalfNormal("scale", 1.0)
            a = pm.Normal("a", 0.0, scale, shape=n_groups)
            eta = eta + a[group]
        pm.Poisson("y", mu=pm.math.exp(eta), observed=y)
    return model


def _record_first_calls() -> list[tuple[str, float]]:
    """Time each of the step's functions at its first call and at the call that compiles it.

    A function runs on PyTensor's Python linker first (``model/compiled.py``): its first call
    builds it (rewrites, no compile), and a later call may compile it ("name compiled").
    """
    from pymc_subsample.model import compiled

    calls: list[tuple[str, float]] = []
    original = compiled.LazyFunction.__call__

    def timed(self: Any, *args: Any) -> Any:
        if self.compiled:
            return original(self, *args)
        built = self.built
        start = time.perf_counter()
        out = original(self, *args)
        if built and not self.compiled:
            return out
        builder = getattr(self._build, "func", self._build)
        name = getattr(builder, "__name__", repr(builder))
        calls.append((name + (" compiled" if self.compiled else ""), time.perf_counter() - start))
        return out

    compiled.LazyFunction.__call__ = timed  # type: ignore[method-assign]
    return calls


def child(model_name: str, sampler: str, n_rows: int, n_groups: int) -> dict[str, Any]:
    """Build one sampler on one model in this (fresh) process; return its timings."""
    import pymc as pm

    import pymc_subsample as pms

    calls = _record_first_calls()
    model = build_model(model_name, n_rows, n_groups)
    with model:
        model.initial_point()
    result: dict[str, Any] = {}
    start = time.perf_counter()
    with model:
        if sampler == "nuts":
            nuts = nuts_setup(model)
            result["setup_seconds"] = time.perf_counter() - start
            # What pm.sample then builds before NUTS's first draw, as before ours': the
            # trace, whose point function compiles (the model's deterministics).
            initial_point = model.initial_point()
            traced = time.perf_counter()
            pm.backends.init_traces(
                backend=None, chains=1, expected_length=1, step=nuts,
                initial_point=initial_point, model=model,
            )  # fmt: skip
            result["trace_seconds"] = time.perf_counter() - traced
        else:
            step = pms.AusterityMH()
            result["setup_seconds"] = time.perf_counter() - start
            result["step"] = type(step).__name__
            if isinstance(step, pms.SubsampleMH):
                result.update(
                    proposal=step.proposal_kind,
                    control_variate=step.control_variate,
                    expansion=step.oracles.expansion,
                    draw_path=step.draw_path,
                )
            drawn: list[float] = []
            first = time.perf_counter()
            pm.sample(
                draws=1, tune=0, chains=1, step=step, progressbar=False,
                compute_convergence_checks=False, random_seed=1,
                callback=lambda **_: drawn.append(time.perf_counter()),
            )  # fmt: skip
            # Up to the first draw made (pm.sample's callback), as NUTS's side stops where
            # its sampler starts drawing; the whole call also makes the InferenceData.
            result["first_draw_seconds"] = drawn[0] - first
            result["sample_call_seconds"] = time.perf_counter() - first
    result["first_calls"] = {name: round(seconds, 2) for name, seconds in calls}
    return result


def run_child(
    model_name: str, sampler: str, n_rows: int, n_groups: int, caches: str
) -> dict[str, Any]:
    """Run :func:`child` in a fresh process whose PyTensor and Numba caches are in ``caches``."""
    env = dict(os.environ)
    env["PYTENSOR_FLAGS"] = f"base_compiledir={caches}/pytensor"
    env["NUMBA_CACHE_DIR"] = f"{caches}/numba"
    return child_json(__file__, [model_name, sampler, str(n_rows), str(n_groups)], env)


def measure(model_name: str, n_rows: int, n_groups: int, cold_repeats: int = 0) -> dict[str, Any]:
    """Cold, new-model and warm runs of each sampler, each sampler on caches of its own.

    "new_model" runs on caches that a process building :data:`PREWARM` (small models sharing
    no graph with the benchmark's) filled first: the package's own kernels (and PyTensor's
    per-operation code) cached, the model's graphs not. ``cold_repeats`` more cold builds of
    each, in pairs (:func:`_cold_pairs`).
    """
    runs: dict[str, Any] = {}
    for sampler in SAMPLERS:
        results: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as caches:
            results["cold"] = run_child(model_name, sampler, n_rows, n_groups, caches)
            results["warm"] = run_child(model_name, sampler, n_rows, n_groups, caches)
        with tempfile.TemporaryDirectory() as caches:
            for prewarm in PREWARM:
                run_child(prewarm, sampler, 2_000, 20, caches)
            results["new_model"] = run_child(model_name, sampler, n_rows, n_groups, caches)
        runs[sampler] = {state: results[state] for state in STATES}
        print(
            f"{model_name} N={n_rows:,} {sampler}: "
            + ", ".join(f"{state} {_total(results[state]):.1f} s" for state in STATES),
            flush=True,
        )
    ours, nuts = runs["austerity"], runs["nuts"]
    result: dict[str, Any] = {
        "runs": runs,
        "ratio_to_nuts": {
            state: ours[state]["setup_seconds"] / nuts[state]["setup_seconds"] for state in STATES
        },
        "ratio_to_first_draw": {
            state: _total(ours[state]) / nuts[state]["setup_seconds"] for state in STATES
        },
        "ratio_to_sampling": {
            state: _total(ours[state]) / _until_sampling(nuts[state]) for state in STATES
        },
    }
    if cold_repeats:
        result["cold_pairs"] = _cold_pairs(model_name, n_rows, n_groups, cold_repeats)
    return result


def _cold_pairs(model_name: str, n_rows: int, n_groups: int, pairs: int) -> dict[str, Any]:
    """More cold builds, ours and NUTS's one after the other: the ratio's spread.

    NUTS's cold set-up varies by a quarter from run to run on a shared machine, and the
    ratio with it; each pair runs the two side by side, so a slow spell slows both. Reported:
    each pair's seconds (ours: set-up and first draw) and ratio, and the median ratio.
    """
    seconds: dict[str, list[float]] = {sampler: [] for sampler in (*SAMPLERS, "nuts_sampling")}
    for _ in range(pairs):
        for sampler in SAMPLERS:
            with tempfile.TemporaryDirectory() as caches:
                result = run_child(model_name, sampler, n_rows, n_groups, caches)
            seconds[sampler].append(_total(result))
            if sampler == "nuts":
                seconds["nuts_sampling"].append(_until_sampling(result))
    ours = seconds["austerity"]
    ratios = [a / b for a, b in zip(ours, seconds["nuts"], strict=True)]
    to_sampling = [a / b for a, b in zip(ours, seconds["nuts_sampling"], strict=True)]
    print(
        f"{model_name} N={n_rows:,} cold pairs: "
        + ", ".join(f"{a:.2f}x ({b:.2f}x)" for a, b in zip(ratios, to_sampling, strict=True)),
        flush=True,
    )
    return {
        "seconds": seconds,
        "ratios": ratios,
        "median_ratio": float(np.median(ratios)),
        "ratios_to_sampling": to_sampling,
        "median_ratio_to_sampling": float(np.median(to_sampling)),
    }


def _total(result: dict[str, Any]) -> float:
    """Set-up and first draw (NUTS: its set-up)."""
    return float(result["setup_seconds"] + result.get("first_draw_seconds", 0.0))


def _until_sampling(result: dict[str, Any]) -> float:
    """NUTS's set-up and the trace ``pm.sample`` builds before its first draw."""
    return float(result["setup_seconds"] + result["trace_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--groups", type=int, default=N_GROUPS, help="the hierarchy's groups")
    parser.add_argument(
        "--cold-pairs",
        type=int,
        default=0,
        help="more cold builds of ours and NUTS's, side by side, for the ratio's spread",
    )
    args = parser.parse_args()
    # Cases not run this time keep their results from an earlier run.
    path = RESULTS / "first_build.json"
    results: dict[str, Any] = json.loads(path.read_text())["results"] if path.exists() else {}
    for model_name in args.models:
        for n_rows in args.rows:
            key = f"{model_name}_{n_rows}"
            if model_name == "hierarchy":
                key = f"{model_name}_{args.groups}_groups_{n_rows}"
            results[key] = measure(model_name, n_rows, args.groups, args.cold_pairs)
            # Written after each case: a long run stopped part-way keeps what it measured.
            write_json("first_build", {"results": results})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    else:
        main()

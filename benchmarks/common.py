"""Helpers shared by the benchmark scripts: synthetic data, timing, JSON output."""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm

RESULTS = Path(__file__).parent / "results"


def logistic_data(n_rows: int, n_features: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal features (first column 1) and labels from coefficients of sd 0.5."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_rows), rng.normal(size=(n_rows, n_features - 1))])
    beta = rng.normal(0.0, 0.5, size=n_features)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ beta)))
    return X, y


def logistic_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    return model


def sgld_chain(
    model: pm.Model,
    start: np.ndarray,
    *,
    step_size: float,
    batch_size: int,
    burn_in: int,
    steps: int,
    seed: int,
    clock_offset: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Uncorrected SGLD on the package's per-row gradients (Welling and Teh 2011).

    ``q' = q + (eps/2) g(q) + N(0, eps)`` with ``g`` the minibatch gradient of ``batch_size``
    rows drawn with replacement. Returns the ``steps`` draws after ``burn_in`` and, for each,
    the seconds since the call started plus ``clock_offset`` (compilation included).
    """
    from pymc_subsample.model.oracle_builder import build_oracles

    start_time = time.perf_counter() - clock_offset
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), with_gradients=True
    )
    rng = np.random.default_rng(seed)
    q = np.array(start, dtype=float).ravel()
    draws = np.empty((steps, q.size))
    stamps = np.empty(steps)
    for t in range(burn_in + steps):
        rows = rng.integers(0, oracles.n_rows, size=batch_size)
        gradient = oracles.gradient_on_rows(rows)(q)
        q = q + 0.5 * step_size * gradient + np.sqrt(step_size) * rng.standard_normal(q.size)
        if t >= burn_in:
            draws[t - burn_in] = q
            stamps[t - burn_in] = time.perf_counter() - start_time
    return draws, stamps


def nuts_setup(model: pm.Model) -> pm.NUTS:
    """Build PyMC's NUTS on ``model`` and evaluate its log density and gradient once.

    What NUTS pays before its first draw: compiling both and one full-data evaluation at the
    start (the set-up the benchmarks compare a step's construction with).
    """
    from pymc.blocking import DictToArrayBijection

    with model:
        step = pm.NUTS()
    point = model.initial_point()
    function = step._logp_dlogp_func
    function.set_extra_values({})
    function(DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars}))
    return step


def steps_per_second(step_fn: Callable[[], Any], min_seconds: float = 2.0) -> tuple[float, int]:
    """Call ``step_fn`` repeatedly for at least ``min_seconds``; return (rate, calls)."""
    step_fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds:
        step_fn()
        calls += 1
    return calls / elapsed, calls


def timed_sample(**kwargs: Any) -> tuple[Any, float]:
    """Run ``pm.sample`` quietly (in a model context) and return (result, wall seconds)."""
    start = time.perf_counter()
    idata = pm.sample(progressbar=False, compute_convergence_checks=False, random_seed=1, **kwargs)
    return idata, time.perf_counter() - start


def machine() -> dict[str, Any]:
    import pytensor

    return {
        "python": platform.python_version(),
        "pymc": pm.__version__,
        "pytensor": pytensor.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
    }


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def runs_per_rows(
    script: str, run_rows: Callable[[int], dict[str, Any]], description: str
) -> list[dict[str, Any]] | None:
    """Run ``run_rows(N)`` for each ``--rows`` N, each in its own process (fresh memory).

    The script calls this from ``main``: it parses ``--rows`` (default 1e4 ... 1e7) and runs
    ``script --child N`` for each N, one after another. In that child it prints ``run_rows(N)``
    as JSON and returns None; in the parent it echoes each result and returns them all.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000, 10_000_000]
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_rows(args.child)))
        return None
    runs = []
    for n_rows in args.rows:
        done = subprocess.run(
            [sys.executable, script, "--child", str(n_rows)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1], indent=1), flush=True)
    return runs


def child_json(script: str, arguments: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``script --child *arguments`` in a fresh process; return the JSON of its last line."""
    out = subprocess.run(
        [sys.executable, script, "--child", *arguments],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments)} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run_limited(
    command: list[str], *, timeout_s: float, memory_bytes: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run ``command`` in a child process under a wall-clock and an address-space limit.

    Returns the finished process (stdout and stderr captured as text), or None when it ran
    past ``timeout_s`` and was killed.
    """

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    try:
        return subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            preexec_fn=limit_memory,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None


#: Trace length allocated per chain by :func:`timed_chain`; a chain stops at its budget first.
MAX_DRAWS = 300_000


def timed_chain(
    model: pm.Model,
    step: Any,
    initvals: dict[str, np.ndarray],
    seconds: float,
    seed: int,
    tune: int = 0,
) -> tuple[Any, np.ndarray, bool]:
    """Run one chain until ``seconds`` of wall time after tuning; return (idata, stamps, done).

    ``stamps[k]`` is the wall time of draw k after the end of tuning (after the start of the
    ``pm.sample`` call without tuning). ``done`` says whether the budget, not ``MAX_DRAWS``,
    ended it.
    """
    stamps: list[float] = []
    tuning_end = [0.0]  # wall time of the last tuning draw

    def stop_at_budget(trace: Any, draw: Any) -> None:
        now = time.perf_counter() - begin
        if draw.tuning:
            tuning_end[0] = now
            return
        stamps.append(now - tuning_end[0])
        if stamps[-1] >= seconds:
            raise KeyboardInterrupt  # PyMC's documented way for a callback to stop sampling

    with model:
        begin = time.perf_counter()
        idata = pm.sample(
            step=step,
            tune=tune,
            draws=MAX_DRAWS,
            chains=1,
            cores=1,
            initvals=initvals,
            random_seed=seed,
            callback=stop_at_budget,
            progressbar=False,
            compute_convergence_checks=False,
        )
    return idata, np.array(stamps), stamps[-1] >= seconds


def listed(values: np.ndarray) -> list[float | None]:
    """A JSON list: None where no chain had made a draw yet (NaN)."""
    return [None if math.isnan(v) else float(v) for v in values]


def risk_over_time(estimates: np.ndarray, truth: np.ndarray | float) -> dict[str, Any]:
    """Risk of the chains' running estimates against the truth, at each time and the budget.

    ``estimates`` is (chains, times, ...); the squared error is averaged over any axes after
    the times (the test rows of a predictive mean). Returns the risk (mean over chains), its
    standard error over the chains, the bias^2 of the chains' mean and the variance over the
    chains, each as a JSON list and at the budget (the last time), and the chains' risks at
    the budget.
    """
    trailing = tuple(range(2, estimates.ndim))
    squared_errors = ((estimates - truth) ** 2).mean(axis=trailing)  # chains, times
    risk = squared_errors.mean(axis=0)
    risk_se = squared_errors.std(axis=0, ddof=1) / math.sqrt(estimates.shape[0])
    bias_sq = ((estimates.mean(axis=0) - truth) ** 2).mean(axis=tuple(range(1, estimates.ndim - 1)))
    variance = estimates.var(axis=0).mean(axis=tuple(range(1, estimates.ndim - 1)))
    return {
        "risk": listed(risk),
        "risk_se": listed(risk_se),
        "bias_sq": listed(bias_sq),
        "variance": listed(variance),
        "risk_at_budget": float(risk[-1]),
        "risk_se_at_budget": float(risk_se[-1]),
        "bias_sq_at_budget": float(bias_sq[-1]),
        "variance_at_budget": float(variance[-1]),
        "chain_risks_at_budget": squared_errors[:, -1].tolist(),
    }


def process_status_bytes(field: str) -> int:
    """Return a ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``, ...) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_memory() -> None:
    """Reset the process's peak resident memory (``VmHWM``) to its current value."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")

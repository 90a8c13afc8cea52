"""What one draw costs inside ``pm.sample``, against PyMC's own loop and a hand-written Numba loop.

Issue "A composable sampling core and a fused per-draw kernel": logistic regression with d = 10
coefficients (``common.logistic_data``), the MH steps with the second-order control variate,
batch 100 (the defaults), at N = 1e4 ... 1e7, all in one process per N and side by side:

- ``pymc_loop``: a step that does nothing but return the Austerity step's stats, through the
  same ``pm.sample`` call: the floor of a draw that any PyMC step method pays (the sampling loop,
  the trace's recording of 16 stats, the point's ravel and unravel);
- ``AusterityMH`` and ``MinibatchBarkerMH`` with ``proposal="random_walk"`` (the Laplace
  covariance) and ``proposal="independent"`` (the default on this model), each with its
  fused draw (one compiled call per draw, the default) and with ``fused=False`` (the Python
  path, suffix ``_python``): microseconds per draw inside ``pm.sample(tune=200,
  draws=10_000)`` (``us_per_draw``: the mean interval between the draws after tuning, read
  by a ``callback``; ``median_us_per_draw``; ``wall_us_per_draw``: the call's wall over all its
  draws, its once-per-call set-up and InferenceData included), and the rows those draws read
  (stat ``n_data``: mean and largest);
- ``fused_direct``: the fused draw of ``barker_random_walk`` called in a Python loop without
  ``pm.sample`` (what the step's own draw costs, next to the Numba loop);
- ``numba_loop``: the same arithmetic written by hand in one Numba function (random-walk
  proposal with the Laplace factor, Gaussian prior ratio, 100 rows drawn, their second-order
  residuals from the reference's per-row terms, the batch's mean and standard error, the t
  statistic against a precomputed critical value, the accept), over 20,000 draws: the floor of
  the arithmetic itself, with no Python in the loop.

Reports microseconds per draw, ratios to the Numba loop and to the PyMC loop, and the peak
resident memory of the process over the data's size. Writes ``results/draw_cost.json``.

    python benchmarks/draw_cost.py [--rows 10000 100000 1000000 10000000]

Each N runs in its own child process (fresh memory), one after the other.
"""

from __future__ import annotations

import resource
import time
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from common import logistic_data, logistic_model, runs_per_rows, write_json
from pymc.step_methods.arraystep import ArrayStepShared

import pymc_subsample as pms

STEPS = {
    f"{test}_{proposal}{suffix}": (step_class, proposal, fused)
    for test, step_class in (("austerity", pms.AusterityMH), ("barker", pms.MinibatchBarkerMH))
    for proposal in ("random_walk", "independent")
    for suffix, fused in (("", True), ("_python", False))
}
TUNE, DRAWS = 200, 10_000


class StatsOnly(ArrayStepShared):
    """A step that stays where it is and reports the Austerity step's stats (PyMC's floor)."""

    name = "stats_only"
    stats_dtypes_shapes: ClassVar[dict[str, Any]] = {
        name: spec
        for name, spec in pms.AusterityMH.stats_dtypes_shapes.items()
        if name != "warning"
    }

    def __init__(self, vars: list[Any]) -> None:
        super().__init__(vars, {}, blocked=True)
        self._stats = [{name: 0 for name in self.stats_dtypes_shapes}]

    def astep(self, q0: Any) -> tuple[Any, list[dict[str, Any]]]:
        return q0, self._stats


def per_draw(step: Any, model: pm.Model) -> dict[str, Any]:
    """Per-draw cost of ``pm.sample`` with this step, from a clock read after every draw.

    ``pm.sample``'s ``callback`` reads ``time.perf_counter()`` after each draw is recorded:
    the intervals between the draws after tuning are what a draw costs inside PyMC's loop
    (the step, the trace's recording, PyMC's bookkeeping and the callback itself, about
    1 us), without what a call costs once (set-up, the first point's check on all rows, the
    InferenceData), which ``wall_us_per_draw`` spreads over the draws. ``us_per_draw`` is
    their mean: a t-test that meets a near tie reads many rows in one draw, and the mean
    counts it (``max_rows_in_a_draw``); ``median_us_per_draw`` is a typical draw.
    """
    kwargs = {"chains": 1, "progressbar": False, "compute_convergence_checks": False}
    stamps: list[float] = []

    def clock(**_: Any) -> None:
        stamps.append(time.perf_counter())

    with model:
        pm.sample(step=step, tune=50, draws=50, random_seed=0, **kwargs)
        start = time.perf_counter()
        idata = pm.sample(
            step=step, tune=TUNE, draws=DRAWS, random_seed=1, callback=clock, **kwargs
        )
        wall = time.perf_counter() - start
    intervals = np.diff(stamps[TUNE - 1 :]) * 1e6  # the DRAWS draws after tuning
    stats = idata.sample_stats
    rows = stats["n_data"].values.ravel()
    return {
        "us_per_draw": float(intervals.mean()),
        "median_us_per_draw": float(np.median(intervals)),
        "wall_us_per_draw": wall / (TUNE + DRAWS) * 1e6,
        "rows_per_draw": float(rows.mean()),
        "max_rows_in_a_draw": int(rows.max()),
        "acceptance": float(stats["accepted"].mean()),
    }


def fused_direct(step: Any) -> float:
    """Microseconds per draw of a step's fused draw called in a plain Python loop."""
    draw = step._fused_draw()
    q = step.control.proxy.reference.copy()
    for _ in range(100):
        q, _ = draw.draw(q, step.scaling)
    start = time.perf_counter()
    for _ in range(20_000):
        q, _ = draw.draw(q, step.scaling)
    return (time.perf_counter() - start) / 20_000 * 1e6


def numba_loop(
    X: np.ndarray, y: np.ndarray, reference: np.ndarray, factor: np.ndarray, scaling: float
) -> float:
    """Microseconds per draw of the hand-written Numba loop (see the module docstring)."""
    import numba
    from scipy.stats import t as student_t

    @numba.njit(cache=False)
    def run(X, y, q_ref, L, scaling, n_draws, batch, critical, seed):  # type: ignore[no-untyped-def]
        # Numba's per-thread legacy generator: the cheapest draws a hand-written loop can make.
        np.random.seed(seed)  # noqa: NPY002
        n_rows, d = X.shape
        q = q_ref.copy()
        accepted = 0
        residuals = np.empty(batch)
        for _ in range(n_draws):
            z = np.random.standard_normal(d)  # noqa: NPY002
            q_new = q + scaling * (L @ z)
            log_prior = -0.125 * (q_new @ q_new - q @ q)  # N(0, 2^2)
            a = q_new - q
            b = q_new + q - 2.0 * q_ref
            u = np.log(np.random.random())  # noqa: NPY002
            for k in range(batch):
                i = np.random.randint(0, n_rows)  # noqa: NPY002
                eta_new = 0.0
                eta_old = 0.0
                eta_ref = 0.0
                xa = 0.0
                xb = 0.0
                for j in range(d):
                    x = X[i, j]
                    eta_new += x * q_new[j]
                    eta_old += x * q[j]
                    eta_ref += x * q_ref[j]
                    xa += x * a[j]
                    xb += x * b[j]
                loglik_new = y[i] * eta_new - np.log1p(np.exp(eta_new))
                loglik_old = y[i] * eta_old - np.log1p(np.exp(eta_old))
                p = 1.0 / (1.0 + np.exp(-eta_ref))
                proxy = (y[i] - p) * xa - 0.5 * p * (1.0 - p) * xa * xb
                residuals[k] = loglik_new - loglik_old - proxy
            mean = residuals.mean()
            sd = np.sqrt(((residuals - mean) ** 2).sum() / (batch - 1))
            std_error = sd / np.sqrt(batch) * np.sqrt(1.0 - (batch - 1) / (n_rows - 1))
            threshold = (u - log_prior) / n_rows
            if abs(mean - threshold) / std_error > critical and mean > threshold:
                q = q_new
                accepted += 1
        return accepted

    critical = float(student_t.isf(0.001, 99))
    run(X, y, reference, factor, scaling, 10, 100, critical, 0)  # compile
    n_draws = 20_000
    start = time.perf_counter()
    run(X, y, reference, factor, scaling, n_draws, 100, critical, 1)
    return (time.perf_counter() - start) / n_draws * 1e6


def run_rows(n_rows: int) -> dict[str, Any]:
    """Everything measured at one N, in this process."""
    X, y = logistic_data(n_rows, 10)
    model = logistic_model(X, y)
    data_bytes = X.nbytes + y.nbytes
    result: dict[str, Any] = {"rows": n_rows, "data_bytes": data_bytes}
    with model:
        floor = per_draw(StatsOnly(model.value_vars), model)
    result["pymc_loop_us"] = floor["us_per_draw"]
    result["pymc_loop_wall_us"] = floor["wall_us_per_draw"]
    laplace_factor = None
    for name, (step_class, proposal, fused) in STEPS.items():
        with model:
            step = step_class(proposal=proposal, fused=fused)
        assert (step.draw_path == "fused") == fused, step.draw_path
        measured = per_draw(step, model)
        result[name] = {
            **measured,
            "over_pymc_loop": measured["us_per_draw"] / floor["us_per_draw"],
        }
        if proposal == "random_walk" and laplace_factor is None:
            laplace_factor = (step.control.proxy.reference, step.proposal.chol_factor, step.scaling)
        if name == "barker_random_walk":
            result["fused_direct_us"] = fused_direct(step)
    assert laplace_factor is not None
    reference, factor, scaling = laplace_factor
    result["numba_loop_us"] = numba_loop(X, y, reference, factor, scaling)
    for name in STEPS:
        result[name]["over_numba_loop"] = result[name]["us_per_draw"] / result["numba_loop_us"]
        if not name.endswith("_python"):
            python = result[f"{name}_python"]["us_per_draw"]
            result[name]["speedup_over_python_path"] = python / result[name]["us_per_draw"]
    result["fused_direct_over_numba_loop"] = result["fused_direct_us"] / result["numba_loop_us"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["peak_rss_over_data"] = peak / data_bytes
    return result


def main() -> None:
    runs = runs_per_rows(__file__, run_rows, __doc__.splitlines()[0])
    if runs is None:  # a child process: its one N is printed
        return
    flat = {
        name: max(run[name]["us_per_draw"] for run in runs)
        / min(run[name]["us_per_draw"] for run in runs)
        for name in STEPS
    }
    write_json(
        "draw_cost",
        {
            "features": 10,
            "batch_size": 100,
            "tune": TUNE,
            "draws": DRAWS,
            "runs": runs,
            "max_over_min_us_per_draw_across_rows": flat,
        },
    )


if __name__ == "__main__":
    main()

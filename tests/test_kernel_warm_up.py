"""The package's kernels compiled ahead in a helper process (``kernels/warm_up.py``).

Each check runs in fresh processes on empty Numba and PyTensor caches (``tmp_path``), as a
user's first build does. Deterministic: no Monte Carlo, no false failures.

- The table of signatures holds the ones the drivers call: a fused draw and a group sweep
  built on empty caches compile every kernel of the table, each with signatures the table
  lists (a wrong entry fails: the helper would compile what no driver loads), and every
  kernel of those modules they compile is one the helper compiles, listed or a listed
  kernel's callee (a missing entry fails: this process would compile it itself). The table
  lists a variant for each PyTensor version where they differ.
- The helper fills Numba's cache: after it, loading the kernels is all cache hits; a build
  that waits for it compiles the kernels it has not reached itself, from the last one back.
- A build starts the helper only where the kernels are not cached, and waits for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from fresh_process import run_fresh

from pymc_subsample import helper_processes
from pymc_subsample.helper_processes import available_cores
from pymc_subsample.kernels import warm_up

REPOSITORY = Path(__file__).resolve().parents[1]


def _run(code: str, caches: Path) -> dict:
    """Run ``code`` in a fresh interpreter on the caches in ``caches``; return its JSON line."""
    return run_fresh(code, caches)[0]


_REPORT_COMPILED = """
import importlib
from numba.core.registry import CPUDispatcher
compiled = {}
for module_name in warm_up.KERNEL_SIGNATURES:
    module = importlib.import_module("pymc_subsample.kernels." + module_name)
    for name, dispatcher in vars(module).items():
        # Every kernel of the module compiled, in the table or not (a callee).
        if isinstance(dispatcher, CPUDispatcher) and dispatcher.signatures:
            compiled[module_name + "." + name] = [
                [str(t) for t in signature] for signature in dispatcher.signatures
            ]
print(json.dumps(compiled))
"""

#: A Poisson regression whose step takes the fused draw (in the fresh processes' code).
_FUSED_POISSON = """
rng = np.random.default_rng(0)
n = 4_000
X = rng.normal(size=(n, 2))
y = rng.poisson(1.0, n)
with pm.Model():
    b = pm.Normal("b", 0.0, 1.0, shape=2)
    pm.Poisson("y", mu=pm.math.exp(X @ b), observed=y)
    step = pms.AusterityMH()
    assert step.draw_path == "fused", step.draw_path
"""

_COMPILED_SIGNATURES = (
    """
import json, warnings
import numpy as np
import pymc as pm
import pymc_subsample as pms
from pymc_subsample.kernels import warm_up

from pymc_subsample.model import compile_helper

warnings.simplefilter("ignore")
warm_up._requested.update(warm_up.KERNEL_SIGNATURES)  # this process compiles them itself
compile_helper._unavailable = True  # and the drivers, which call them (no compile helper)
"""
    + _FUSED_POISSON
    + """
    pm.sample(draws=2, tune=0, chains=1, step=step, progressbar=False,
              compute_convergence_checks=False, random_seed=1)
group = rng.integers(0, 20, n)
with pm.Model():
    mu = pm.Normal("mu", 0.0, 1.0)
    a = pm.Normal("a", mu, 1.0, shape=20)
    b = pm.Normal("b", 0.0, 1.0)
    pm.Poisson("y", mu=pm.math.exp(a[group] + b * X[:, 0]), observed=y)
    step = pms.AusterityMH()
    assert isinstance(step, pms.GroupEffectsMH), type(step)
    pm.sample(draws=2, tune=0, chains=1, step=step, progressbar=False,
              compute_convergence_checks=False, random_seed=1)
"""
    + _REPORT_COMPILED
)

#: What the helper compiles: the table's kernels and their callees.
_HELPER_COMPILES = (
    """
import json
from pymc_subsample.kernels import warm_up

warm_up.compile_kernels(list(warm_up.KERNEL_SIGNATURES))
"""
    + _REPORT_COMPILED
)


def test_the_table_holds_the_signatures_the_drivers_compile(tmp_path):
    compiled = _run(_COMPILED_SIGNATURES, tmp_path / "build")
    table = {
        f"{module}.{name}": [[str(t) for t in signature] for signature in signatures]
        for module, kernels in warm_up.KERNEL_SIGNATURES.items()
        for name, signatures in kernels.items()
    }
    for kernel, signatures in table.items():
        assert compiled.get(kernel), f"{kernel} was not compiled by any driver"
        for signature in compiled[kernel]:
            assert signature in signatures, (kernel, signature)
    # Every kernel the builds compiled, the helper compiles: one of the table or a callee.
    helper = _run(_HELPER_COMPILES, tmp_path / "helper")
    for kernel, signatures in compiled.items():
        for signature in signatures:
            assert signature in helper.get(kernel, []), f"{kernel}{signature}: not in the table"


_HELPER_THEN_LOAD = """
import json
from pymc_subsample.kernels import warm_up

cached_before = warm_up.kernels_cached(["fused"])
warm_up.start_kernel_warm_up(["fused"])
started = len(warm_up._helpers)
for helper in warm_up._helpers:  # the helper alone (waiting here would compile some)
    helper.wait(timeout=300)
warm_up.wait_for_kernel_warm_up()
warm_up.compile_kernels(["fused"])
hits = misses = 0
for dispatcher, _ in warm_up._dispatchers(["fused"]):
    hits += sum(dispatcher.stats.cache_hits.values())
    misses += sum(dispatcher.stats.cache_misses.values())
print(json.dumps({"cached_before": cached_before, "started": started,
                  "cached_after": warm_up.kernels_cached(["fused"]),
                  "hits": hits, "misses": misses}))
"""


@pytest.mark.skipif(available_cores() < 2, reason="the helper runs only with two cores or more")
def test_the_helper_fills_the_cache_this_process_then_loads(tmp_path):
    first = _run(_HELPER_THEN_LOAD, tmp_path)
    assert first == {
        "cached_before": False,
        "started": 1,
        "cached_after": True,
        "hits": sum(map(len, warm_up.KERNEL_SIGNATURES["fused"].values())),
        "misses": 0,
    }
    # A second process finds them cached and starts no helper.
    second = _run(_HELPER_THEN_LOAD, tmp_path)
    assert second["cached_before"] and second["started"] == 0 and second["misses"] == 0


_DRIVER_COMPILES = (
    """
import json, warnings
import numpy as np
import pymc as pm
import pymc_subsample as pms
from numba.core import dispatcher
from pymc_subsample.step_methods import fused_path

warnings.simplefilter("ignore")
compiled = []
compile_core = dispatcher._FunctionCompiler._compile_core
draw = fused_path.FusedDraw.draw

def recorded(self, args, return_type):
    compiled.append(self.py_func.__module__ + "." + self.py_func.__qualname__)
    return compile_core(self, args, return_type)

def first_draw(self, q, scaling):  # the driver compiles at its first call
    dispatcher._FunctionCompiler._compile_core = recorded
    try:
        return draw(self, q, scaling)
    finally:
        dispatcher._FunctionCompiler._compile_core = compile_core

fused_path.FusedDraw.draw = first_draw
"""
    + _FUSED_POISSON
    + """
print(json.dumps({"compiled": compiled}))
"""
)


def test_the_fused_driver_compiles_nothing_but_itself_on_cached_kernels(tmp_path):
    # Every kernel and model function cached by a first build, the driver's cache removed:
    # its compile compiles the driver alone. Caught if the generated source used NumPy's
    # fancy indexing, sum or empty (Numba compiles their implementations with the driver at
    # every cold build: 0.9 s of a Student-t regression's 2.0 s). Deterministic.
    _run(_DRIVER_COMPILES, tmp_path)
    drivers = list((tmp_path / "pytensor").rglob("*fused_draw*"))
    assert drivers
    for path in drivers:
        path.unlink()
    found = _run(_DRIVER_COMPILES, tmp_path)
    assert found["compiled"] == ["pymc_subsample.step_methods.fused_path.fused_draw"]


_BUILD_BESIDE_WARM_UP = (
    """
import json, warnings
import numpy as np
import pymc as pm
import pymc_subsample as pms
from pymc_subsample.kernels import warm_up

warnings.simplefilter("ignore")
"""
    + _FUSED_POISSON
    + """
print(json.dumps({"path": step.draw_path, "helpers": len(warm_up._helpers),
                  "cached": warm_up.kernels_cached(["fused"])}))
"""
)


@pytest.mark.skipif(available_cores() < 2, reason="the helper runs only with two cores or more")
def test_a_fused_build_compiles_its_driver_beside_the_warm_up_and_then_stops_it(tmp_path):
    # On empty caches the step starts the warm-up, compiles its driver without waiting for
    # it (loading the kernels it has cached, compiling the others) and stops it: no helper is
    # left and every kernel is cached. Caught if the helper were left running (or waited for
    # and still listed). Deterministic.
    found = _run(_BUILD_BESIDE_WARM_UP, tmp_path)
    assert found == {"path": "fused", "helpers": 0, "cached": True}


def test_stopping_the_warm_up_stops_only_the_helpers_of_those_modules(monkeypatch):
    stopped: list[int] = []
    fused, groups = SimpleNamespace(pid=1), SimpleNamespace(pid=2)
    monkeypatch.setattr(warm_up, "_helpers", [fused, groups])
    monkeypatch.setattr(warm_up, "_helper_modules", {1: ("fused",), 2: ("group_newton",)})
    monkeypatch.setattr(helper_processes, "stop_process", lambda helper: stopped.append(helper.pid))
    warm_up.stop_kernel_warm_up(["fused"])
    assert stopped == [1] and warm_up._helpers == [groups]
    warm_up.stop_kernel_warm_up(["fused"])  # none left of those
    assert stopped == [1]


_COMPILES_AHEAD = """
import json
from pymc_subsample.kernels import warm_up

warm_up.start_kernel_warm_up(["fused"])
warm_up.wait_for_kernel_warm_up()  # at once: the helper is still starting
misses = [sum(dispatcher.stats.cache_misses.values())
          for dispatcher, _ in warm_up._dispatchers(["fused"])]
print(json.dumps({"misses": misses, "cached": warm_up.kernels_cached(["fused"])}))
"""


@pytest.mark.skipif(available_cores() < 2, reason="the helper runs only with two cores or more")
def test_a_build_waiting_for_the_helper_compiles_its_last_kernels_itself(tmp_path):
    # Waiting at once, this process compiles the table's kernels from the last one back while
    # the helper (still importing Numba) compiles them from the first: the last kernel is
    # compiled here, the first loaded from the helper's cache (no miss here), and all are
    # cached. Caught if the wait were idle (no miss here) or took the kernels in the helper's
    # order (the first one missed here). A false failure needs the helper to reach the last of
    # thirteen kernels before this process compiles one, or this process to compile ten before
    # the helper compiles one: each is a fraction of a second, the helper's start about one.
    found = _run(_COMPILES_AHEAD, tmp_path)
    assert found["cached"]
    assert found["misses"][-1] >= 1
    assert found["misses"][0] == 0


def test_no_helper_on_one_core_or_for_modules_already_asked_for(monkeypatch):
    started: list[list[str]] = []
    monkeypatch.setattr(warm_up, "_requested", set())
    monkeypatch.setattr(warm_up, "_helpers", [])
    monkeypatch.setattr(warm_up, "kernels_cached", lambda modules: False)
    monkeypatch.setattr(warm_up, "_helper_modules", {})
    monkeypatch.setattr(
        warm_up.subprocess,
        "Popen",
        lambda arguments, **_: started.append(arguments[-1]) or SimpleNamespace(pid=0),
    )
    monkeypatch.setattr(helper_processes, "available_cores", lambda: 1)
    warm_up.start_kernel_warm_up(["fused"])
    assert started == []
    monkeypatch.setattr(helper_processes, "available_cores", lambda: 2)
    warm_up.start_kernel_warm_up(["fused"])  # asked for once already
    warm_up.start_kernel_warm_up(["fused", "group_newton"])
    assert len(started) == 1 and "compile_kernels(['group_newton'])" in started[0]


_NICENESS = """
import json, os, time
from pymc_subsample.kernels import warm_up
warm_up.start_kernel_warm_up(["fused"], in_background={in_background})
(helper,) = warm_up._helpers
deadline = time.monotonic() + 10
niceness = os.getpriority(os.PRIO_PROCESS, helper.pid)
while niceness == os.nice(0) and time.monotonic() < deadline and helper.poll() is None:
    time.sleep(0.01)  # the helper's first statement sets it
    niceness = os.getpriority(os.PRIO_PROCESS, helper.pid)
print(json.dumps({{"niceness": niceness - os.nice(0)}}))
"""


@pytest.mark.skipif(not hasattr(os, "nice") or available_cores() < 2, reason="needs two cores")
@pytest.mark.parametrize("in_background", [True, False], ids=["background", "foreground"])
def test_a_warm_up_in_the_background_runs_at_a_lower_priority(tmp_path, in_background):
    # A fused draw's kernels, compiled while the build runs and called only at its end, leave
    # the cores to the build and the compile helper; a group step's, called by its first
    # draw's recentring, do not (caught if the niceness were not set, or set for both).
    found = _run(_NICENESS.format(in_background=in_background), tmp_path)
    assert found == {"niceness": warm_up.BACKGROUND_NICENESS if in_background else 0}


_START_AND_EXIT = """
import json
from pymc_subsample.kernels import warm_up
warm_up.start_kernel_warm_up(["fused", "fused_groups", "group_newton"])
print(json.dumps({"pid": warm_up._helpers[0].pid}))
"""


def test_a_process_that_ends_at_once_stops_its_helper_and_says_nothing(tmp_path):
    # A script that builds a step and ends leaves the helper compiling; at exit the helper
    # is stopped and reaped. Without that, ``-W default`` showed "ResourceWarning:
    # subprocess ... is still running" and the helper outlived the script.
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", _START_AND_EXIT],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ResourceWarning" not in done.stderr, done.stderr
    pid = json.loads(done.stdout.strip().splitlines()[-1])["pid"]
    with pytest.raises(ProcessLookupError):  # reaped: no such process, not even a zombie
        os.kill(pid, 0)

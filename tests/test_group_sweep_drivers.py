"""A group sweep's drivers compiled ahead by the compile helper.

The drivers are ``step_methods/group_sweep_drivers.py``'s.

Deterministic checks, no Monte Carlo: no false failures.

- Sent at a chain's first draw (``FusedGroupSweep.send_to_helper``), the helper compiles each
  factor's sweep for the types of the call the draw makes: the draw then loads it from the
  cache (a hit, no miss). In a fresh process on empty caches, the test waits for the helper's
  job to end before the draw, so that the check does not depend on which process is faster.
  Once they are cached, a step sends no job (a warm build loads them itself).
- The job pickles without the data: the rows' arrays travel as their types only.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
from fresh_process import run_fresh

from pymc_subsample import GroupEffectsMH
from pymc_subsample.model import compile_helper, compiled
from pymc_subsample.step_methods.group_sweep_drivers import GroupSweepJob

_MODEL = """
import numpy as np
import pymc as pm
from pymc_subsample import GroupEffectsMH

sizes = np.array([30, 5, 80, 12, 50, 3, 40, 20] * 5)
group = np.repeat(np.arange(sizes.size), sizes)
rng = np.random.default_rng(3)
y = rng.poisson(np.exp(rng.normal(0.5, 0.5, sizes.size)[group]))
with pm.Model(coords={"group": range(sizes.size)}) as model:
    mu = pm.Normal("mu", 0.0, 1.0)
    a = pm.Normal("a", mu, 1.0, dims="group")
    pm.Poisson("y", pm.math.exp(a[pm.Data("g", group)]), observed=y)
    step = GroupEffectsMH([model["a"]])
"""

_LOADED_FROM_THE_CACHE = (
    _MODEL
    + """
import json, time
from pymc.blocking import DictToArrayBijection
from pymc_subsample.model import compile_helper

point = model.initial_point()
q = DictToArrayBijection.map({v.name: point[v.name] for v in step.vars}).data
# SPOIL
step._compile_sweep_ahead(q)
# RESTORE
job = step._sweep_job
(helper,) = compile_helper._helpers
deadline = time.monotonic() + 300
while job not in helper.finished | helper.failed and time.monotonic() < deadline:
    assert helper.read(1.0), "the helper ended"
step.step(point)
stats = step._fused._sweeps[0].stats
with model:  # the same model's second step: its drivers are cached now
    second = GroupEffectsMH([model["a"]])
second._compile_sweep_ahead(q)
print(json.dumps({"path": step.draw_path, "job": job, "done": job in helper.finished,
                  "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values()),
                  "second_job": second._sweep_job}))
"""
)

#: The same job sent for other types: the draw's call misses the helper's code.
_WRONG_TYPES = """
from pymc_subsample.step_methods import fused_group_path
_arguments = fused_group_path.FusedGroupSweep._sweep_arguments
def _integer_coordinates(self, *arguments, **options):
    q, coordinates, *rest = _arguments(self, *arguments, **options)
    return (q, coordinates.astype(np.int32), *rest)
fused_group_path.FusedGroupSweep._sweep_arguments = _integer_coordinates
"""
_RESTORE = "fused_group_path.FusedGroupSweep._sweep_arguments = _arguments"


def _run(code: str, caches: Path) -> dict:
    """Run ``code`` in a fresh interpreter on the caches in ``caches``; return its JSON line."""
    return run_fresh(code, caches)[0]


@pytest.mark.skipif(not compile_helper.helper_available(), reason="needs two cores")
@pytest.mark.parametrize("wrong_types", [False, True], ids=["sent", "sent for other types"])
def test_the_draw_loads_the_sweep_the_helper_compiled(tmp_path: Path, wrong_types: bool) -> None:
    # The helper's job ends, and the first draw's sweep loads its code: one hit, no miss.
    # Sent for other argument types (the coordinates as int32), the draw misses and compiles
    # it here: the check can fail, and would if the job's types were not the call's.
    if not compiled.INTERPRETED_SECONDS:
        pytest.skip("PyTensor 2 compiles every function at its first call: no helper")
    found = _run(
        _LOADED_FROM_THE_CACHE.replace("# SPOIL", _WRONG_TYPES if wrong_types else "").replace(
            "# RESTORE", _RESTORE if wrong_types else ""
        ),
        tmp_path,
    )
    assert found["path"] == "fused"
    assert found["job"] > 0
    assert found["done"]
    expected = {"hits": 0, "misses": 1} if wrong_types else {"hits": 1, "misses": 0}
    assert {"hits": found["hits"], "misses": found["misses"]} == expected
    # Once the drivers are cached, a step sends no job: a warm build loads them itself
    # (caught if it sent one, which would start a helper process to load them).
    assert found["second_job"] == 0


def test_the_job_carries_the_types_of_the_rows_not_the_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 2e5 rows (1.6 MB of counts): the job's pickle holds their types and the graphs, far
    # less than the data, and passes the guard against data (MAX_ARRAY_BYTES). Caught if the
    # job carried the arrays themselves (the pickle would hold the rows).
    sizes = np.full(100, 2_000)
    group = np.repeat(np.arange(sizes.size), sizes)
    y = np.random.default_rng(0).poisson(2.0, group.size)
    with pm.Model(coords={"group": range(sizes.size)}) as model:
        a = pm.Normal("a", 0.5, 1.0, dims="group")
        pm.Poisson("y", pm.math.exp(a[pm.Data("g", group)]), observed=y)
        step = GroupEffectsMH([model["a"]])
    sent: list[bytes] = []
    monkeypatch.setattr(compile_helper, "helper_available", lambda: True)

    def submit_job(job: GroupSweepJob) -> int:  # pickled as the helper's jobs are
        buffer = io.BytesIO()
        compile_helper._DataFreePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(job)
        sent.append(buffer.getvalue())
        return len(sent)

    monkeypatch.setattr(compile_helper, "submit_job", submit_job)
    q = np.zeros(sizes.size)
    step._compile_sweep_ahead(q)
    assert step._sweep_job == 1
    (payload,) = sent
    assert isinstance(pickle.loads(payload), GroupSweepJob)
    assert len(payload) < y.nbytes / 10


def _small_hierarchy() -> tuple[pm.Model, GroupEffectsMH]:
    sizes = np.array([30, 5, 80, 12, 50, 3, 40, 20])
    group = np.repeat(np.arange(sizes.size), sizes)
    y = np.random.default_rng(1).poisson(2.0, group.size)
    with pm.Model(coords={"group": range(sizes.size)}) as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        a = pm.Normal("a", mu, 1.0, dims="group")
        pm.Poisson("y", pm.math.exp(a[pm.Data("g", group)]), observed=y)
        step = GroupEffectsMH()
    return model, step


def test_llvm_optimisation_sets_numba_level_and_restores_it() -> None:
    # Inside the block Numba's passes read level 1; after it (an error included) the
    # process's level is back. Caught if the level were not set, or not restored.
    from numba.core import config as numba_config

    saved = int(numba_config.OPT)
    with compiled.llvm_optimisation(1):
        assert int(numba_config.OPT) == 1
    assert int(numba_config.OPT) == saved
    with pytest.raises(ValueError), compiled.llvm_optimisation(0):
        raise ValueError
    assert int(numba_config.OPT) == saved


def test_a_sweep_compiled_here_is_compiled_at_the_drivers_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first call of a factor's sweep (which compiles it where the helper did not) runs
    # at SWEEP_LLVM_OPT, later calls at the process's level: the same code as the helper's
    # job compiles. Caught if the first call ran at the process's level.
    from numba.core import config as numba_config

    from pymc_subsample.step_methods.group_sweep_drivers import SWEEP_LLVM_OPT

    monkeypatch.setattr(compile_helper, "_unavailable", True)
    model, step = _small_hierarchy()
    fused = step._built_fused_sweep()
    assert fused is not None
    sweep = fused._sweeps[0]
    levels: list[int] = []

    def recording(*arguments: object) -> object:
        levels.append(int(numba_config.OPT))
        return sweep(*arguments)

    fused._sweeps[0] = recording
    point = model.initial_point()
    step.step(point)
    step.step(point)
    assert levels == [SWEEP_LLVM_OPT, int(numba_config.OPT)]
    assert SWEEP_LLVM_OPT != int(numba_config.OPT)


def test_the_prior_compiles_here_while_the_helper_compiles_the_drivers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With the drivers' job in the helper, the first sweep evaluates the prior (compiling
    # it, for the moves after the sweep) before it waits for the job; without a job (a warm
    # build, no helper) it does not. Caught if the prior were left to after the wait.
    _, step = _small_hierarchy()
    fused = step._built_fused_sweep()
    assert fused is not None
    calls: list[str] = []
    monkeypatch.setattr(
        type(step.oracles), "log_prior", lambda self, q: calls.append("prior") or 0.0
    )
    monkeypatch.setattr(fused, "wait_for_helpers", lambda job: calls.append(f"wait {job}"))
    q = np.zeros(9)
    step._sweep_job = 7
    step._fused_sweep(q)
    assert calls == ["prior", "wait 7"]
    calls.clear()
    step._fused_ready, step._sweep_job = False, 0
    step._fused_sweep(q)
    assert calls == ["wait 0"]
    # A step with no hyperparameter and no shared coefficient never evaluates the prior.
    sizes = np.array([30, 5, 80, 12])
    with pm.Model(coords={"group": range(sizes.size)}) as model:
        a = pm.Normal("a", 0.5, 1.0, dims="group")
        group = np.repeat(np.arange(sizes.size), sizes)
        pm.Poisson("y", pm.math.exp(a[pm.Data("g", group)]), observed=np.ones(group.size))
        alone = GroupEffectsMH([model["a"]])
    only_effects = alone._built_fused_sweep()
    assert only_effects is not None
    monkeypatch.setattr(only_effects, "wait_for_helpers", lambda job: calls.append(f"wait {job}"))
    calls.clear()
    alone._sweep_job = 3
    alone._fused_sweep(np.zeros(sizes.size))
    assert calls == ["wait 3"]


def test_the_helper_unpickles_a_drivers_job_without_importing_the_steps(tmp_path: Path) -> None:
    # The compile helper imports this package's modules without its __init__; unpickling a
    # GroupSweepJob imports group_sweep_drivers, whose package (step_methods) imports its step
    # classes at their first use only: none is imported there (0.4 s less in the job that
    # ends a hierarchy's first build). The classes still resolve by name. Caught if
    # step_methods' __init__ imported the steps.
    from pymc_subsample.helper_processes import helper_command

    statement = (
        "import json, sys\n"
        "import pymc_subsample.step_methods.group_sweep_drivers\n"
        "steps = sorted(m for m in sys.modules if m.startswith('pymc_subsample.step_methods.')\n"
        "               and m.endswith(('.austerity', '.group_effects', '.sgfs', '.base')))\n"
        "from pymc_subsample.step_methods import GroupEffectsMH\n"
        "print(json.dumps({'steps': steps, 'class': GroupEffectsMH.__name__}))\n"
    )
    command = helper_command(statement)
    assert command[1] == "-c"
    found, _ = run_fresh(command[2], tmp_path)
    assert found == {"steps": [], "class": "GroupEffectsMH"}

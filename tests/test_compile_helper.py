"""The set-up's functions compiled ahead in a helper process (``model/compile_helper.py``).

Deterministic checks, no Monte Carlo: no false failures.

- The helper fills Numba's cache: after its job, the same function compiled here loads its
  code from the cache (a hit, no miss); without the job the same call misses. A helper ends
  after its ``JOBS_PER_HELPER`` jobs and the next job starts another, whose job is found there.
  Each run uses graphs no cache has seen (a fresh constant in each) on empty caches, in a
  fresh process.
- While this process waits for a job the helper runs, it compiles the jobs the helper has not
  started itself, the last first, and their files are removed; a job compiled here fills the
  cache as the helper's would, for calls from Numba code and from Python.
- A graph holding more than ``MAX_ARRAY_BYTES`` of data is not sent, and starts no helper; a
  function the helper refused is not offered again at each later call.
- ``pm.sample``'s worker processes do not use a helper.
- A script that sends a job and ends at once leaves no helper running, no job file, and
  prints nothing.
- Nothing the step computes depends on the helper: a function switches from the Python linker
  to compiled code at the same call whether a job was sent or not (the Python linker's and
  Numba's sums can differ in their last bits, so a switch that moved with the helper would
  change a seed's draws), and its compile waits for the job first.
"""

from __future__ import annotations

import multiprocessing
import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from fresh_process import run_fresh

from pymc_subsample.model import compile_helper, compiled


def scaled_sum_graph(scale: float) -> tuple[list[Any], Any]:
    """A small graph; its constant ``scale`` gives it a cache key of its own."""
    x = pt.vector("x")
    return [x], [pt.sum(pt.exp(x * scale))]


def data_graph(data: Any) -> tuple[list[Any], Any]:
    """A graph reading ``data`` (a shared variable)."""
    x = pt.vector("x")
    return [x], [pt.sum(x) + pt.sum(data)]


def _run(code: str, caches: Path, *options: str) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter on empty caches; return its JSON line and stderr."""
    return run_fresh(code, caches, *options, timeout=600)


_FILLS_THE_CACHE = """
import json, time, uuid
from functools import partial
import numpy as np
from pymc_subsample.model import compile_helper, compiled
from test_compile_helper import scaled_sum_graph

compile_helper.JOBS_PER_HELPER = 1  # a helper per job: the second job starts a second helper
jobs = {jobs}
x = np.arange(5.0)
builders = [
    partial(scaled_sum_graph, 1.0 + uuid.uuid4().int % 10**6 / 10**7) for _ in range(max(jobs, 1))
]
for builder in builders[:jobs]:
    if {prefetch}:  # types from the graph's inputs: a C-contiguous float64 vector
        function = compiled.LazyFunction(builder, {{}})
        function.prefetch()
        assert function._compile_job, "not sent"
    else:
        assert compile_helper.submit(builder, {{}}, compiled._numba_types((x,))), "not sent"
for job in range(1, jobs + 1):
    (helper,) = [helper for helper in compile_helper._helpers if helper.owns(job)]
    deadline = time.monotonic() + 300
    while job not in helper.finished | helper.failed and time.monotonic() < deadline:
        assert helper.read(1.0), "the helper ended"
    assert job in helper.finished, "the helper's job failed or did not finish"
hits = misses = 0
for builder in builders:
    function = compiled.LazyFunction(builder, {{}}).compile()
    function(x)
    stats = function.vm.jit_fn.stats
    hits += sum(stats.cache_hits.values())
    misses += sum(stats.cache_misses.values())
print(json.dumps({{"hits": hits, "misses": misses, "helpers": len(compile_helper._helpers)}}))
"""


@pytest.mark.skipif(not compile_helper.helper_available(), reason="needs two cores")
@pytest.mark.parametrize(
    ("jobs", "prefetch"),
    [(1, False), (2, False), (0, False), (1, True)],
    ids=["job sent", "a helper per job", "no job", "prefetched"],
)
def test_the_helpers_job_is_loaded_from_the_cache(
    tmp_path: Path, jobs: int, prefetch: bool
) -> None:
    # Each job's function, compiled here afterwards, is a cache hit; without a job, a miss.
    # With one job per helper, the second job goes to a second helper and is found there.
    # A prefetched function (the draws' functions, sent before their first call) is compiled
    # for C-contiguous arrays of its inputs' types, which its call here passes: a hit.
    if not compiled.INTERPRETED_SECONDS:
        pytest.skip("PyTensor 2 compiles every function at its first call: no helper")
    found, _ = _run(_FILLS_THE_CACHE.format(jobs=jobs, prefetch=prefetch), tmp_path)
    expected = {"hits": jobs, "misses": 0, "helpers": jobs} if jobs else {
        "hits": 0, "misses": 1, "helpers": 0
    }  # fmt: skip
    assert found == expected


_WITHDRAWS = """
import json, time, uuid
from functools import partial
from pathlib import Path
import numpy as np
from pymc_subsample.model import compile_helper, compiled
from test_compile_helper import scaled_sum_graph

x = np.arange(5.0)
types = compiled._numba_types((x,))
scales = [1.0 + uuid.uuid4().int % 10**6 / 10**7 for _ in range(2)]
first, second = (
    compile_helper.submit(partial(scaled_sum_graph, scale), {{}}, types) for scale in scales
)
(helper,) = compile_helper._helpers
helper.read(0.0)
started = second in helper.started  # the helper is still importing, or compiling the first
compile_helper.wait_for(second)  # this process compiles it: the queued job is withdrawn
gone = not Path(helper._files[1]).exists()
deadline = time.monotonic() + 300
while not {{first, second}} <= helper.finished | helper.failed and time.monotonic() < deadline:
    assert helper.read(1.0), "the helper ended"
print(json.dumps({{"started": started, "gone": gone, "first": first in helper.finished,
                  "second": second in helper.failed}}))
"""


@pytest.mark.skipif(not compile_helper.helper_available(), reason="needs two cores")
def test_a_job_not_started_is_withdrawn_when_this_process_compiles_it(tmp_path: Path) -> None:
    # Two jobs queued; this process compiles the second before the helper reaches it: its file
    # is removed at once and the helper skips it (reported failed) instead of compiling the
    # same code again; the first job is compiled. Caught if wait_for left the queued job.
    found, _ = _run(_WITHDRAWS.format(), tmp_path)
    assert found == {"started": False, "gone": True, "first": True, "second": True}


def _queued_helper(tmp_path: Path) -> Any:
    """A stand-in helper running job 1, with jobs 2 and 3 in its queue (files in tmp_path)."""
    helper: Any = object.__new__(compile_helper._Helper)
    helper.pid, helper.first_job, helper.jobs = os.getpid(), 0, 3
    helper.started, helper.finished, helper.failed = {1}, set(), set()
    helper._files = []
    for job in (1, 2, 3):
        path = tmp_path / f"job_{job}.pkl"
        path.write_bytes(f"graph {job}".encode())
        helper._files.append(str(path))
    Path(helper._files[0]).unlink()  # read by the helper
    return helper


def test_while_a_job_runs_this_process_compiles_the_jobs_not_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Job 1 runs in the helper; jobs 2 and 3 wait in its queue. Waiting for job 1, this
    # process takes back job 3, then job 2 (the last first: the helper reaches them in
    # order), and compiles them itself, rather than wait idle; their files are removed, so
    # the helper skips them. Caught if wait_for waited idle (nothing compiled here), took
    # them in the helper's order, or took the job the helper had read.
    helper = _queued_helper(tmp_path)
    compiled_here: list[bytes] = []

    def read(timeout: float) -> bool:  # job 1 ends once the other two are compiled here
        if len(compiled_here) == 2:
            helper.finished.add(1)
        return True

    helper.read = read
    monkeypatch.setattr(compile_helper, "_helpers", [helper])
    monkeypatch.setattr(compile_helper, "_compile_here", compiled_here.append)
    compile_helper.wait_for(1)
    assert compiled_here == [b"graph 3", b"graph 2"]
    assert not any(Path(path).exists() for path in helper._files)


def test_a_wait_that_ends_the_build_takes_back_no_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The same queue as above, waited for with take_back=False (a group sweep's drivers, the
    # build's last compile): nothing is compiled here and the queued jobs stay the helper's.
    # Caught if the flag were ignored (jobs 3 and 2 compiled here, their files gone).
    helper = _queued_helper(tmp_path)
    compiled_here: list[bytes] = []
    reads = []

    def read(timeout: float) -> bool:  # job 1 ends at the third read
        reads.append(timeout)
        if len(reads) == 3:
            helper.finished.add(1)
        return True

    helper.read = read
    monkeypatch.setattr(compile_helper, "_helpers", [helper])
    monkeypatch.setattr(compile_helper, "_compile_here", compiled_here.append)
    assert compile_helper.wait_for(1, take_back=False) is None
    assert compiled_here == []
    assert all(Path(path).exists() for path in helper._files[1:])


def test_a_job_not_started_is_compiled_here_for_its_signatures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The helper had not started the function's prefetched job when this process compiled it:
    # wait_for withdraws it and returns it, and the compile here compiles the signatures it
    # named at once, a call from Python and one from Numba code (a driver's), as the helper
    # would have. Caught if the withdrawn job were dropped: no signature compiled until a
    # call, and a driver's compile would compile the kernel within its own.
    if not compiled.INTERPRETED_SECONDS:
        pytest.skip("PyTensor 2 compiles every function at its first call: no helper")
    builder = partial(scaled_sum_graph, 0.375)
    job = compile_helper.FunctionJob(builder, {}, None, True)
    waited: list[int] = []
    monkeypatch.setattr(
        compile_helper, "wait_for", lambda number, *rest: waited.append(number) or job
    )
    function = compiled.LazyFunction(builder, {})
    function._compile_job = 4
    function.compile()
    assert waited == [4]
    signatures = function.numba_kernel().function.signatures
    # One tuple (a call from Python) and one star-argument tuple (StarArgUniTuple here).
    starred = sorted(type(signature[0]).__name__.startswith("StarArg") for signature in signatures)
    assert starred == [False, True]


_TAKEN_BACK_FILLS_THE_CACHE = """
import json, pickle, uuid
from functools import partial
import numba
import numpy as np
from pymc_subsample.model import compile_helper, compiled
from test_compile_helper import scaled_sum_graph

x = np.arange(5.0)
builder = partial(scaled_sum_graph, 1.0 + uuid.uuid4().int % 10**6 / 10**7)
# A prefetched job taken back: compiled here for calls from Python and from Numba code.
compile_helper._compile_here(pickle.dumps(compile_helper.FunctionJob(builder, {}, None, True)))
kernel = compiled.LazyFunction(builder, {}).numba_kernel().function


@numba.njit
def driver(values):
    return kernel(values)


driver(x)  # a call from Numba code
kernel(x)  # and from Python
print(json.dumps({"hits": sum(kernel.stats.cache_hits.values()),
                  "misses": sum(kernel.stats.cache_misses.values())}))
"""


def test_a_job_taken_back_fills_the_cache_for_drivers_and_python(tmp_path: Path) -> None:
    # The job compiled here, as the helper would, leaves both signatures of the function's
    # ``*args`` in the cache: the one a driver's call types (a star-argument tuple) and the one
    # a call from Python types (a tuple). Caught if only one were compiled (a miss).
    if not compiled.INTERPRETED_SECONDS:
        pytest.skip("PyTensor 2 compiles every function at its first call: no helper")
    found, _ = _run(_TAKEN_BACK_FILLS_THE_CACHE, tmp_path)
    assert found == {"hits": 2, "misses": 0}


def test_a_graph_holding_data_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 MB of data in the graph's builder: refused before any helper starts (caught if the
    # guard were gone: the stand-in helper would be asked for). 1 MB or less is sent.
    monkeypatch.setattr(compile_helper, "helper_available", lambda: True)
    sent = []

    class StandIn:
        def send(self, payload: bytes) -> int:
            sent.append(len(payload))
            return len(sent)

    monkeypatch.setattr(compile_helper, "_running_helper", StandIn)
    types = compiled._numba_types((np.arange(5.0),))
    large = partial(data_graph, pytensor.shared(np.ones(1 << 18), name="data"))
    assert compile_helper.submit(large, {}, types) == 0
    assert not sent
    small = partial(data_graph, pytensor.shared(np.ones(1 << 17), name="data"))
    assert compile_helper.submit(small, {}, types) == 1
    assert 1 << 20 < sent[0] < 1 << 21


def test_worker_processes_use_no_helper() -> None:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(compile_helper.helper_available) is False


_ENDS_AT_ONCE = """
import json
from functools import partial
import numpy as np
from pymc_subsample.model import compile_helper, compiled
from test_compile_helper import scaled_sum_graph

x = np.arange(5.0)
job = compile_helper.submit(partial(scaled_sum_graph, 2.5), {}, compiled._numba_types((x,)))
helper = compile_helper._helpers[-1]
print(json.dumps({"job": job, "pid": helper.process.pid, "file": helper._files[0]}))
"""


@pytest.mark.skipif(not compile_helper.helper_available(), reason="needs two cores")
def test_a_script_that_ends_at_once_stops_the_helper_and_says_nothing(tmp_path: Path) -> None:
    found, stderr = _run(_ENDS_AT_ONCE, tmp_path, "-W", "default")
    assert found["job"] == 1
    assert stderr == ""
    with pytest.raises(ProcessLookupError):
        os.kill(found["pid"], 0)
    assert not Path(found["file"]).exists()  # the job's graph, read or not, is removed


def test_a_function_the_helper_refused_is_not_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Half its budget spent at the third call, the function is offered to the helper, which
    # refuses it (no helper, or a graph holding data); the calls after do not offer it again,
    # each pickling the graph (caught if every call past half the budget offered it). Its
    # compile then waits for no job.
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (1.0, 0.0))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 6.0)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    offered: list[Any] = []
    monkeypatch.setattr(compile_helper, "submit", lambda *arguments: offered.append(1) or 0)
    waited: list[int] = []
    monkeypatch.setattr(compile_helper, "wait_for", lambda job, *timeout: waited.append(job))
    function = compiled.LazyFunction(partial(scaled_sum_graph, 0.25), {}, interpreted_first=True)
    x = np.arange(5.0)
    while not function.compiled:
        function(x)
    assert offered == [1]
    assert waited == [compiled.NOT_SENT]


def test_the_switch_to_compiled_code_does_not_depend_on_the_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One estimated second per call and a budget of four: compiled at the fifth call, with a
    # helper's job or without one (caught if a job sent moved the switch), and the compile
    # waits for that job first (caught if it did not ask).
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (1.0, 0.0))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 4.0)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    waited: list[int] = []
    monkeypatch.setattr(compile_helper, "wait_for", lambda job, *timeout: waited.append(job))
    x = np.arange(5.0)
    switches = []
    for job in (7, 0):
        monkeypatch.setattr(compile_helper, "submit", lambda *arguments, job=job: job)
        function = compiled.LazyFunction(partial(scaled_sum_graph, 0.5), {}, interpreted_first=True)
        calls = 0
        while not function.compiled:
            function(x)
            calls += 1
        switches.append(calls)
    assert switches == [5, 5]
    assert waited == [7, compiled.NOT_SENT]


def test_a_job_is_sent_once_half_the_budget_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    # One estimated second per call and a budget of four: the job goes at the second call,
    # and a function called once (a quarter of its budget) sends none (caught if sent at the
    # first call, which gives [1], or never).
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (1.0, 0.0))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 4.0)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    calls = [0]
    sent: list[int] = []

    def submit(*arguments: Any) -> int:
        sent.append(calls[0])
        return 7

    monkeypatch.setattr(compile_helper, "submit", submit)
    x = np.arange(5.0)
    once = compiled.LazyFunction(partial(scaled_sum_graph, 0.5), {}, interpreted_first=True)
    calls[0] = 1
    once(x)
    assert sent == []
    more = compiled.LazyFunction(partial(scaled_sum_graph, 0.5), {}, interpreted_first=True)
    for call in range(1, 5):
        calls[0] = call
        more(x)
    assert sent == [2]


def test_arguments_numba_cannot_type_send_no_job() -> None:
    # A job is compiled for its argument types; where Numba has none, nothing is sent.
    assert compiled._numba_types((np.zeros(3), object())) is None
    assert compiled._numba_types((np.zeros(3),)) is not None


@pytest.mark.parametrize("warming", [True, False], ids=["first build", "kernels cached"])
def test_the_draws_functions_go_ahead_only_on_a_machines_first_build(
    monkeypatch: pytest.MonkeyPatch, warming: bool
) -> None:
    # On a first build (the package's kernels compiling) the fused draw's two functions are
    # sent before the search, for the inputs' own types (None); elsewhere none is, since
    # compiling them here is quicker than waiting for a helper that first imports PyTensor
    # (caught if sent always: two prefetched jobs where the kernels are cached; or never).
    import pymc as pm

    import pymc_subsample as pms
    from pymc_subsample.step_methods import step_base

    monkeypatch.setattr(step_base, "start_kernel_warm_up", lambda modules, **options: warming)
    prefetched: list[Any] = []

    def submit(builder: Any, kwargs: Any, types: Any, *, from_drivers: bool = False) -> int:
        if types is None and from_drivers:
            prefetched.append(builder)
        return 0

    monkeypatch.setattr(compile_helper, "submit", submit)
    rng = np.random.default_rng(0)
    x = rng.normal(size=2_000)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 1.0)
        pm.Normal("y", beta * x, 1.0, observed=0.5 * x + rng.normal(size=2_000))
        pms.AusterityMH()
    assert len(prefetched) == (2 if warming else 0)

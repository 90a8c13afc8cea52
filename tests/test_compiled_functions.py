"""Set-up functions interpreted while little used, compiled when used more; Numba lowerings.

``model/compiled.py``: a set-up :class:`LazyFunction` (``interpreted_first``) runs on
PyTensor's Python linker until its estimated time there (from its graph, per call and per
row) would pass its budget (``INTERPRETED_SECONDS``, 2 s on PyTensor 3 and 0 on PyTensor 2, or
for a large graph ``COLD_COMPILE_SHARE`` of its estimated cold compile), then is compiled;
the others compile at their first call.
``model/numba_special.py``: the trigamma function, which PyTensor's Numba backend
otherwise runs in object mode (uncacheable: a Student-t step compiled its search graph in every
process). Deterministic checks (no Monte Carlo, no false failures).
"""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from scipy import special

from pymc_subsample.model import compiled
from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.numba_special import register_numba_lowerings, trigamma


def _softplus_rows() -> tuple[list, list]:
    q = pt.vector("q", shape=(2,))
    x = pt.matrix("x")
    return [q, x], [pt.softplus(x @ q), pt.sum(pt.log1p(pt.exp(-(x @ q))))]


def test_a_function_is_interpreted_until_its_estimated_time_would_pass_the_budget(monkeypatch):
    # One estimated second per call and a budget of four: the fifth call is compiled
    # (caught if the switch came early, late, or never, or if the two gave different values).
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (1.0, 0.0))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 4.0)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    function = LazyFunction(_softplus_rows, {}, interpreted_first=True)
    rng = np.random.default_rng(0)
    q = rng.normal(size=2)
    x = rng.normal(size=(50, 2)) * 400.0  # saturating rows: the rewrites' stable softplus
    assert not function.built
    values = [function(q, x) for _ in range(4)]
    assert function.built and not function.compiled
    compiled_values = function(q, x)
    assert function.compiled
    for interpreted in values:
        for left, right in zip(interpreted, compiled_values, strict=True):
            assert np.all(np.isfinite(left))
            np.testing.assert_allclose(left, right, rtol=1e-12)


def test_a_large_graph_runs_interpreted_for_its_share_of_a_cold_compile(monkeypatch):
    # One estimated second per call and a budget of one; the graph's estimated cold compile
    # is set to eight seconds, half of which it may spend interpreted: compiled at the fifth
    # call, against the second without that estimate (caught if the budget ignored the
    # graph's size, or used all of its compile).
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (1.0, 0.0))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 1.0)
    nodes = len(LazyFunction(_softplus_rows, {})._interpret().maker.fgraph.apply_nodes)
    switches = []
    for per_node in (8.0 / nodes, 0.0):
        monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", per_node)
        function = LazyFunction(_softplus_rows, {}, interpreted_first=True)
        calls = 0
        while not function.compiled:
            function(np.zeros(2), np.zeros((3, 2)))
            calls += 1
        switches.append(calls)
    assert compiled.COLD_COMPILE_SHARE == 0.5
    assert switches == [5, 2]


def test_a_long_first_call_is_compiled(monkeypatch):
    # 1e-3 s per row: 100 rows are over a budget of 0.05 s, 10 rows are not.
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (0.0, 1e-3))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 0.05)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    short = LazyFunction(_softplus_rows, {}, interpreted_first=True)
    short(np.zeros(2), np.zeros((10, 2)))
    assert not short.compiled
    long = LazyFunction(_softplus_rows, {}, interpreted_first=True)
    long(np.zeros(2), np.zeros((100, 2)))
    assert long.compiled


def test_a_function_expected_to_read_many_rows_compiles_at_its_first_call(monkeypatch):
    # 1e-3 s per row and a budget of 0.05 s: 10 rows a call fit, but a set-up expected to
    # read 100 rows in all compiles at once; one expected to read 40 stays interpreted.
    monkeypatch.setattr(compiled, "_interpreted_cost", lambda function: (0.0, 1e-3))
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 0.05)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    many = LazyFunction(_softplus_rows, {}, interpreted_first=True)
    many.expect_rows(100)
    many(np.zeros(2), np.zeros((10, 2)))
    assert many.compiled
    few = LazyFunction(_softplus_rows, {}, interpreted_first=True)
    few.expect_rows(40)
    few(np.zeros(2), np.zeros((10, 2)))
    assert not few.compiled


def test_a_build_tells_its_set_up_functions_the_rows_it_reads():
    import pymc as pm

    from pymc_subsample.model.oracle_builder import build_oracles

    rng = np.random.default_rng(0)
    x = rng.normal(size=500)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0)
        pm.Normal("y", beta * x, 1.0, observed=x)
    oracles = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    functions = oracles._functions
    for function in (functions.rows, functions.loglik_sum, *functions.search.values()):
        assert function._expected_rows == compiled.SETUP_PASSES * 500


def test_the_tier_is_on_only_on_pytensor_3():
    # PyTensor 2's Python linker loops over elements where the estimate assumes NumPy calls.
    on = int(pytensor.__version__.split(".")[0]) >= 3
    assert (compiled.INTERPRETED_SECONDS > 0) == on


def test_elementwise_python_loops_cost_more_per_row(monkeypatch):
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 3.0)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)

    # log1mexp has no NumPy ufunc (nfunc_spec): the Python linker calls it once per element.
    def log1mexp_rows() -> tuple[list, list]:
        q = pt.vector("q", shape=(2,))
        x = pt.matrix("x")
        return [q, x], [pt.log1mexp(-pt.exp(x @ q))]

    def exp_rows() -> tuple[list, list]:
        x = pt.matrix("x")
        return [x], [pt.exp(x).sum(axis=1)]

    looped, vectorised = (
        LazyFunction(build, {}, interpreted_first=True) for build in (log1mexp_rows, exp_rows)
    )

    # A product of three vectors: PyTensor 3 folds np.multiply over them (no Python loop).
    def product_rows() -> tuple[list, list]:
        x, y, z = pt.vector("x"), pt.vector("y"), pt.vector("z")
        return [x, y, z], [x * y * z]

    product = LazyFunction(product_rows, {}, interpreted_first=True)
    looped(np.zeros(2), np.zeros((3, 2)))
    vectorised(np.zeros((3, 2)))
    product(np.ones(3), np.ones(3), np.ones(3))
    assert looped._interpreted_cost[1] >= compiled.SECONDS_PER_PYTHON_LOOP_ROW
    assert vectorised._interpreted_cost[1] < compiled.SECONDS_PER_PYTHON_LOOP_ROW
    assert product._interpreted_cost[1] < compiled.SECONDS_PER_PYTHON_LOOP_ROW


def test_softplus_runs_as_numpy_calls_on_the_python_linker():
    # model/python_linker.py: softplus, which NumPy lacks, is rewritten for the Python linker
    # as max(x, 0) + log1p(exp(-|x|)); its values are NumPy's logaddexp(0, x) to rounding,
    # from exp underflow to overflow (caught if the rewrite were dropped: Python loops
    # counted; or wrong on either side of 0 or at the extremes: values).
    # Built on the Python linker directly: PyTensor 2's tier compiles at the first call.
    interpreted = LazyFunction(_softplus_rows, {}, interpreted_first=True)._interpret()
    x = np.linspace(-800.0, 800.0, 4_001)[:, None] * np.ones((1, 2))
    q = np.array([0.5, 0.5])
    with np.errstate(all="ignore"):
        softplus, total = interpreted(q, x)
    nodes = interpreted.maker.fgraph.apply_nodes
    assert not [node for node in nodes if compiled._loops_in_python(node)]
    np.testing.assert_allclose(softplus, np.logaddexp(0.0, x @ q), rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(total, np.sum(np.logaddexp(0.0, -(x @ q))), rtol=1e-13)


def test_views_and_fixed_sizes_cost_per_call_only():
    # A transpose and a column are views; a (1, 1) gammaln has the graph's size: none of them
    # grows with the rows (caught if any were counted per row).
    def rows_and_views() -> tuple[list, list]:
        x = pt.matrix("x")
        nu = pt.matrix("nu", shape=(1, 1))
        return [x, nu], [x.T[0] + pt.sum(pt.gammaln(nu))]

    interpreted = LazyFunction(rows_and_views, {}, interpreted_first=True)._interpret()
    nodes = interpreted.maker.fgraph.apply_nodes
    per_row = [node for node in nodes if compiled._reads_per_row(node)]
    assert len(per_row) == 1, per_row  # the addition over the column


def test_a_draw_function_compiles_at_its_first_call():
    function = LazyFunction(_softplus_rows, {})
    function(np.zeros(2), np.zeros((3, 2)))
    assert function.compiled


def test_numba_kernels_are_compiled(monkeypatch):
    monkeypatch.setattr(compiled, "INTERPRETED_SECONDS", 3.0)
    monkeypatch.setattr(compiled, "COLD_COMPILE_SECONDS_PER_NODE", 0.0)
    function = LazyFunction(_softplus_rows, {}, interpreted_first=True)
    function(np.zeros(2), np.zeros((3, 2)))
    assert not function.compiled
    kernel = function.numba_kernel()
    assert function.compiled and kernel.n_inputs == 2


@pytest.mark.parametrize(
    ("low", "high", "rtol"), [(1e-8, 1e8, 1e-13), (0.01, 12.0, 1e-13), (-10.5, -0.01, 1e-10)]
)
def test_trigamma_is_scipys(low, high, rtol):
    # The recurrence to x >= 8 and seven Bernoulli terms: one term fewer, or starting the
    # series at x >= 6, fails the 1e-13 (2e-12 measured there). Near the poles of negative x
    # both this and SciPy lose digits to sin(pi x) (2e-11 apart 1e-5 from -7).
    grid = np.geomspace(low, high, 3001) if low > 0 else np.linspace(low, high, 3001)
    grid = grid[grid != np.round(grid)] if low < 0 else grid
    ours = np.array([trigamma(float(x)) for x in grid])
    np.testing.assert_allclose(ours, special.polygamma(1, grid), rtol=rtol)


def test_trigamma_at_its_poles_and_beyond():
    for x in (0.0, -1.0, -7.0, 1e-300, -np.inf, np.inf, np.nan):
        expected = special.polygamma(1, x)
        assert trigamma(x) == pytest.approx(expected, nan_ok=True) or (
            np.isnan(expected) and np.isnan(trigamma(x))
        ), x


def test_trigamma_compiles_for_numba_without_object_mode():
    # Without the lowering, PyTensor warns that Numba runs tri_gamma in object mode, and the
    # graph gets no cache key (compiled again in every process).
    assert register_numba_lowerings()
    x = pt.vector("x")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*object mode.*")
        function = LazyFunction(partial(lambda v: ([v], [pt.polygamma(1, v) * 2.0]), x), {})
        kernel = function.numba_kernel()
    values = np.array([0.3, 2.5, 40.0])
    (out,) = kernel.function(values)
    # PyTensor compiles with fastmath, which may reorder the series' sums.
    np.testing.assert_allclose(out, 2.0 * special.polygamma(1, values), rtol=1e-12)
    assert kernel.cache_key is not None or not pytensor.config.numba__cache

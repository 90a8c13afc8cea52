"""Building a step never copies the user's row data (issue 36, "data at scale").

A float32 ``X`` given as a plain array (a NumPy array or a memory map) stays the model's
constant, float32, and the step's build reads its rows range by range: what the build allocates
beyond what the same build allocates on a small slice of the data must stay below 0.75x the
data's size (a copy is 1x, or 2x upcast). Before the fix the build of ``AusterityMH()``
allocated 2.5x the data on top (the self-check's pass over every row upcast the whole ``X``
to float64; the reference search, the Laplace check and the step each held an int64 stamp
per row, together).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_subsample as pms
import pymc_subsample.model.oracles as oracles_module
import pymc_subsample.model.self_check as self_check_module
from pymc_subsample.kernels.row_sampler import RowSampler, SparseRowSampler
from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.reference_objective import CHUNK
from pymc_subsample.reference_search import _rest_sums

#: 1e6 rows x 10 float32 columns: 40 MB, a copy of which (80 MB once upcast) the test sees at
#: once, in about 10 s per build on two shared cores.
N_ROWS, N_COLUMNS = 1_000_000, 10
#: Rows of the baseline build, whose allocations (compilation, graphs) do not grow with N.
BASELINE_ROWS = 20_000
#: The most the build may allocate on top of the baseline, as a share of the data's bytes. A
#: copy of the rows is 1x (float32) or 2x (upcast to float64); what else the build allocates
#: on all the rows and not on the baseline's, 0.07x at 5e5 rows and 0.31x-0.57x at 1e6 on the
#: same commit from one run to another (the set-up functions' temporaries on PyTensor's
#: Python linker, which tracemalloc counts, where Numba's compiled code allocates outside
#: it), stays below this with room.
MAX_SHARE = 0.75


def _write_data(directory: Path) -> tuple[Path, Path]:
    """Write a logistic regression's float32 X and int8 y as .npy files, 1e5 rows at a time."""
    rng = np.random.default_rng(0)
    beta = np.linspace(-1.0, 1.0, N_COLUMNS)
    x_path, y_path = directory / "X.npy", directory / "y.npy"
    X = np.lib.format.open_memmap(x_path, mode="w+", dtype="float32", shape=(N_ROWS, N_COLUMNS))
    y = np.lib.format.open_memmap(y_path, mode="w+", dtype="int8", shape=(N_ROWS,))
    for start in range(0, N_ROWS, 100_000):
        x = rng.normal(size=(100_000, N_COLUMNS)).astype("float32")
        X[start : start + 100_000] = x
        y[start : start + 100_000] = rng.random(100_000) < 1 / (1 + np.exp(-(x @ beta)))
    X.flush()
    y.flush()
    del X, y
    return x_path, y_path


def _model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=N_COLUMNS)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    return model


def _build(model: pm.Model) -> tuple[pms.AusterityMH, int]:
    """Build ``AusterityMH()`` and return it with its peak traced allocation (bytes).

    The peak is counted from what was traced when the build started, so it holds what the
    build allocated, kept (the step) or freed (its passes' temporaries).
    """
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        with model:
            step = pms.AusterityMH()
        return step, tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def data_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _write_data(tmp_path_factory.mktemp("rows"))


def _measure(kind: str, x_path: Path, y_path: Path) -> dict[str, object]:
    """Build on all the rows untraced, then traced on the first rows and on all of them.

    Run in a fresh process (``__main__`` below): tracemalloc traces the whole process, and
    what other tests compiled or left running in a test worker (a Dask cluster's threads)
    moved the share from 0.26 to 0.54 in one CI run. The untraced first build, on all the
    rows, compiles what the full build compiles (imports, backends, and the set-up
    functions that 1e6 rows send to the compiler at their first call where 20,000 rows keep
    them interpreted), so neither traced build counts a compiler's allocations: with
    PyTensor's caches empty, Numba compiling the search's graph inside the traced build
    counted 33-46 MB (0.84x-1.14x the data) that are not the rows.
    """
    X, y = (np.load(path, mmap_mode="r") for path in (x_path, y_path))
    if kind == "plain array":
        X, y = np.array(X), np.array(y)
    with _model(X, y):
        pms.AusterityMH()
    X_head, y_head = (np.array(rows[:BASELINE_ROWS]) for rows in (X, y))
    baseline = _build(_model(X_head, y_head))[1]
    step, peak = _build(_model(X, y))
    # The oracles read the user's array itself, as float32: no copy, no upcast.
    (covariates,) = [array for array in step.oracles.row_arrays() if array.ndim == 2]
    return {
        "growth": peak - baseline,
        "nbytes": X.nbytes,
        "dtype": str(covariates.dtype),
        "shares_memory": bool(np.shares_memory(covariates, X)),
    }


@pytest.mark.parametrize("kind", ["plain array", "memory map"])
def test_build_allocates_under_half_the_data(kind: str, data_files: tuple[Path, Path]) -> None:
    run = subprocess.run(
        [sys.executable, __file__, kind, *map(str, data_files)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    growth, nbytes = int(result["growth"]), int(result["nbytes"])
    assert growth <= MAX_SHARE * nbytes, (
        f"building AusterityMH() on {nbytes / 1e6:.0f} MB of float32 rows ({kind}) allocated "
        f"{growth / 1e6:.1f} MB more than on {BASELINE_ROWS} rows ({growth / nbytes:.2f}x "
        f"the data; at most {MAX_SHARE}x): a copy of the rows"
    )
    assert result["dtype"] == "float32"
    assert result["shares_memory"]


def test_sparse_sampler_draws_the_row_samplers_rows() -> None:
    """The set-up's sampler (no stamp per row) draws what RowSampler draws, for any sizes."""
    for seed in range(300):
        sizes = np.random.default_rng(seed)
        n_rows = int(sizes.integers(1, 300))
        dense, sparse = RowSampler(n_rows), SparseRowSampler(n_rows)
        rng, again = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(3):
            dense.start_test()
            sparse.start_test()
            drawn = []
            for size in sizes.integers(1, n_rows + 1, size=4):
                drawn.append(sparse.draw(again, size))
                np.testing.assert_array_equal(drawn[-1], dense.draw(rng, size))
                assert sparse.n_taken == dense.n_taken
                np.testing.assert_array_equal(sparse.taken, np.sort(np.concatenate(drawn)))
        assert rng.integers(2**62) == again.integers(2**62)  # the same draws consumed


def test_rest_of_the_rows_sums_as_listed() -> None:
    """The search's last growth reads every row not taken, range by range, as a list would."""
    n_rows = 2 * CHUNK + 300
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n_rows, 2)).astype("float32")
    y = (rng.random(n_rows) < 0.5).astype("int8")
    with pm.Model() as model:
        beta = pm.Normal("beta", shape=2)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), with_gradients=True
    )
    q = np.array([0.3, -0.2])
    taken = np.sort(rng.choice(n_rows, size=n_rows // 3, replace=False))
    rest = np.setdiff1d(np.arange(n_rows), taken)
    found = _rest_sums(oracles, q, taken, newton=True)
    listed = oracles.search_sums(q, rest, with_hessian=True)
    np.testing.assert_allclose(found.loglik, listed.loglik, rtol=1e-10)
    np.testing.assert_allclose(found.gradient, listed.gradient, rtol=1e-10)
    np.testing.assert_allclose(found.outer, listed.outer, rtol=1e-10)
    np.testing.assert_allclose(found.hessian, listed.hessian, rtol=1e-10)


@pytest.mark.parametrize("n_rows", [300, 700])
def test_search_reading_the_rest_finds_the_mode(n_rows: int) -> None:
    """The search's first batch of 200 rows is over half or over a quarter of the rows: its
    next pass reads the rest range by range, and the search ends at the exact mode."""
    rng = np.random.default_rng(n_rows)
    X = rng.normal(size=(n_rows, 2))
    y = X @ np.array([1.0, -0.5]) + rng.normal(size=n_rows)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 10.0, shape=2)
        pm.Normal("y", X @ beta, 1.0, observed=y)
        found = pms.find_reference_point()
    mode = np.linalg.solve(X.T @ X + np.eye(2) / 100, X.T @ y)
    np.testing.assert_allclose(found.q, mode, rtol=1e-8)


def test_exact_gradient_reads_ranges(monkeypatch) -> None:
    """The exact gradient (a trajectory's on small data or without a control variate) sums
    ranges of rows, the prior's gradient once: as one call on every row gives it."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(1_000, 3)).astype("float32")
    y = (rng.random(1_000) < 0.5).astype("int8")
    with pm.Model() as model:
        beta = pm.Normal("beta", 1.0, 2.0, shape=3)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), with_gradients=True
    )
    q = np.array([0.4, -0.3, 0.2])
    whole = oracles.gradient_on_rows(None, temperature=2.0)(q)
    monkeypatch.setattr(oracles_module, "_EXACT_GRADIENT_CHUNK", 300)  # 4 ranges, the last short
    ranges = oracles.gradient_on_rows(None, temperature=2.0)(q)
    np.testing.assert_allclose(ranges, whole, rtol=1e-10)
    p = 1 / (1 + np.exp(-(X.astype("float64") @ q)))
    np.testing.assert_allclose(ranges, X.T @ (y - p) / 2.0 - (q - 1.0) / 4.0, rtol=1e-6)


def test_reduction_over_rows_is_found_without_a_full_pass(monkeypatch) -> None:
    """Beyond the full-pass size, a row's value read among other rows must not change."""
    monkeypatch.setattr(self_check_module, "_FULL_REFERENCE_ROWS", 10)
    X = np.random.default_rng(0).normal(size=(100, 2))
    with pm.Model():
        beta = pm.Normal("beta", shape=2)
        centred = pt.as_tensor(X) - pt.as_tensor(X).mean(0)
        pm.Normal("y", centred @ beta, 1.0, observed=np.zeros(100))
        with pytest.raises(ValueError, match=r"Self-check failed.*read among other rows"):
            pms.AusterityMH()
    with pm.Model():  # the same rows without the reduction pass
        beta = pm.Normal("beta", shape=2)
        pm.Normal("y", pt.as_tensor(X) @ beta, 1.0, observed=np.zeros(100))
        pms.AusterityMH()


def test_a_shared_variable_keeps_the_users_array(data_files: tuple[Path, Path]) -> None:
    """``pytensor.shared(X, borrow=True)``, the form docs/data_beyond_ram.md advises at scale.

    The step must read the user's memory map itself, float32, not a copy; a build that copied
    or upcast the shared variable's value fails here.
    """
    import pytensor

    X = np.load(data_files[0], mmap_mode="r")[:50_000]
    y = np.array(np.load(data_files[1], mmap_mode="r")[:50_000])
    shared = pytensor.shared(X, borrow=True, name="X")
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 2.0, shape=N_COLUMNS)
        pm.Bernoulli("y", logit_p=shared @ beta, observed=y)
        step = pms.AusterityMH()
    (covariates,) = [array for array in step.oracles.row_arrays() if array.ndim == 2]
    assert covariates.dtype == np.float32
    assert np.shares_memory(covariates, X)


if __name__ == "__main__":  # one measurement of test_build_allocates_under_half_the_data
    print(json.dumps(_measure(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))))

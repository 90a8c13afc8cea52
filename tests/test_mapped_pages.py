"""Memory-mapped row data: read in blocks and released, never held whole (issue 36, item 2).

``model/mapped_pages.py`` finds the memory maps under a model's row data and advises the
kernel as the rows are read; ``model/parallel_pass.py`` streams a pass over a map block by
block. These tests read the resident pages of the test's own file from ``/proc/self/smaps``
(Linux): a pass that did not drop its blocks would leave the whole file resident (it was just
written, so every page is in the page cache and a read maps it), which the bounds below
exclude by a factor of three or more. The sums are compared with the same sums on the array
in RAM (same numbers, another order: relative 1e-10).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor
import pytest
from conftest import example_module

import pymc_subsample as pms
import pymc_subsample.model.mapped_pages as mapped_pages
import pymc_subsample.model.oracle_builder as oracle_builder
import pymc_subsample.model.oracles as oracles_module
import pymc_subsample.model.parallel_pass as parallel_pass
import pymc_subsample.reference_search as reference_search
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.model.mapped_pages import mapped_rows
from pymc_subsample.model.oracle_builder import build_oracles

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/smaps")

N_ROWS, N_FEATURES, CHUNK = 40_000, 4, 500


def _write(directory: Path, dtype: str = "float64") -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N_ROWS, N_FEATURES)).astype(dtype)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.linspace(-1.0, 1.0, N_FEATURES))))
    np.save(directory / "X.npy", X)
    np.save(directory / "y.npy", y.astype("int8"))
    return directory / "X.npy", directory / "y.npy"


def _model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=N_FEATURES)
        pm.Bernoulli("y", logit_p=pytensor.shared(X, borrow=True) @ beta, observed=y)
    return model


def _oracles(model: pm.Model):
    return build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), with_gradients=True
    )


def _resident_kib(path: Path) -> int:
    """KiB of ``path``'s pages mapped in this process (every mapping of the file)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and not fields[0].endswith(":"):
                inside = len(fields) >= 6 and fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.fixture
def low_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes stream from 1,000 rows in blocks of 64 KiB of rows; releases every 512 KiB."""
    for module in (parallel_pass, oracles_module, oracle_builder, reference_search):
        monkeypatch.setattr(module, "PARALLEL_ROWS", 1_000)
    monkeypatch.setattr(mapped_pages, "STREAM_BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr(mapped_pages, "RELEASE_BYTES", 1 << 19)
    monkeypatch.setattr(mapped_pages, "RESIDENT_SHARE", 0.0)  # as if beyond RAM


def test_the_maps_under_views_and_shared_values_are_found(tmp_path: Path) -> None:
    x_path, _ = _write(tmp_path)
    X = np.load(x_path, mmap_mode="r")
    shared_value = pytensor.shared(X, borrow=True).get_value(borrow=True)
    for array in (X, X[100:], np.asarray(X), shared_value):
        assert mapped_rows([array]), type(array)
    # In RAM, or a private (copy-on-write) map whose dropped pages would lose the user's writes.
    assert not mapped_rows([np.array(X)])
    assert not mapped_rows([np.load(x_path, mmap_mode="c")])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_streamed_pass_gives_the_sums_and_drops_its_blocks(
    tmp_path: Path, low_thresholds, threads: int
) -> None:
    x_path, y_path = _write(tmp_path)
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    on_disk = _oracles(_model(X, y))
    in_ram = _oracles(_model(np.load(x_path), np.load(y_path)))
    q = np.linspace(-0.5, 0.5, N_FEATURES)
    function = on_disk._functions.full_sums
    on_disk.pages.release_all()  # the build's self-check read every row of this small file
    streamed = parallel_pass.summed_over_ranges(
        function, [q], on_disk.row_arrays(), N_ROWS, CHUNK, on_disk.pages, threads=threads
    )
    in_memory = parallel_pass.summed_over_ranges(
        function, [q], in_ram.row_arrays(), N_ROWS, CHUNK, in_ram.pages, threads=2
    )
    assert streamed is not None and in_memory is not None
    for got, expected in zip(streamed, in_memory, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10)
    file_kib = x_path.stat().st_size // 1024
    # One block (64 KiB) and its read-ahead neighbour may stay; the whole file is 1,250 KiB.
    assert _resident_kib(x_path) <= file_kib // 3


def test_scattered_reads_release_the_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scattered reads from a 16 MB map leave at most ``RELEASE_BYTES`` and one read's pages.

    One read of a row may map up to a page table's 2 MiB (a large folio of the page cache);
    without releases 200 reads map most of the file.
    """
    monkeypatch.setattr(mapped_pages, "RELEASE_BYTES", 1 << 20)
    monkeypatch.setattr(mapped_pages, "RESIDENT_SHARE", 0.0)  # as if beyond RAM
    rng = np.random.default_rng(0)
    n_rows = 1_000_000
    np.save(tmp_path / "X.npy", rng.normal(size=(n_rows, N_FEATURES)).astype("float32"))
    np.save(tmp_path / "y.npy", rng.integers(0, 2, size=n_rows).astype("int8"))
    x_path = tmp_path / "X.npy"
    X, y = np.load(x_path, mmap_mode="r"), np.load(tmp_path / "y.npy", mmap_mode="r")
    oracles = _oracles(_model(X, y))
    q = np.zeros(N_FEATURES)
    oracles.pages.release_all()
    most = 0
    for _ in range(200):
        oracles.loglik_rows(q, rng.integers(0, n_rows, size=1))
        most = max(most, _resident_kib(x_path))
    assert most <= 1024 + 2 * 1024 + 64
    assert x_path.stat().st_size // 1024 > 4 * (1024 + 2 * 1024 + 64)


def test_sampling_from_a_map_draws_what_sampling_in_ram_draws(
    tmp_path: Path, low_thresholds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The advice changes which pages stay resident, never a value: same seed, same draws.

    Beyond RAM the draws read rows in blocks, another test (``tests/test_block_reads.py``);
    here rows one by one, as in RAM, so that only the advice differs.
    """
    monkeypatch.setattr(mapped_pages.MappedRows, "draw_block_rows", lambda self: 1)
    x_path, y_path = _write(tmp_path, dtype="float32")
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    draws = []
    for data in ((X, y), (np.load(x_path), np.load(y_path))):
        with _model(*data):
            idata = pm.sample(
                tune=200, draws=300, chains=1, step=pms.AusterityMH(), random_seed=5,
                progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip
        draws.append(idata.posterior["beta"].values)
    np.testing.assert_allclose(draws[0], draws[1], atol=1e-8)
    assert _resident_kib(x_path) <= x_path.stat().st_size // 1024 // 2


def test_maps_that_fit_in_memory_keep_the_pages_reads_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below ``RESIDENT_SHARE`` of RAM scattered reads are never released; beyond, they are."""
    x_path, _ = _write(tmp_path)
    assert mapped_rows([np.load(x_path, mmap_mode="r")]).keeps_read_pages
    monkeypatch.setattr(mapped_pages, "RESIDENT_SHARE", 1e-12)
    assert not mapped_rows([np.load(x_path, mmap_mode="r")]).keeps_read_pages


def test_the_row_sampler_takes_memory_only_for_the_rows_it_stamps() -> None:
    """A sampler for 1e9 rows (8 GB of stamps) costs the pages of the rows its tests stamp."""

    def anonymous_kib() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
        raise AssertionError("no RssAnon")

    before = anonymous_kib()
    sampler = RowSampler(10**9)
    rng = np.random.default_rng(0)
    for _ in range(50):
        sampler.start_test()
        first, second = sampler.draw(rng, 100), sampler.draw(rng, 100)
        assert np.intersect1d(first, second).size == 0
    # 50 tests stamp 10,000 rows: at most 10,000 pages of 4 KiB (huge pages would take 7 GB).
    assert anonymous_kib() - before <= 48 * 1024


def test_a_map_replaced_by_one_of_another_length_is_refused_before_sampling(
    tmp_path: Path,
) -> None:
    """Covariates set to a longer map while the labels keep N: a clear error, not an IndexError.

    The two arrays are unnamed ``pytensor.shared`` variables, whose lengths a dict keyed by
    name once folded into one entry.
    """
    x_path, y_path = _write(tmp_path, dtype="float32")
    np.save(tmp_path / "X_longer.npy", np.zeros((N_ROWS + 500, N_FEATURES), dtype="float32"))
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 2.0, shape=N_FEATURES)
        covariates = pytensor.shared(X, borrow=True)
        pm.Bernoulli("y", logit_p=covariates @ beta, observed=pytensor.shared(y, borrow=True))
        step = pms.AusterityMH()
        covariates.set_value(np.load(tmp_path / "X_longer.npy", mmap_mode="r"), borrow=True)
        with pytest.raises(ValueError, match=r"different lengths .*40000.*40500"):
            pm.sample(step=step, tune=10, draws=10, chains=1, progressbar=False)


def test_the_data_on_disk_example_samples_in_two_processes(tmp_path: Path) -> None:
    """``examples/data_on_disk.py``: two chains in two processes read the same maps.

    100,000 rows give posterior sds near 0.01; every chain's means must lie within 0.1 of the
    true coefficients (up to 0.65 in size): a chain that did not move, or read other rows,
    fails; the chance of a false failure is below 1e-6.
    """
    data_on_disk = example_module("data_on_disk")
    x_path, y_path, true_beta = data_on_disk.write_rows(tmp_path, 100_000)
    draws, rows, _ = data_on_disk.sample_from_disk(x_path, y_path, draws=400, tune=300)
    assert draws.shape == (2, 400, data_on_disk.FEATURES)
    assert np.all(np.abs(draws.mean(axis=1) - true_beta) < 0.1)
    assert rows.mean() < 10_000

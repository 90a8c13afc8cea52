"""A draw's rows read in blocks where the data are memory maps beyond RAM (issue 36, item 2).

Where the maps' pages leave the process (maps larger than half the machine's memory), each
row a test reads is a read from the disk; the fused draw then samples blocks of the rows of
one page as its units (``model/mapped_pages.MappedRows.draw_block_rows``,
``step_methods/fused_path.block_units``). The tests make a small map count as beyond RAM
(``RESIDENT_SHARE = 0``, as ``tests/test_mapped_pages.py`` does).

- The kernels: a block's rows are a contiguous range, the last one shorter; the sums are
  by block; the units per stage hold ``batch_size`` rows and at least 16 blocks.
- The posterior: a Poisson regression on a memory map, with a covariate of four values, whose
  exact posterior is a sum over 4 cells of the data, on a 241 x 241 grid.
  ``AusterityMH()``, ``MinibatchBarkerMH()`` and ``AusterityMH(control_variate="taylor1")``
  (whose blocks' sums carry the quadratic part of the log ratio) read blocks there (their
  stats say so); both posterior means must be within 4 Monte Carlo standard errors (from
  the chain's ESS) of the grid's and both sds within 10%: a false-failure rate near 3e-4
  per case for the means; the bias they detect is about 0.1 posterior sd. Deliberately
  broken: the decision made with N rows in place of the number of blocks (the population
  the units are drawn from) failed all three cases (checked when written: two means 4.0
  and 4.2 Monte Carlo errors off, one chain whose sds were 2-4% of the exact ones). The
  stopping rule's threshold with N rows in place of the blocks changes only when the test
  stops, not what it decides, and passes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytest
from scipy.special import logsumexp

import pymc_subsample as pms
import pymc_subsample.model.mapped_pages as mapped_pages
from pymc_subsample.kernels.fused import block_rows, block_sums
from pymc_subsample.model.mapped_pages import mapped_rows
from pymc_subsample.step_methods.fused_path import MIN_BLOCK_UNITS, block_units

N_ROWS = 60_000
LEVELS = np.array([-1.0, 0.0, 0.5, 1.5])
PRIOR_SD = 2.0


def test_a_block_is_a_range_of_rows_and_its_value_their_sum():
    rows = block_rows(np.array([2, 0, 4]), 3, 14)
    assert rows.tolist() == [6, 7, 8, 0, 1, 2, 12, 13]  # block 4 holds rows 12 and 13 only
    values = np.arange(rows.size, dtype=float)
    assert block_sums(values, np.array([2, 0, 4]), 3, 14).tolist() == [3.0, 12.0, 13.0]


def test_a_stage_reads_batch_size_rows_of_blocks_and_at_least_sixteen():
    assert block_units(1_000, 1, 100) == (1_000, 100)  # rows themselves
    assert block_units(1_000, 100, 100) == (10, 10)  # all ten blocks
    assert block_units(100_000, 100, 100) == (1_000, MIN_BLOCK_UNITS)
    assert block_units(100_001, 10, 500) == (10_001, 50)


def _write(directory: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(7)
    x = rng.choice(LEVELS, size=N_ROWS)
    y = rng.poisson(np.exp(0.4 + 0.3 * x))
    np.save(directory / "x.npy", x.astype("float32"))
    np.save(directory / "y.npy", y.astype("int32"))
    return directory / "x.npy", directory / "y.npy"


def _exact(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior means and sds of (a, b) on a grid: the likelihood through 4 cells' sums."""
    a = np.linspace(0.3, 0.5, 241)[:, None]
    b = np.linspace(0.2, 0.4, 241)[None, :]
    log_post = -(a**2 + b**2) / (2 * PRIOR_SD**2)
    for level in LEVELS:
        cell = x == level
        eta = a + b * level
        log_post = log_post + y[cell].sum() * eta - cell.sum() * np.exp(eta)
    weights = np.exp(log_post - logsumexp(log_post))
    marginals = [weights.sum(axis=1), weights.sum(axis=0)]
    grids = [a[:, 0], b[0]]
    assert all(m[0] < 1e-9 and m[-1] < 1e-9 for m in marginals)  # the grid holds the mass
    means = np.array([m @ g for m, g in zip(marginals, grids, strict=True)])
    sds = np.array(
        [np.sqrt(m @ (g - mu) ** 2) for m, g, mu in zip(marginals, grids, means, strict=True)]
    )
    return means, sds


@pytest.mark.skipif(sys.platform != "linux", reason="the maps' advice is Linux's madvise")
@pytest.mark.parametrize(
    ("step_class", "settings"),
    [
        (pms.AusterityMH, {}),
        (pms.MinibatchBarkerMH, {}),
        # A first-order control variate leaves the quadratic part to the blocks' sums, where
        # the threshold's scale (the number of blocks) decides draws.
        (pms.AusterityMH, {"control_variate": "taylor1"}),
    ],
    ids=["austerity", "barker", "austerity_taylor1"],
)
def test_blocks_from_a_map_beyond_ram_sample_the_exact_posterior(
    step_class, settings, tmp_path, monkeypatch
):
    monkeypatch.setattr(mapped_pages, "RESIDENT_SHARE", 0.0)  # as if beyond RAM
    x_path, y_path = _write(tmp_path)
    x, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    block = mapped_rows([x, y]).draw_block_rows()
    assert block == 4096 // 4  # the rows of one page of x (float32) and y (int32)
    with pm.Model():
        a = pm.Normal("a", 0.0, PRIOR_SD)
        b = pm.Normal("b", 0.0, PRIOR_SD)
        rate = pm.math.exp(a + b * pytensor.shared(x, borrow=True))
        pm.Poisson("y", rate, observed=pytensor.shared(y, borrow=True))
        step = step_class(**settings)
        assert step.draw_path == "fused", step.draw_path
        idata = pm.sample(
            tune=500, draws=2_000, chains=2, cores=1, step=step, random_seed=3,
            progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    n_data = idata.sample_stats["n_data"].values
    # Every draw after the proposal's check read whole blocks: at least one stage of 16.
    assert np.median(n_data) >= MIN_BLOCK_UNITS * block, np.median(n_data)
    assert np.median(n_data) < N_ROWS / 2  # and not every row
    means, sds = _exact(np.asarray(x), np.asarray(y))
    draws = np.stack([idata.posterior[name].values.ravel() for name in ("a", "b")], axis=1)
    ess = np.array([float(az.ess(idata, var_names=[name])[name]) for name in ("a", "b")])
    z = (draws.mean(axis=0) - means) / (sds / np.sqrt(ess))
    assert np.all(np.abs(z) < 4.0), z
    assert np.all(np.abs(draws.std(axis=0) / sds - 1.0) < 0.1), draws.std(axis=0) / sds

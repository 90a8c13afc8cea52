"""Full-data passes shared among threads give the serial pass's sums (issue 36, item 1).

``model/parallel_pass.py`` splits a pass over every row into ranges summed on several
threads by a Numba driver. These tests lower its row threshold so that a small model takes
the threaded path, and compare with the same sums taken range by range in Python: the sums
are of the same numbers in another order, so they agree to rounding (relative 1e-10). A
driver that skipped or repeated a range would be off by that range's share, about 1/40 here.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_subsample.model.oracle_builder as oracle_builder
import pymc_subsample.model.oracles as oracles_module
import pymc_subsample.model.parallel_pass as parallel_pass
import pymc_subsample.reference_search as reference_search
from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.model.row_data import row_chunks
from pymc_subsample.reference_search import optimise_reference

N_ROWS, N_FEATURES, CHUNK = 40_000, 4, 1_000


def _logistic(order: str = "C", dtype: str = "float64") -> pm.Model:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(N_ROWS, N_FEATURES)).astype(dtype)
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.linspace(-1.0, 1.0, N_FEATURES))))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=N_FEATURES)
        pm.Bernoulli("y", logit_p=np.asarray(X, order=order) @ beta, observed=y)
    return model


def _oracles(model: pm.Model):
    return build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), with_gradients=True
    )


@pytest.fixture
def low_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel_pass, "PARALLEL_ROWS", 1_000)
    monkeypatch.setattr(oracles_module, "PARALLEL_ROWS", 1_000)
    monkeypatch.setattr(oracle_builder, "PARALLEL_ROWS", 1_000)
    monkeypatch.setattr(reference_search, "PARALLEL_ROWS", 1_000)


def _serial(function, q: np.ndarray, oracles) -> list[np.ndarray]:
    totals: list[np.ndarray] | None = None
    for rows in row_chunks(oracles.n_rows, CHUNK):
        outputs = [np.asarray(output) for output in function(q, *oracles._gather(rows))]
        totals = (
            outputs if totals is None else [t + o for t, o in zip(totals, outputs, strict=True)]
        )
    assert totals is not None
    return totals


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_sums_equal_the_serial_sums(low_threshold, dtype: str, threads: int) -> None:
    oracles = _oracles(_logistic(dtype=dtype))
    q = np.linspace(-0.5, 0.5, N_FEATURES)
    function = oracles._functions.full_sums
    threaded = parallel_pass.summed_over_ranges(
        function, [q], oracles.row_arrays(), oracles.n_rows, CHUNK, threads=threads
    )
    assert threaded is not None
    for got, expected in zip(threaded, _serial(function, q, oracles), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_the_pass_stays_serial_where_it_cannot_share(
    monkeypatch: pytest.MonkeyPatch, low_threshold
) -> None:
    """Below the threshold, on one thread, or with data not in C order: None (serial)."""
    q = np.zeros(N_FEATURES)
    oracles = _oracles(_logistic())
    function = oracles._functions.full_sums
    arrays = oracles.row_arrays()
    assert parallel_pass.summed_over_ranges(function, [q], arrays, N_ROWS, CHUNK, threads=1) is None
    fortran = _oracles(_logistic(order="F"))
    assert not all(array.flags.c_contiguous for array in fortran.row_arrays())
    assert (
        parallel_pass.summed_over_ranges(
            fortran._functions.full_sums, [q], fortran.row_arrays(), N_ROWS, CHUNK, threads=2
        )
        is None
    )
    monkeypatch.setattr(parallel_pass, "PARALLEL_ROWS", 10 * N_ROWS)
    assert parallel_pass.summed_over_ranges(function, [q], arrays, N_ROWS, CHUNK, threads=2) is None


def test_the_search_pass_on_every_row_matches_its_minibatch_form(low_threshold) -> None:
    """On every row the scoreless threaded pass returns the search function's sums."""
    oracles = _oracles(_logistic())
    q = np.linspace(-0.5, 0.5, N_FEATURES)
    every_row = oracles.search_sums(q, slice(0, N_ROWS), with_hessian=True)
    listed = oracles.search_sums(q, np.arange(N_ROWS), with_hessian=True)
    np.testing.assert_allclose(every_row.loglik, listed.loglik, rtol=1e-10)
    np.testing.assert_allclose(every_row.gradient, listed.gradient, rtol=1e-10)
    np.testing.assert_allclose(every_row.hessian, listed.hessian, rtol=1e-10)
    np.testing.assert_allclose(oracles.gradient_hessian_sums(q)[1], listed.hessian, rtol=1e-10)


def test_the_search_finds_the_same_mode_threaded(
    monkeypatch: pytest.MonkeyPatch, low_threshold
) -> None:
    oracles = _oracles(_logistic())
    q0 = np.zeros(N_FEATURES)
    threaded = optimise_reference(oracles, q0, rng=np.random.default_rng(3), tol=1e-12)
    for module in (parallel_pass, oracles_module, oracle_builder, reference_search):
        monkeypatch.setattr(module, "PARALLEL_ROWS", 10 * N_ROWS)
    serial = optimise_reference(oracles, q0, rng=np.random.default_rng(3), tol=1e-12)
    assert threaded.converged and serial.converged
    np.testing.assert_allclose(threaded.q, serial.q, atol=1e-8)
    assert threaded.row_sums is not None and serial.row_sums is not None
    np.testing.assert_allclose(threaded.row_sums[1], serial.row_sums[1], rtol=1e-6)


def test_the_threaded_finiteness_check_still_names_the_bad_rows(low_threshold) -> None:
    """A NaN row makes the threaded sum non-finite; the rows are then listed range by range."""
    import pytensor.tensor as pt

    import pymc_subsample as pms

    y = np.zeros(5_000)
    y[[7, 4_321]] = np.nan
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pt.as_tensor(y))
        with pytest.raises(ValueError, match=r"initial point for rows \[7, 4321\] \(2 rows"):
            pms.AusterityMH()


@pytest.mark.parametrize("control_variate", ["taylor2", None])
def test_a_bad_row_is_named_before_sampling_when_the_check_waits_for_a_pass(
    low_threshold, control_variate: str | None
) -> None:
    """On large data the start's check waits for a pass over every row; it still comes.

    With a control variate the search's first pass over every row is not finite and lists
    the rows; without one no such pass is made and the built step checks them itself.
    """
    import pytensor.tensor as pt

    import pymc_subsample as pms

    y = np.zeros(5_000)
    y[[11, 2_222]] = np.inf
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pt.as_tensor(y))
        with pytest.raises(ValueError, match=r"initial point for rows \[11, 2222\] \(2 rows"):
            pms.AusterityMH(control_variate=control_variate)


def test_the_search_pass_checks_the_rows_without_a_pass_of_its_own(
    low_threshold, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's finiteness pass is saved where the search reads every row anyway."""
    import pymc_subsample as pms

    checks: list[int] = []
    check = oracles_module.check_rows_finite
    monkeypatch.setattr(
        oracles_module, "check_rows_finite", lambda *args: checks.append(1) or check(*args)
    )
    with _logistic():
        step = pms.AusterityMH()
    assert step.reference_rows >= N_ROWS  # the search read every row
    assert step.oracles._tracker.finite_pending is None
    assert checks == []
    with _logistic():
        pms.AusterityMH(control_variate=None)
    assert checks == [1]  # no search, no pass: the step checked


def test_the_threaded_loglik_total_is_the_rows_sum(low_threshold) -> None:
    oracles = _oracles(_logistic())
    q = np.linspace(-0.5, 0.5, N_FEATURES)
    total = oracles.loglik_total(q, chunk_size=CHUNK)
    assert total is not None
    np.testing.assert_allclose(total, oracles.loglik_rows(q, slice(0, N_ROWS)).sum(), rtol=1e-10)


def test_the_large_data_search_stops_within_a_tenth_of_an_sd(low_threshold) -> None:
    """From PARALLEL_ROWS rows: tol 1e-2 by default, longer unchecked steps, a smaller cap.

    The point must be within 0.1 posterior sd (Mahalanobis, in the exact mode's precision)
    of the mode found with tol=1e-12, after at most three passes over every row, and the
    control variate's sums must be those of the point returned (exact to rounding).
    """
    oracles = _oracles(_logistic())
    q0 = np.zeros(N_FEATURES)
    found = optimise_reference(oracles, q0, rng=np.random.default_rng(4))
    exact = optimise_reference(oracles, q0, rng=np.random.default_rng(4), tol=1e-12)
    assert found.converged and exact.converged and found.failure is None
    assert found.batch_sizes.count(N_ROWS) <= 3
    assert exact.row_sums is not None and found.row_sums is not None
    precision = -(exact.row_sums[1] + oracles.log_prior_hessian(exact.q))
    offset = found.q - exact.q
    assert np.sqrt(offset @ precision @ offset) <= 0.1
    gradient, hessian = oracles.gradient_hessian_sums(found.q)
    np.testing.assert_allclose(found.row_sums[0], gradient, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(found.row_sums[1], hessian, rtol=1e-8)

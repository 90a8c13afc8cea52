"""Deterministic kernel pieces against hand-computed values, and properties (Hypothesis)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.special import betainc

from pymc_subsample.kernels import (
    RowSampler,
    exact_mh_test,
    sequential_mh_test,
    stage_statistics,
)

KERNELS = Path(__file__).parents[1] / "pymc_subsample" / "kernels"


def test_kernels_import_neither_pymc_nor_pytensor():
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in {"pymc", "pytensor"}, f"{path.name}: {name}"


def _stats(values, shift=0.0, n_rows=10, threshold=0.0):
    d = np.asarray(values, dtype=float) - shift
    return stage_statistics(
        np.array([d.size]), np.array([d.sum()]), np.array([(d * d).sum()]), shift, n_rows, threshold
    )


def test_standard_error_with_finite_population_correction_by_hand():
    # values 1, 2, 3, 4 out of N = 10: s_l^2 = 5/3, s^2 = 5/3 / 4 * (1 - 3/9) = 5/18 (eq. 4).
    # Without the correction (the "missing FPC" mutant) it would be 5/12: this test fails it.
    stats = _stats([1.0, 2.0, 3.0, 4.0], shift=1.7)
    assert stats.mean[0] == pytest.approx(2.5, rel=1e-12)
    assert stats.std_error[0] == pytest.approx(np.sqrt(5 / 18), rel=1e-12)
    assert _stats([1.0, 2.0, 3.0, 4.0], n_rows=4).std_error[0] == 0.0


def test_t_test_error_matches_incomplete_beta():
    # P(T_v > t) = I_{v / (v + t^2)}(v / 2, 1 / 2) / 2, an independent route to the t tail.
    rng = np.random.default_rng(0)
    for n, threshold in [(500, 0.05), (3, -2.0)]:
        values = rng.normal(size=n)
        stats = _stats(values, n_rows=10_000, threshold=threshold)
        se = values.std(ddof=1) / np.sqrt(n) * np.sqrt(1 - (n - 1) / (10_000 - 1))
        t = abs(values.mean() - threshold) / se
        expected = 0.5 * betainc((n - 1) / 2, 0.5, (n - 1) / (n - 1 + t**2))
        assert stats.test_error[0] == pytest.approx(expected, rel=1e-9)


def test_zero_standard_error_decides_unless_mean_is_the_threshold():
    assert _stats([1.0, 1.0], threshold=0.0).test_error[0] == 0.0
    assert np.isnan(_stats([1.0, 1.0], threshold=1.0).test_error[0])


@given(
    st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=40),
    st.floats(0.0, 1.0),
)
@settings(max_examples=50, deadline=None)
def test_stage_statistics_equal_numpy_for_a_shift_inside_the_data(values, position):
    # The kernel shifts by the first stage's mean, which lies within the data's range; a shift
    # far outside it would lose digits to cancellation (Hypothesis found such a case).
    values = np.array(values)
    shift = values.min() + position * (values.max() - values.min())
    stats = _stats(values, shift=shift, n_rows=10**6)
    assert stats.mean[0] == pytest.approx(values.mean(), abs=1e-9)
    n = values.size
    expected_se = values.std(ddof=1) / np.sqrt(n) * np.sqrt(1 - (n - 1) / (10**6 - 1))
    assert stats.std_error[0] == pytest.approx(expected_se, rel=1e-6, abs=1e-9)


def test_stages_inside_one_call_match_stage_by_stage_algorithm_1():
    # The doubling look-ahead must decide at the same stage as Algorithm 1 run stage by stage.
    rng = np.random.default_rng(4)
    data = rng.normal(0.003, 0.05, size=20_000)
    for seed in range(30):
        decision = sequential_mh_test(
            np.random.default_rng(seed),
            lambda idx: data[idx],
            RowSampler(data.size),
            0.0,
            0.05,
            100,
        )
        replay = np.random.default_rng(seed)
        log_u = np.log(replay.uniform())
        threshold = log_u / data.size
        sampler = RowSampler(data.size)
        sampler.start_test()
        order = np.concatenate([sampler.draw(replay, 100 * 2**k) for k in range(8)])
        for stage in range(1, 201):
            seen = data[order[: stage * 100]]
            stats = _stats(seen, n_rows=data.size, threshold=threshold)
            if stats.test_error[0] < 0.05 or stage * 100 == data.size:
                break
        assert decision.n_batches == stage
        assert decision.accepted == (seen.mean() > threshold)
        assert stage * 100 <= decision.n_data < 2 * stage * 100


@given(
    n_rows=st.integers(1, 3000),
    batch=st.integers(1, 700),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_row_sampler_never_repeats_and_exhausts_all_rows(n_rows, batch, seed):
    sampler = RowSampler(n_rows)
    rng = np.random.default_rng(seed)
    for _ in range(2):  # a second test must see every row again
        sampler.start_test()
        drawn = []
        while sampler.n_taken < n_rows:
            rows = sampler.draw(rng, batch)
            assert rows.size == min(batch, n_rows - (sampler.n_taken - rows.size))
            drawn.append(rows)
        drawn = np.concatenate(drawn)
        assert np.array_equal(np.sort(drawn), np.arange(n_rows))
        assert sampler.draw(rng, batch).size == 0


def test_row_sampler_first_batches_are_uniform():
    # Each row's inclusion count over 4000 tests of 2 batches of 30 out of 100 rows is
    # Binomial(4000, 0.6) if sampling is uniform without replacement. A chi-square test on the
    # 100 counts (99 dof) at level 1e-4 has false-failure rate 1e-4 and detects a row
    # over-sampled by 10% (e.g. a biased dedup) with power near 1.
    from scipy.stats import chi2

    sampler = RowSampler(100)
    rng = np.random.default_rng(12)
    counts = np.zeros(100)
    for _ in range(4000):
        sampler.start_test()
        for _ in range(2):
            np.add.at(counts, sampler.draw(rng, 30), 1)
    expected = 4000 * 0.6
    statistic = ((counts - expected) ** 2 / (expected * 0.4)).sum()
    assert statistic < chi2.ppf(1 - 1e-4, 99)


def _constant_rows(value: float):
    return lambda idx: np.full(idx.size, value)


@given(
    values=st.lists(st.floats(-5, 5), min_size=2, max_size=60),
    prior_ratio=st.floats(-3, 3),
    batch=st.integers(2, 20),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=80, deadline=None)
# Found by CI: a spread so small that the kurtosis's squared sum of squares underflowed to 0.
@example(values=[0.0, 0.0, 0.0, 2.591559930483012e-159], prior_ratio=0.0, batch=4, seed=0)
def test_full_data_decision_equals_exact_decision_for_same_uniform(
    values, prior_ratio, batch, seed
):
    data = np.array(values)
    rows = lambda idx: data[idx]  # noqa: E731
    sampler = RowSampler(data.size)
    sequential = sequential_mh_test(
        np.random.default_rng(seed), rows, sampler, prior_ratio, 0.0, batch
    )
    exact = exact_mh_test(np.random.default_rng(seed), rows, data.size, prior_ratio)
    assert sequential.n_data == data.size and sequential.full_data
    assert sequential.accepted == exact.accepted
    u = np.random.default_rng(seed).uniform()
    assert exact.accepted == (data.sum() + prior_ratio > np.log(u))


@pytest.mark.parametrize("bad", [np.nan, -np.inf, np.inf])
def test_nonfinite_log_ratio_rejects_and_is_flagged(bad):
    sampler = RowSampler(50)
    rows = lambda idx: np.where(idx == idx[0], bad, 1.0)  # noqa: E731
    for tolerance in (0.05, 0.0):
        rng = np.random.default_rng(0)
        if tolerance:
            decision = sequential_mh_test(rng, rows, sampler, 0.0, tolerance, 10)
        else:
            decision = exact_mh_test(rng, rows, 50, 0.0)
        assert not decision.accepted and decision.nonfinite_proposal


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_huge_finite_log_ratios_read_on_to_the_exact_decision_without_warnings(sign, recwarn):
    # A diverged trajectory's proposal: finite l_i of 1e200 square to inf, so no stage can
    # decide; the test must read all rows and decide on their (finite) sum, silently.
    sampler = RowSampler(40)
    rows = lambda idx: np.where(idx % 2 == 0, sign * 1e200, 1.0)  # noqa: E731
    decision = sequential_mh_test(np.random.default_rng(0), rows, sampler, 0.0, 0.05, 10)
    assert decision.full_data and decision.n_data == 40 and not decision.nonfinite_proposal
    assert decision.accepted == (sign > 0)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_nonfinite_prior_rejects_without_data():
    decision = sequential_mh_test(
        np.random.default_rng(0), _constant_rows(1.0), RowSampler(10), -np.inf, 0.05, 5
    )
    assert decision[:6] == (False, 0, 0, False, True, -np.inf)
    assert np.isnan(decision.residual_kurtosis)


def test_obvious_decisions_stop_at_first_batch():
    # Every l_i = +1 with zero spread: the first batch decides "accept", l_i = -1 "reject".
    for value, accepted in [(1.0, True), (-1.0, False)]:
        decision = sequential_mh_test(
            np.random.default_rng(3), _constant_rows(value), RowSampler(10_000), 0.0, 0.01, 100
        )
        assert decision.accepted == accepted
        assert (decision.n_data, decision.n_batches, decision.full_data) == (100, 1, False)


@given(
    n_rows=st.integers(4, 400),
    batch=st.integers(4, 60),
    tolerance=st.sampled_from([0.5, 0.05, 0.001]),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_residual_kurtosis_is_the_first_batchs_excess_kurtosis(n_rows, batch, tolerance, seed):
    # The kernel computes it in scalar arithmetic from the first stage's centred squares; scipy's
    # biased Fisher kurtosis of the same values is the reference (agreement to 1e-9 relative
    # detects any wrong moment or normalisation). A heavy-tailed t(3) sample, so values vary.
    from scipy.stats import kurtosis

    data = np.random.default_rng(seed).standard_t(3, size=n_rows)
    first_batch: list[np.ndarray] = []

    def rows(idx):
        if not first_batch:
            first_batch.append(idx.copy())
        return data[idx]

    decision = sequential_mh_test(
        np.random.default_rng(seed), rows, RowSampler(n_rows), 0.1, tolerance, batch
    )
    expected = kurtosis(data[first_batch[0]], fisher=True, bias=True)
    assert decision.residual_kurtosis == pytest.approx(expected, rel=1e-9, abs=1e-9)

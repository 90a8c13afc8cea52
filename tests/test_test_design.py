"""The sequential test's dynamic programme against simulated tests (Korattikara et al. 2014).

Figures 1 and 10 of the paper compare the programme's error ``E(mu_std)`` and data use
``pi-bar(mu_std)`` with simulated sequential tests; eq. 21 gives the error in the acceptance
probability. Here the simulated tests are Algorithm 1 stage by stage, as the fused draw runs it,
with the package's t-test statistics (``stage_statistics``) and a design's per-stage tolerances,
on a population of Gaussian ``l_i``: the comparison checks the programme, the quadrature over u
and the bounds the step runs.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
from pymc_subsample.kernels.design_programme import acceptance_error, operating_characteristics
from pymc_subsample.kernels.design_search import design_test
from pymc_subsample.kernels.stages import stage_statistics
from pymc_subsample.kernels.test_design import ProposalSample, SequentialDesign

N_ROWS = 12_000
POPULATION = np.random.default_rng(11).standard_normal(N_ROWS)
POPULATION = (POPULATION - POPULATION.mean()) / POPULATION.std()  # sigma_l = 1 exactly


def _algorithm_1(
    design: SequentialDesign, values: np.ndarray, threshold: float, n_tests: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run ``n_tests`` tests stage by stage: each one's mean, whether all rows, rows used."""
    n_values = np.minimum(np.arange(1, design.n_stages(N_ROWS) + 1) * design.batch_size, N_ROWS)
    tolerances = design.stage_tolerances(N_ROWS)
    rng = np.random.default_rng(seed)
    means, full, used = np.empty(n_tests), np.empty(n_tests, bool), np.empty(n_tests)
    for k in range(n_tests):
        order = values[rng.permutation(N_ROWS)]
        sums = np.cumsum(order)[n_values - 1]
        squares = np.cumsum(order**2)[n_values - 1]
        stats = stage_statistics(n_values, sums, squares, 0.0, N_ROWS, threshold)
        stage = np.flatnonzero((stats.test_error < tolerances) | (n_values == N_ROWS))[0]
        means[k], full[k], used[k] = stats.mean[stage], n_values[stage] == N_ROWS, n_values[stage]
    return means, full, used / N_ROWS


def _simulate(design: SequentialDesign, mu_std: float, n_tests: int, seed: int):
    """Error rate and mean fraction of rows of ``n_tests`` tests with mu - mu_0 fixed."""
    values = POPULATION + mu_std / math.sqrt(N_ROWS - 1)  # (mu - mu_0) sqrt(N - 1) / sigma_l
    means, full, used = _algorithm_1(design, values, 0.0, n_tests, seed)
    return float(np.mean(~full & (means < 0.0))), float(used.mean())


@pytest.mark.parametrize(
    "design",
    [SequentialDesign(500, 0.05), SequentialDesign(300, 0.02, shape=0.75, max_stages=20)],
    ids=["pocock", "wang-tsiatis-capped"],
)
@pytest.mark.parametrize("mu_std", [0.0, 1.0, 4.0])
def test_programme_matches_simulated_tests(design, mu_std):
    # Figures 1 and 10: 3,000 simulated tests give the error rate within 0.0091 (1 SE at its
    # largest, 0.5) and the mean fraction of rows within 0.006 (sd of a test's fraction <= 0.35);
    # we allow 4.5 SE (false failure 7e-6 per check) plus 0.01 for the t-test's estimated s_l
    # and finite batches, which the programme's Assumptions 1 and 2 idealise. The programme
    # without the drift term of eq. 10 after stage 1 fails the four cases at mu_std 1 and 4
    # (checked).
    n_tests = 3000
    simulated_error, simulated_rows = _simulate(design, mu_std, n_tests, seed=int(10 * mu_std))
    error, rows = operating_characteristics(design, N_ROWS, mu_std)
    error_se = math.sqrt(max(error[0] * (1 - error[0]), 0.01) / n_tests)
    assert abs(simulated_error - error[0]) < 4.5 * error_se + 0.01
    assert abs(simulated_rows - rows[0]) < 4.5 * 0.35 / math.sqrt(n_tests) + 0.01


def test_worst_case_error_is_half_the_chance_of_stopping_early():
    # Eq. 20: E(0) = (1 - P(all rows)) / 2, and a single stage of all rows is exact.
    design = SequentialDesign(1000, 0.1)
    error, rows = operating_characteristics(design, N_ROWS, 0.0)
    stages = np.arange(1, 13) * 1000 / N_ROWS
    # rows = sum_j pi_j P(stop at j) + P(all rows): P(all rows) is between its bounds.
    assert 0.0 < error[0] < 0.5
    assert stages[0] <= rows[0] <= 1.0
    exact_error, exact_rows = operating_characteristics(SequentialDesign(N_ROWS, 0.1), N_ROWS, 0.0)
    assert exact_error[0] == 0.0 and exact_rows[0] == 1.0


@pytest.mark.parametrize(("mean_gap", "log_prior_ratio"), [(-2.0e-4, 0.0), (1.0e-4, -2.0)])
def test_acceptance_error_matches_the_kernel(mean_gap, log_prior_ratio):
    # Eq. 21 against simulated MH steps: 20,000 tests, each with its own u, on rows with mean
    # gap mu and sigma_l = 1, with a loose design (epsilon 0.2) whose
    # Delta is large. Exact MH accepts with P_a = min(1, exp(N mu + psi)); the simulated rate
    # minus P_a must equal the programme's Delta within 4.5 SE (at most 0.0035; false failure
    # 7e-6) plus 0.01 for the t-test's estimates. With the signs of eq. 21's two integrals
    # swapped both cases fail (checked).
    design = SequentialDesign(400, 0.2)
    values = POPULATION + mean_gap
    n_tests = 20_000
    log_u = np.log(np.random.default_rng(5).uniform(size=n_tests))
    accepted = 0
    for k, threshold in enumerate((log_u - log_prior_ratio) / N_ROWS):  # eq. 2
        means, full, _ = _algorithm_1(design, values, threshold, 1, seed=k)
        exact_decision = N_ROWS * values.mean() + log_prior_ratio > log_u[k]
        accepted += bool(exact_decision if full[0] else means[0] > threshold)
    exact = min(1.0, math.exp(N_ROWS * mean_gap + log_prior_ratio))
    sample = ProposalSample.from_estimates(
        np.array([mean_gap]), np.array([1.0]), np.array([log_prior_ratio]), N_ROWS
    )
    delta, _ = acceptance_error(design, N_ROWS, sample)
    rate = accepted / n_tests
    assert abs(delta[0]) > 0.01  # the design is loose enough for Delta to show
    assert abs((rate - exact) - delta[0]) < 4.5 * math.sqrt(rate * (1 - rate) / n_tests) + 0.01


def test_design_meets_its_bound_and_beats_a_fixed_design():
    # The worst-case design (eq. 8) keeps E(0) at most the bound; the average design (eq. 7)
    # keeps the mean |Delta| over its sample at most the bound and, on a sample of easy
    # proposals, reads fewer rows than the worst-case design at the same bound.
    worst = design_test(N_ROWS, 0.02)
    error, _ = operating_characteristics(worst.design, N_ROWS, 0.0)
    assert worst.kind == "worst" and error[0] <= 0.02
    rng = np.random.default_rng(3)
    sample = ProposalSample.from_estimates(
        rng.normal(0.0, 0.05, 60), np.ones(60), np.zeros(60), N_ROWS
    )
    average = design_test(N_ROWS, 0.02, sample)
    delta, _ = acceptance_error(average.design, N_ROWS, sample)
    assert average.kind == "average" and np.mean(np.abs(delta)) <= 0.02
    assert average.predicted_rows < 0.6 * worst.predicted_rows


@pytest.mark.parametrize(
    ("design", "message"),
    [
        (SequentialDesign(1, 0.05), "batch_size must be an integer >= 2"),
        (SequentialDesign(100, 0.0), r"error_tolerance must be in \(0, 0.5\)"),
        (SequentialDesign(100, 0.05, shape=0.2), r"shape must be in \[0.5, 1\]"),
        (SequentialDesign(100, 0.05, max_stages=0), "max_stages must be None or an integer"),
        (pms.OptimalDesign(max_error=0.7), r"max_error must be in \(0, 0.5\)"),
        (pms.OptimalDesign(kind="best"), "kind must be 'average' or 'worst'"),
    ],
)
def test_bad_designs_are_refused(design, message):
    with pm.Model():
        pm.Normal("x", pm.Normal("mu"), 1.0, observed=np.zeros(50))
        with pytest.raises(ValueError, match=message):
            pms.AusterityMH(error_tolerance=design)


def test_the_programme_refuses_what_it_cannot_follow():
    with pytest.raises(ValueError, match="follows at most 10000"):
        operating_characteristics(SequentialDesign(10, 0.05), 200_000, 0.0)


def test_proposal_sample_holds_the_log_acceptance_ratio():
    # mu_std(u) = offset - slope log u is 0 at log u = offset / slope, which must be the exact
    # log acceptance ratio N mu / T + psi (eq. 2), at any temperature.
    sample = ProposalSample.from_estimates(
        np.array([1e-4]), np.array([2.0]), np.array([0.5]), 1000, temperature=4.0
    )
    assert sample.offset[0] / sample.slope[0] == pytest.approx(1000 * 1e-4 / 4.0 + 0.5)
    assert sample.slope[0] == pytest.approx(4.0 * math.sqrt(999) / (1000 * 2.0))

"""The fused draw: its compiled parts against their definitions, and the steps that use it.

Statistical checks state their false-failure rate; each detects the error named beside it.
Mutants checked by hand (``kernels/fused.py`` and the driver of ``step_methods/fused_path.py``
edited, the tests run, the edit undone): the independent proposal's ratio without its
backward term, the Barker correction dropped, the proxies' quadratic term doubled, the prior
ratio negated, the finite-population correction dropped: each fails a test here or in
``test_zero_config.py`` / ``test_prior_ratio.py``.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conjugate import step_end_states
from scipy.special import expit
from scipy.stats import chi2, gamma, kstest, t

import pymc_subsample as pms
from pymc_subsample.kernels import fused
from pymc_subsample.kernels.correction import correction_distribution
from pymc_subsample.kernels.stages import stage_statistics

QUIET = {"progressbar": False, "compute_convergence_checks": False}


def _lower_factor(rng: np.random.Generator, d: int) -> np.ndarray:
    a = rng.normal(size=(d, d))
    return np.linalg.cholesky(a @ a.T + d * np.eye(d))


def test_independent_proposal_ratio_is_its_density_ratio():
    # Deterministic: log N(q | m, LL^T) - log N(q' | m, LL^T) from the returned q'.
    rng = np.random.default_rng(0)
    factor = _lower_factor(rng, 4)
    inverse = np.linalg.inv(factor)
    mean = rng.normal(size=4)
    fused.seed_generator(1)
    for _ in range(20):
        q = rng.normal(size=4)
        q_new, log_ratio = fused.propose(fused.INDEPENDENT, q, 1.0, factor, inverse, mean)
        forward = np.linalg.solve(factor, q_new - mean)
        backward = np.linalg.solve(factor, q - mean)
        assert log_ratio == pytest.approx(0.5 * (forward @ forward - backward @ backward))


def test_random_walk_steps_have_the_proposal_covariance():
    # 40,000 steps: each entry of the sample covariance of (q' - q) / scaling is within 5
    # standard errors of L L^T (false failure below 1e-5 per entry); a step drawn with L^T or
    # without L is off by many.
    rng = np.random.default_rng(2)
    factor = _lower_factor(rng, 3)
    covariance = factor @ factor.T
    fused.seed_generator(3)
    q = np.zeros(3)
    steps = np.array(
        [
            fused.propose(fused.RANDOM_WALK, q, 0.5, factor, np.eye(3), q)[0] / 0.5
            for _ in range(40_000)
        ]
    )
    sample = np.cov(steps.T)
    std_error = np.sqrt((covariance**2 + np.outer(np.diag(covariance), np.diag(covariance))) / 4e4)
    assert np.all(np.abs(sample - covariance) < 5 * std_error)
    assert np.all(np.abs(steps.mean(0)) < 5 * np.sqrt(np.diag(covariance) / 4e4))


def _new_test(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(n_rows, -1, dtype=np.int64), np.zeros(4, dtype=np.int64)


def test_rows_of_a_test_are_distinct_until_all_are_read():
    # Stages of 7, 14, 28, ... rows of N = 100 (the sparse draws, then the shuffled rest):
    # every row exactly once. Then a second test on the same stamps starts with all free.
    stamps, counters = _new_test(100)
    fused.seed_generator(4)
    for _ in range(2):
        fused.start_test(counters, np.zeros(fused.ACCUMULATOR_SIZE))
        first = remaining = np.empty(0, dtype=np.int64)
        seen, size = [], 7
        while counters[2] < 100:
            rows, first, remaining = fused.draw_rows(100, size, stamps, counters, first, remaining)
            seen.extend(rows.tolist())
            size *= 2
        assert sorted(seen) == list(range(100))


def test_first_batches_are_uniform_samples_without_replacement():
    # 20,000 first batches of 5 rows of N = 12 (repeats among proposals are frequent): each
    # row's count is Binomial(20,000, 5/12); a chi-square over the 12 counts at level 1e-5.
    # A sampler that kept the first copy's neighbour, or dropped repeats, fails.
    stamps, counters = _new_test(12)
    fused.seed_generator(5)
    counts = np.zeros(12)
    accumulator = np.zeros(fused.ACCUMULATOR_SIZE)
    empty = np.empty(0, dtype=np.int64)
    for _ in range(20_000):
        fused.start_test(counters, accumulator)
        rows, _, _ = fused.draw_rows(12, 5, stamps, counters, empty, empty)
        assert np.unique(rows).size == 5
        counts[rows] += 1
    expected = 20_000 * 5 / 12
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi2.sf(chi_square * 12 / 7, 11) > 1e-5  # finite-population variance: (N - b) / N


@pytest.mark.parametrize("epsilon", [0.01, 0.2])
def test_stages_decide_where_the_t_test_of_the_python_path_does(epsilon):
    # The same values in calls of 1, 2, 4 stages: the stopping stage, its mean and standard
    # error are those of stages.stage_statistics and Algorithm 1's rule delta < epsilon.
    rng = np.random.default_rng(6)
    n_rows, batch = 5_000, 50
    critical = t.isf(epsilon, np.minimum(np.arange(1, 101) * batch, n_rows) - 1)
    for trial in range(40):
        values = rng.normal(0.01 * (trial - 20), 1.0, size=n_rows)
        threshold = 0.0
        accumulator = np.zeros(fused.ACCUMULATOR_SIZE)
        accumulator[4] = np.nan
        start, size = 0, batch
        while True:
            chunk = values[start : start + size]
            start += chunk.size
            if fused.consume_stages(
                chunk,
                batch,
                n_rows,
                start == n_rows,
                fused.AUSTERITY,
                threshold,
                1.0,
                critical,
                accumulator,
            ):
                break
            size *= 2
        n_values = np.arange(batch, n_rows + 1, batch)
        shift = values[:batch].mean()
        sums = np.cumsum(values - shift)[n_values - 1]
        squares = np.cumsum((values - shift) ** 2)[n_values - 1]
        stats = stage_statistics(n_values, sums, squares, shift, n_rows, threshold)
        stop = np.flatnonzero((stats.test_error < epsilon) | (n_values == n_rows))
        stage = int(stop[0])
        if int(accumulator[7]) != n_rows:  # a call that reached all rows decides on them
            assert int(accumulator[8]) == stage + 1
            assert accumulator[5] == pytest.approx(stats.mean[stage], rel=1e-12)
            assert accumulator[6] == pytest.approx(stats.std_error[stage], rel=1e-9)


def test_a_spread_whose_squares_overflow_reads_on_instead_of_deciding():
    # Finite l_i of +-5e199 around the first stage's mean square past 1e308: the standard
    # error is NaN, which must leave the stage undecided (as stage_statistics does), not
    # count as zero spread. The call that reads all rows then decides on them.
    values = np.where(np.arange(40) % 2 == 0, 1e200, 1.0)
    values[10:20] = 1e200  # stage 2's shifted sum times its mean overflows too: inf - inf
    critical = t.isf(0.05, np.arange(10, 41, 10) - 1.0)
    accumulator = np.zeros(fused.ACCUMULATOR_SIZE)
    accumulator[4] = np.nan
    assert not fused.consume_stages(
        values[:20], 10, 40, False, fused.AUSTERITY, 0.0, 1.0, critical, accumulator
    )
    assert fused.consume_stages(
        values[20:], 10, 40, True, fused.AUSTERITY, 0.0, 1.0, critical, accumulator
    )
    assert int(accumulator[7]) == 40


def _decide(
    test: int, mean: float, std_error: float, n_rows: int, full: bool, sigma: float = 1.0
) -> bool:
    accumulator = np.zeros(fused.ACCUMULATOR_SIZE)
    accumulator[5], accumulator[6] = mean, std_error
    accumulator[7] = n_rows if full else n_rows - 1
    table = correction_distribution(sigma)
    log_u = fused.log_uniform_for(test)
    return fused.finish_decision(
        test,
        False,
        0.0,
        log_u,
        n_rows,
        1.0,
        accumulator,
        np.zeros(4, dtype=np.int64),
        table.support,
        table.cumulative,
        sigma,
        np.zeros(len(fused.RESULT_FIELDS)),
    )


@pytest.mark.parametrize(("variance", "sigma"), [(0.0, 1.0), (0.5, 1.0), (0.3, 1.2), (1.3, 1.2)])
@pytest.mark.parametrize("delta", [-1.0, 0.7, 2.0])
def test_barker_decision_has_the_logistic_acceptance(delta, variance, sigma):
    # The estimate Delta* ~ N(delta, s^2) (its CLT noise, drawn here) with s^2 = variance: the
    # test adds X_nc ~ N(0, sigma^2 - s^2) and X_corr for sigma, so the total noise is logistic
    # and the acceptance rate over 20,000 decisions is 1 / (1 + e^-delta) within 5 standard
    # errors (false failure 6e-7 per case). Without X_corr (Gaussian noise) it is Phi(delta): 8
    # to 11 SEs off. With sigma = 1.2, X_nc's variance taken as 1 - s^2 or the table for
    # sigma = 1 fails the s^2 = 0.3 cases (checked).
    n_rows = 1000
    std_error = np.sqrt(variance) / n_rows
    estimates = delta + np.sqrt(variance) * np.random.default_rng(7).standard_normal(20_000)
    fused.seed_generator(7)
    accepted = [
        _decide(fused.BARKER, estimate / n_rows, std_error, n_rows, False, sigma)
        for estimate in estimates
    ]
    expected = expit(delta)
    assert abs(np.mean(accepted) - expected) < 5 * np.sqrt(expected * (1 - expected) / 20_000)


@pytest.mark.parametrize("delta", [-1.5, -0.3])
def test_full_data_decisions_are_exact_tests(delta):
    # All rows read: the t-test accepts with probability min(1, e^delta) (exact MH) and Barker
    # with 1 / (1 + e^-delta); 20,000 decisions each, 5 standard errors.
    n_rows = 1000
    fused.seed_generator(8)
    for test, expected in ((fused.AUSTERITY, np.exp(delta)), (fused.BARKER, expit(delta))):
        rate = np.mean([_decide(test, delta / n_rows, 0.0, n_rows, True) for _ in range(20_000)])
        assert abs(rate - expected) < 5 * np.sqrt(expected * (1 - expected) / 20_000)


def test_independent_proposal_keeps_a_skewed_posterior():
    # Poisson counts with a Gamma(2, 1) prior on the rate: the posterior is Gamma(2 + sum x,
    # 1 + N), and with N = 6 rows of small counts its log (the sampled coordinate) is skewed,
    # so the Laplace proposal differs from it and its density ratio matters. 2,000 chains
    # start at exact draws and take 10 fused draws of AusterityMH with the independent
    # proposal: the end states must be exact draws (KS test at level 1e-5). Without the
    # proposal's backward term their mean is 7% high and the KS p-value 8e-10.
    x = np.array([0, 1, 0, 2, 0, 1])
    shape, rate = 2.0 + x.sum(), 1.0 + x.size
    with pm.Model():
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.Poisson("x", lam, observed=x)
        step = pms.AusterityMH(proposal="independent", batch_size=2, rng=9)
    assert step.draw_path == "fused" and step.proposal_kind == "independent"
    starts = np.log(gamma.rvs(shape, scale=1 / rate, size=400, random_state=10))
    ends = np.exp(step_end_states(step, starts, 4)[:, 0])
    assert kstest(ends, gamma(shape, scale=1 / rate).cdf).pvalue > 1e-5


def test_draw_path_names_why_a_draw_runs_in_python():
    rng = np.random.default_rng(11)
    y = rng.normal(size=500)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=y)
        assert pms.AusterityMH().draw_path == "fused"
        assert pms.MinibatchBarkerMH(proposal="random_walk").draw_path == "fused"
        assert pms.AusterityMH(fused=False).draw_path == "python: fused=False"
        assert "langevin" in pms.AusterityMH(proposal="langevin").draw_path
        assert pms.AusterityMH(error_tolerance=0).draw_path.startswith("python: ")
        assert pms.MinibatchBarkerMH(error_bound=0.5).draw_path.startswith("python: ")
        assert repr(pms.AusterityMH(proposal="langevin", batch_size=50)) == (
            "AusterityMH(vars=[mu], proposal='langevin', control_variate='taylor2', "
            "batch_size=50, temperature=1, draw_path='python: the langevin proposal runs in "
            "Python')"
        )
        with pytest.raises(ValueError, match="fused must be True or False"):
            pms.AusterityMH(fused="yes")


def test_fused_and_python_paths_agree_on_a_logistic_regression():
    # Same model, both paths, 2 x 1,500 draws each: posterior means agree within 5 combined
    # Monte Carlo standard errors (false failure about 1e-5 per coefficient); rows per draw
    # agree within 30%.
    rng = np.random.default_rng(12)
    X = rng.normal(size=(5_000, 3))
    y = rng.random(5_000) < expit(X @ np.array([0.5, -1.0, 0.25]))
    runs = {}
    for fused_draw in (True, False):
        with pm.Model():
            beta = pm.Normal("beta", 0.0, 2.0, shape=3)
            pm.Bernoulli("y", logit_p=X @ beta, observed=y)
            step = pms.MinibatchBarkerMH(fused=fused_draw, proposal="random_walk")
            runs[fused_draw] = pm.sample(
                1500, tune=500, chains=2, cores=1, step=step, random_seed=13, **QUIET
            )
    means, errors = {}, {}
    for key, idata in runs.items():
        draws = idata.posterior["beta"]
        means[key] = draws.mean(("chain", "draw")).values
        errors[key] = np.array([np.asarray(az.mcse(draws.values[..., k])).item() for k in range(3)])
    combined = np.sqrt(errors[True] ** 2 + errors[False] ** 2)
    assert np.all(np.abs(means[True] - means[False]) < 5 * combined)
    rows = [float(runs[key].sample_stats["n_data"].mean()) for key in (True, False)]
    assert rows[0] == pytest.approx(rows[1], rel=0.3)


def test_fused_draw_reads_the_re_centred_control_variate():
    # recenter="tune" replaces the proxy at the end of tuning (the proposal, given here, stays):
    # the fused draw must read it. Started 3 sds off, a stale reference would leave the draws'
    # reference_distance (computed in the compiled draw) near sqrt(9 d + d) = 5.5; re-centred
    # it is about sqrt(d) = 1.7. Before reading the new state by identity, the first draw
    # after tuning compared the old proxy with the new by value and raised.
    rng = np.random.default_rng(14)
    X = rng.normal(size=(3000, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=3000)
    precision = X.T @ X + np.eye(3) / 100
    mean = np.linalg.solve(precision, X.T @ y)
    sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y)
        step = pms.AusterityMH(
            control_variate="taylor2",
            reference_point={"beta": mean + 3 * sd},
            recenter="tune",
            proposal="random_walk",
            proposal_cov=sd**2,
        )
        assert step.draw_path == "fused"
        idata = pm.sample(draws=300, tune=400, chains=1, step=step, random_seed=15, **QUIET)
    distance = idata.sample_stats["reference_distance"].values[0]
    assert np.mean(distance) < 3.0


@pytest.mark.filterwarnings("ignore:Draws after tuning read")
def test_fused_draw_reads_only_the_rows_its_test_uses():
    # One compiled call per stage: n_data is min(n_batches * batch_size, N) for every draw (the
    # Python path groups stages into calls of 1, 2, 4 and reads up to twice that). Tempered,
    # without a control variate, so that many draws need several stages.
    x = np.random.default_rng(16).normal(1.0, 1.0, size=5_000)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 1.0, observed=x)
        step = pms.MinibatchBarkerMH(
            control_variate=None, temperature=50.0, proposal="random_walk", batch_size=50
        )
        assert step.draw_path == "fused"
        idata = pm.sample(draws=400, tune=200, chains=1, step=step, random_seed=17, **QUIET)
    stats = idata.sample_stats
    n_data, n_batches = stats["n_data"].values[0], stats["n_batches"].values[0]
    assert np.mean(n_batches > 2) > 0.1
    np.testing.assert_array_equal(n_data, np.minimum(n_batches * 50, 5_000))

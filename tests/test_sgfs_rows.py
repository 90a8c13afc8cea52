"""SGFS draws its minibatch i.i.d. with replacement, as gamma = (N + n) / n assumes.

Rows drawn without replacement make the gradient noise smaller by the finite-population factor
(N - n) / (N - 1), so gamma over-corrects and the stationary sds shrink by about sqrt(1 - n/N).
Both tests run the PyMC step at n / N = 1/2 (N = 400, n = 200), where that mutant is off by
29% in sd: one counts repeated rows exactly, the other compares the chain's covariance with the
closed-form stationary covariance of the SGFS update (a linear-Gaussian recursion here).

Mutants checked by hand (in a copy of the package): rows drawn with
``rng.choice(N, n, replace=False)`` fail both tests; a diagonal SGFS noise of the wrong scale
(``sqrt(B / eps)`` for ``sqrt(4 B / eps)``) fails the ``fisher="diagonal"``, eps = 1 case of the
second (``test_sgfs_noise`` checks the noise itself).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pymc as pm
import pytest
from pymc.blocking import DictToArrayBijection, RaveledVars
from scipy.linalg import solve_discrete_lyapunov
from scipy.stats import chi2, norm

import pymc_subsample as pms
from pymc_subsample.kernels.sgfs import sgfs_gamma

N_ROWS, BATCH, PRIOR_SD = 400, 200, 10.0
DATA_COV = np.array([[1.0, 0.5], [0.5, 2.0]])


def _data() -> np.ndarray:
    return np.random.default_rng(20).multivariate_normal([1.0, -1.0], DATA_COV, size=N_ROWS)


_STEPS: dict[str, pms.SGFS] = {}


def _step(fisher: str, step_size: float, seed: int) -> pms.SGFS:
    """The SGFS step on x_i ~ N(mu, S), S known, mu ~ N(0, 10^2 I), as a new chain with ``seed``.

    Written as w_i = L^-1 x_i ~ N(L^-1 mu, I) with S = L L^T (the same posterior; MvNormal's
    per-row gradients are slow on PyMC 5), so that the scores are S^-1 (x_i - mu), linear in
    mu. Compiled once per ``fisher`` in each process.
    """
    whiten = np.linalg.inv(np.linalg.cholesky(DATA_COV))
    if fisher not in _STEPS:
        with pm.Model():
            mu = pm.Normal("mu", 0.0, PRIOR_SD, shape=2)
            pm.Normal("w", pm.math.dot(whiten, mu), 1.0, observed=_data() @ whiten.T)
            _STEPS[fisher] = pms.SGFS(batch_size=BATCH, fisher=fisher, control_variate=None)
    step = _STEPS[fisher]
    step.step_size = step_size
    step.reset_tuning()
    step.rng = np.random.default_rng(seed)
    return step


class _RecordRows:
    """Stand-in for the step's oracles that records the rows of every ``score_rows`` call."""

    def __init__(self, oracles: Any) -> None:
        self._oracles = oracles
        self.batches: list[np.ndarray] = []

    def score_rows(self, q: np.ndarray, idx: np.ndarray) -> np.ndarray:
        self.batches.append(np.array(idx))
        return self._oracles.score_rows(q, idx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._oracles, name)


def _run(step: pms.SGFS, q0: np.ndarray, n_tune: int, n_draws: int) -> np.ndarray:
    """``n_tune`` steps that average the Fisher information, then ``n_draws`` with it frozen."""
    info = DictToArrayBijection.map(step._initial_point).point_map_info
    q = RaveledVars(q0, info)
    draws = np.empty((n_draws, q0.size))
    step.tune = True
    for _ in range(n_tune):
        q, _ = step.astep(q)
    step.tune = False
    for i in range(n_draws):
        q, _ = step.astep(q)
        draws[i] = q.data
    return draws


def test_rows_are_drawn_with_replacement():
    # n = 200 i.i.d. uniform rows of N = 400 hold D = N (1 - (1 - 1/N)^n) = 157.5 distinct rows
    # on average, with sd 4.7 (exact variance of the occupancy count below); the mean of D over
    # 100 steps has a standard error of 0.47 and is tested within 5 of them (two-sided false
    # failure 6e-7, by the CLT). Without replacement D = 200, 91 standard errors away. The pooled
    # counts of the 20,000 rows are also tested for uniformity (chi-square on 399 df at level
    # 1e-6): a sampler that never draws 10% of the rows (chi-square about 2,600) fails it.
    step = _step("full", 100.0, seed=21)
    recorder = _RecordRows(step.oracles)
    step.oracles = recorder
    try:
        _run(step, np.zeros(2), n_tune=1, n_draws=99)
    finally:
        step.oracles = recorder._oracles
    batches = np.array(recorder.batches)
    assert batches.shape == (100, BATCH)
    distinct = np.array([np.unique(batch).size for batch in batches])
    keep = 1 - 1 / N_ROWS
    mean = N_ROWS * (1 - keep**BATCH)
    variance = (
        N_ROWS * (N_ROWS - 1) * (1 - 2 / N_ROWS) ** BATCH
        + N_ROWS * keep**BATCH
        - N_ROWS**2 * keep ** (2 * BATCH)
    )
    z = (distinct.mean() - mean) / np.sqrt(variance / distinct.size)
    assert abs(z) < 5, (
        f"mean distinct rows {distinct.mean():.1f}, expected {mean:.1f} (z = {z:.1f})"
    )
    counts = np.bincount(batches.ravel(), minlength=N_ROWS)
    expected = batches.size / N_ROWS
    chi_square = float(np.sum((counts - expected) ** 2 / expected))
    limit = chi2.isf(1e-6, N_ROWS - 1)  # 548
    assert chi_square < limit, f"row counts not uniform: chi-square {chi_square:.0f} on 399 df"


def _posterior(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact posterior mean and precision ``P = N S^-1 + I / prior_sd^2``."""
    data_precision = np.linalg.inv(DATA_COV)
    precision = N_ROWS * data_precision + np.eye(2) / PRIOR_SD**2
    return np.linalg.solve(precision, data_precision @ x.sum(0)), precision


def _stationary(x: np.ndarray, fisher: np.ndarray, step_size: float) -> list[np.ndarray]:
    """Autocovariances ``A^k V``, k = 0, 1, ..., of the SGFS recursion with ``fisher`` frozen.

    Scores are S^-1 (x_i - q), so with P the posterior precision, m the posterior mean,
    C = 2 M^-1 and M = gamma N I_hat + 4 B / eps, B = gamma N I_hat (the default):

        q' - m = A (q - m) + C (N S^-1 (xbar_batch - xbar) + eta),   A = I - C P,

    with Cov(xbar_batch) = Sigma_x / n for i.i.d. rows (Sigma_x the rows' covariance, divisor
    N) and Cov(eta) = 4 B / eps. The stationary mean is m; the stationary covariance V solves
    V = A V A^T + Q exactly. The list stops where A^k V is below 1e-16 of V.
    """
    fisher = np.diag(fisher) if fisher.ndim == 1 else fisher
    gamma = sgfs_gamma(N_ROWS, BATCH)
    data_precision = np.linalg.inv(DATA_COV)
    preconditioner = gamma * N_ROWS * fisher
    gain = 2 * np.linalg.inv(gamma * N_ROWS * fisher + 4 * preconditioner / step_size)
    score_cov = data_precision @ np.cov(x.T, ddof=0) @ data_precision
    noise = N_ROWS**2 / BATCH * score_cov + 4 * preconditioner / step_size
    transition = np.eye(2) - gain @ _posterior(x)[1]
    lagged = [solve_discrete_lyapunov(transition, gain @ noise @ gain.T)]
    while np.abs(lagged[-1]).max() > 1e-16 * np.abs(lagged[0]).max():
        lagged.append(transition @ lagged[-1])
    return lagged


@pytest.mark.parametrize(
    ("fisher", "step_size"), [("full", 100.0), ("diagonal", 100.0), ("diagonal", 1.0)]
)
def test_stationary_covariance_at_half_the_rows(fisher, step_size):
    # 2000 draws after 100 tuning steps (which average I_hat; the closed form then uses the
    # frozen I_hat). The chain is a VAR(1), Gaussian but for the batch means of 200 rows, with
    # autocovariances gamma(k) = A^k V, so (Bartlett) the sample covariance entry (j, l) over K
    # draws has variance (1 / K) sum_{k in Z} [gamma_jj(k) gamma_ll(k) + gamma_jl(k) gamma_lj(k)]
    # and the mean of coordinate j has variance (1 / K) sum_{k in Z} gamma_jj(k). Each of the 5
    # statistics (3 covariance entries, 2 means) is tested within 5 standard errors: false
    # failure below 5 * 5.7e-7 = 3e-6. At eps = 100 (A's spectral radius about 1/3) a variance
    # has a standard error of 3.7%, so an sd off by 9% fails with probability above 1/2; at
    # eps = 1 (radius 0.87, where the injected noise eta dominates) 9.5%: an sd 21% too large
    # or 28% too small. Rows without replacement shrink the sds by 27% at eps = 100 (z about
    # -13); a diagonal noise sqrt(B / eps) for sqrt(4 B / eps) by 41% at eps = 1 (z about -7).
    x = _data()
    mean = _posterior(x)[0]
    step = _step(fisher, step_size, seed=22)
    draws = _run(step, mean, n_tune=100, n_draws=2000)
    lagged = np.array(_stationary(x, step.fisher, step_size))
    n_draws = draws.shape[0]
    products = lagged[:, [0, 1, 0], [0, 1, 0]] * lagged[:, [0, 1, 1], [0, 1, 1]] + (
        lagged[:, [0, 1, 0], [0, 1, 1]] * lagged[:, [0, 1, 1], [0, 1, 0]]
    )  # entries (0, 0), (1, 1), (0, 1)
    cov_se = np.sqrt((products[0] + 2 * products[1:].sum(0)) / n_draws)
    diagonal = lagged[:, [0, 1], [0, 1]]
    mean_se = np.sqrt((diagonal[0] + 2 * diagonal[1:].sum(0)) / n_draws)
    sample = np.cov(draws.T)
    cov_z = (sample[[0, 1, 0], [0, 1, 1]] - lagged[0][[0, 1, 0], [0, 1, 1]]) / cov_se
    mean_z = (draws.mean(axis=0) - mean) / mean_se
    limit = norm.isf(5.7e-7 / 2)  # 5.0 standard errors
    sd_ratio = np.sqrt(np.diag(sample) / np.diag(lagged[0]))
    assert np.all(np.abs(cov_z) < limit), (
        f"sd / exact stationary sd = {sd_ratio}; z of the covariance entries (0, 0), (1, 1), "
        f"(0, 1) = {cov_z}"
    )
    assert np.all(np.abs(mean_z) < limit), f"z of the means = {mean_z}"

"""Conjugate models with exact posteriors, in pure NumPy, for statistical tests of kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import ndtr
from scipy.stats import kstest

from pymc_subsample.kernels import (
    LangevinProposal,
    RowSampler,
    exact_mh_test,
    sequential_mh_test,
)


@dataclass
class GaussianMean:
    """x_i ~ N(theta, 1), theta ~ N(0, prior_sd^2), likelihood tempered by ``temperature``.

    The tempered posterior is N(post_mean, post_sd^2) with precision N / T + prior_sd^-2.
    """

    x: np.ndarray
    prior_sd: float = 10.0
    temperature: float = 1.0

    @property
    def n_rows(self) -> int:
        return self.x.size

    @property
    def post_sd(self) -> float:
        return float(1.0 / np.sqrt(self.n_rows / self.temperature + self.prior_sd**-2))

    @property
    def post_mean(self) -> float:
        return float(self.x.sum() / self.temperature * self.post_sd**2)

    def log_ratio_rows(self, theta_new: float, theta_old: float):
        # l_i = log N(x_i | theta_new, 1) - log N(x_i | theta_old, 1), untempered
        def rows(idx: np.ndarray) -> np.ndarray:
            return (theta_new - theta_old) * (self.x[idx] - 0.5 * (theta_new + theta_old))

        return rows

    def log_prior_ratio(self, theta_new: float, theta_old: float) -> float:
        return -0.5 * (theta_new**2 - theta_old**2) / self.prior_sd**2

    def minibatch_gradient(self, rows: np.ndarray):
        # grad log prior + (N / (n T)) sum_i (x_i - theta) over the rows (eq. 21 of 2016).
        factor = self.n_rows / (rows.size * self.temperature)
        batch_sum = float(self.x[rows].sum())

        def gradient(theta: np.ndarray) -> np.ndarray:
            return -theta / self.prior_sd**2 + factor * (batch_sum - rows.size * theta)

        return gradient


def standard_gaussian_mean() -> GaussianMean:
    """The exact-start tests' model: 2000 rows x_i ~ N(1, 1), prior N(0, 10^2)."""
    return GaussianMean(np.random.default_rng(0).normal(1.0, 1.0, size=2000))


def pit_pvalue(model: GaussianMean, ends: np.ndarray) -> float:
    """KS p-value of the end states' probability integral transforms against the uniform."""
    return float(kstest(ndtr((ends - model.post_mean) / model.post_sd), "uniform").pvalue)


def tempered_gaussian_mean_data(
    n_rows: int, temperature: float, seed: int
) -> tuple[np.ndarray, float, float]:
    """Rows x_i ~ N(1, 1); the exact mean and sd of mu ~ N(0, 10^2) with likelihood^(1/T)."""
    x = np.random.default_rng(seed).normal(1.0, 1.0, size=n_rows)
    precision = n_rows / temperature + 1 / 100
    return x, x.sum() / temperature / precision, precision**-0.5


#: propose(rng, theta) -> (proposal, log q(theta | proposal) - log q(proposal | theta))
Propose = Callable[[np.random.Generator, float], tuple[float, float]]


def langevin(
    model: GaussianMean, scale_in_sds: float, batch_size: int, *, with_ratio: bool = True
) -> Propose:
    """The minibatch Langevin proposal; ``with_ratio=False`` is a mutant that drops its ratio."""
    proposal = LangevinProposal(1)
    scaling = scale_in_sds * model.post_sd

    def propose(rng: np.random.Generator, theta: float) -> tuple[float, float]:
        rows = rng.integers(0, model.n_rows, size=batch_size)
        new, log_ratio = proposal(rng, np.array([theta]), scaling, model.minibatch_gradient(rows))
        return float(new[0]), log_ratio if with_ratio else 0.0

    return propose


#: decide(rng, log_ratio_rows, sampler, log_prior_ratio) -> a decision with .accepted, .n_data
Decide = Callable[[np.random.Generator, Any, RowSampler, float], Any]


def austerity(
    error_tolerance: float,
    batch_size: int,
    log_ratio_factor: float = 1.0,
    temperature: float = 1.0,
) -> Decide:
    """The Austerity kernel (exact MH at tolerance 0); ``log_ratio_factor`` scales every l_i."""

    def decide(rng, rows, sampler, prior_ratio):
        def scaled(idx):
            return log_ratio_factor * rows(idx)

        if error_tolerance == 0.0:
            return exact_mh_test(rng, scaled, sampler.n_rows, prior_ratio, temperature)
        return sequential_mh_test(
            rng, scaled, sampler, prior_ratio, error_tolerance, batch_size, temperature
        )

    return decide


def run_chains(
    model: GaussianMean,
    decide: Decide,
    *,
    n_chains: int,
    n_steps: int,
    seed: int,
    scale_in_sds: float = 2.38,
    propose: Propose | None = None,
) -> tuple[np.ndarray, float]:
    """Run chains started at exact posterior draws; return end states and mean rows per step.

    The proposal is a random walk of ``scale_in_sds`` posterior sds unless ``propose`` is given.
    Chain c uses ``np.random.default_rng([seed, c])`` for its start, proposals and test, so that
    runs with different kernels share random numbers chain by chain.
    """
    sampler = RowSampler(model.n_rows)
    scale = scale_in_sds * model.post_sd
    ends = np.empty(n_chains)
    rows_used = 0
    for chain in range(n_chains):
        rng = np.random.default_rng([seed, chain])
        theta = model.post_mean + model.post_sd * rng.standard_normal()
        for _ in range(n_steps):
            if propose is None:
                proposal, log_proposal_ratio = theta + scale * rng.standard_normal(), 0.0
            else:
                proposal, log_proposal_ratio = propose(rng, theta)
            decision = decide(
                rng,
                model.log_ratio_rows(proposal, theta),
                sampler,
                model.log_prior_ratio(proposal, theta) + log_proposal_ratio,
            )
            rows_used += decision.n_data
            if decision.accepted:
                theta = proposal
        ends[chain] = theta
    return ends, rows_used / (n_chains * n_steps)


def step_end_states(step: Any, starts: np.ndarray, n_steps: int) -> np.ndarray:
    """End states of chains of a PyMC step's ``astep`` with tuning off, one per row of ``starts``.

    Each chain starts at ``starts[c]`` (the raveled unconstrained point) and continues the
    step's own random stream, so the whole set is reproducible from the step's ``rng``.
    """
    from pymc.blocking import DictToArrayBijection, RaveledVars

    info = DictToArrayBijection.map(step._initial_point).point_map_info
    step.tune = False
    starts = np.asarray(starts, dtype=float)
    if starts.ndim == 1:  # one parameter
        starts = starts[:, None]
    ends = np.empty_like(starts)
    for chain, start in enumerate(starts):
        q = RaveledVars(start.copy(), info)
        for _ in range(n_steps):
            q, _ = step.astep(q)
        ends[chain] = q.data
    return ends


def gaussian_draws_pvalues(draws: np.ndarray, mean: float, sd: float) -> dict[str, float]:
    """Two-sided p-values of three exact tests that ``draws`` are i.i.d. N(mean, sd^2).

    ``shape``: KS of the probability integral transforms against the uniform; ``scale``: the
    sum of squared standardised draws against chi-square(n); ``location``: their sum against
    N(0, n). The last two are far more powerful than KS against a wrong sd or mean.
    """
    from scipy.stats import chi2, norm

    z = (np.asarray(draws, dtype=float) - mean) / sd
    squares = float(np.sum(z**2))
    return {
        "shape": float(kstest(ndtr(z), "uniform").pvalue),
        "scale": float(2 * min(chi2.cdf(squares, z.size), chi2.sf(squares, z.size))),
        "location": float(2 * norm.sf(abs(z.sum()) / np.sqrt(z.size))),
    }


def assert_stays_at_posterior(
    step: Any, post_mean: float, post_sd: float, seed: int, label: str = "posterior's"
) -> None:
    """300 chains started at exact N(post_mean, post_sd^2) draws stay there after 5 steps.

    A stationary kernel keeps the end states i.i.d. from the start law; each of the three
    p-values of :func:`gaussian_draws_pvalues` must exceed 1e-5 (false failure below 3e-5).
    """
    starts = post_mean + post_sd * np.random.default_rng(seed).standard_normal(300)
    ends = step_end_states(step, starts, 5)[:, 0]
    pvalues = gaussian_draws_pvalues(ends, post_mean, post_sd)
    assert min(pvalues.values()) > 1e-5, (
        f"p-values {pvalues}; end-state mean {(ends.mean() - post_mean) / post_sd:+.2f} sds "
        f"from the {label}, sd ratio {ends.std() / post_sd:.2f}"
    )

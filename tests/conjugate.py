"""Conjugate models with exact posteriors, in pure NumPy, for statistical tests of kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pymc_subsample.kernels import RowSampler, exact_mh_test, sequential_mh_test


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
) -> tuple[np.ndarray, float]:
    """Run chains started at exact posterior draws; return end states and mean rows per step.

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
            proposal = theta + scale * rng.standard_normal()
            decision = decide(
                rng,
                model.log_ratio_rows(proposal, theta),
                sampler,
                model.log_prior_ratio(proposal, theta),
            )
            rows_used += decision.n_data
            if decision.accepted:
                theta = proposal
        ends[chain] = theta
    return ends, rows_used / (n_chains * n_steps)

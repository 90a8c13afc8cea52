"""Acceptance tests as parts: the worked example of ``docs/architecture.md`` ("Tests") end to end.

``examples/penalty_test.py`` adds the penalty method (Ceperley and Dewing 1999) from outside
the package: a ``pms.AcceptanceTest`` and one class statement,
``class PenaltyMH(pms.SubsampleMH, test=PenaltyTest)``.

Two checks of its correctness:

- **Detailed balance of the decision.** For a symmetric proposal the acceptance probability
  ``h`` must satisfy ``h(Delta) = exp(Delta) h(-Delta)`` (the reverse move negates every
  ``l_i`` and the prior ratio). On a Gaussian population with ``s^2 = 1`` the penalty method
  gives ``h(0.5) / h(-0.5) = exp(0.5)`` exactly (up to the estimated ``s^2``, whose effect here
  is below 0.1%); without the penalty the ratio is 1.415 instead of 1.649, 14% low. Each ``h``
  is estimated from 20,000 decisions (standard error of the ratio about 0.9%); the tolerance,
  4%, is over 4 standard errors (false-failure rate below 1e-4) and a third of the error of the
  broken test, which fails (checked with the penalty dropped).
- **The posterior.** A one-coefficient logistic regression (20,000 rows) whose posterior is
  computed on a grid of 4,001 points (exact to 1e-6 sd), sampled with the random walk and the
  default control variate. Two chains of 3,000 draws (ESS about 1,300; above 800 asserted):
  mean within 0.15 sd and sd within 10%, at least 4 standard errors each (false-failure rate
  below 1e-4). It fails when the decision drops the prior, proposal and control-variate terms
  (checked: the chain wanders, ESS 2). The residuals' ``s^2`` is about 1e-5 here, so this
  check cannot see the penalty itself: the detailed-balance check does.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace
from typing import ClassVar, NamedTuple

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import example_module
from scipy.special import expit, log_expit, logsumexp

import pymc_subsample as pms
from pymc_subsample.kernels.row_sampler import RowSampler

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}


def test_the_steps_are_made_of_their_tests():
    assert pms.AusterityMH.test_class.__name__ == "SequentialTTest"
    assert pms.MinibatchBarkerMH.test_class.__name__ == "BarkerTest"
    parameters = inspect.signature(pms.AusterityMH).parameters
    assert list(parameters)[:3] == ["vars", "error_tolerance", "batch_size"]
    assert parameters["error_tolerance"].default == 0.001
    assert "error_bound" in inspect.signature(pms.MinibatchBarkerMH).parameters
    stats = pms.MinibatchBarkerMH.stats_dtypes_shapes
    assert {"variance", "clt_error", "scaling", "reference_distance", "warning"} <= set(stats)


def test_a_test_from_outside_makes_a_step_with_its_settings_and_stats():
    penalty = example_module("penalty_test")
    parameters = inspect.signature(penalty.PenaltyMH).parameters
    assert parameters["variance_limit"].default == 1.0
    assert "control_variate" in parameters and "proposal" in parameters
    assert set(penalty.PenaltyDecision._fields) <= set(penalty.PenaltyMH.stats_dtypes_shapes)
    with pm.Model():
        pm.Normal("y", pm.Normal("mu"), 1.0, observed=np.arange(50.0))
        with pytest.raises(TypeError, match=r"PenaltyMH got unexpected .*\['error_tolerance'\]"):
            penalty.PenaltyMH(error_tolerance=0.01)
        with pytest.raises(ValueError, match="variance_limit must be a positive number"):
            penalty.PenaltyMH(variance_limit=0)
        with pytest.raises(TypeError, match="has no acceptance test"):
            pms.SubsampleMH()
        step = penalty.PenaltyMH(variance_limit=0.5)
    assert step.test.variance_limit == 0.5
    assert step.draw_path.startswith("python: the PenaltyTest test has no fused kernel")


def test_a_test_must_declare_the_fields_the_step_reads():
    class OnlyAccepted(NamedTuple):
        accepted: bool

    with pytest.raises(TypeError, match=r"lacks \['n_data', 'full_data', 'delta_star'"):

        class Incomplete(pms.AcceptanceTest):
            decision = OnlyAccepted
            stats: ClassVar = {"accepted": (np.float64, [])}

            def decide(self, step, log_ratio_rows, log_prior_proposal_ratio):
                raise NotImplementedError


def acceptance_rate(test, values: np.ndarray, offset: float, n_decisions: int, seed: int) -> float:
    """Share of accepted decisions of ``test`` on a fixed population of ``l_i``."""
    step = SimpleNamespace(
        rng=np.random.default_rng(seed),
        n_rows=values.size,
        temperature=1.0,
        batch_size=500,
        row_sampler=RowSampler(values.size),
    )
    accepted = [test.decide(step, values.__getitem__, offset).accepted for _ in range(n_decisions)]
    return float(np.mean(accepted))


def test_the_penalty_decision_satisfies_detailed_balance():
    penalty = example_module("penalty_test")
    n_rows, batch = 20_000, 500
    rng = np.random.default_rng(0)
    values = rng.standard_normal(n_rows)
    values -= values.mean()
    # s^2 = (N sd)^2 / n (1 - (n - 1) / (N - 1)) = 1
    values *= 1.0 / (n_rows * math.sqrt((1.0 - (batch - 1) / (n_rows - 1)) / batch))
    test = penalty.PenaltyTest(variance_limit=10.0)
    delta = 0.5  # the log acceptance ratio: N mean(l) = 0, plus the prior ratio
    forward = acceptance_rate(test, values, delta, 20_000, seed=1)
    backward = acceptance_rate(test, -values, -delta, 20_000, seed=2)
    assert forward / backward == pytest.approx(math.exp(delta), rel=0.04)


def test_the_penalty_step_samples_an_exact_posterior():
    penalty = example_module("penalty_test")
    rng = np.random.default_rng(5)
    x = rng.normal(size=20_000)
    y = rng.random(x.size) < expit(0.3 * x)
    grid = np.linspace(0.0, 0.6, 4001)
    # log sigma(b x) where y, log sigma(-b x) where not: one log_expit of b * (+-x) per row.
    signed_x = np.where(y, x, -x)
    log_density = -0.5 * grid**2 + np.array([np.sum(log_expit(b * signed_x)) for b in grid])
    weights = np.exp(log_density - logsumexp(log_density))
    mean = float(weights @ grid)
    sd = math.sqrt(float(weights @ (grid - mean) ** 2))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=beta * x, observed=y)
        idata = pm.sample(
            step=penalty.PenaltyMH(proposal="random_walk"),
            draws=3000,
            tune=500,
            chains=2,
            random_seed=7,
            **SAMPLE,
        )
    draws = idata.posterior["beta"].values
    ess = float(az.ess(idata)["beta"])
    assert ess > 800
    assert abs(draws.mean() - mean) < 0.15 * sd
    assert draws.std() == pytest.approx(sd, rel=0.10)
    stats = idata.sample_stats
    assert int(stats["n_data"].max()) == 100  # one batch per draw
    assert float(stats["variance"].max()) < 1.0

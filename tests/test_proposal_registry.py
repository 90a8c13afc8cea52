"""Proposals as registered parts: the worked example of ``docs/architecture.md`` end to end.

``examples/student_t_proposal.py`` adds ``proposal="student_t_independent"`` from outside the
package (one module, one ``register_proposal`` line): a Student-t with 5 degrees of freedom at
the reference point, shaped by the Laplace covariance. It is not symmetric, so the step must
fold the part's log proposal ratio into its test; dropping it (checked) makes the chain sample
``pi(q) t(q)``, whose sds are about 0.6 of the posterior's.

The exactness test samples a linear regression with known noise (3,000 rows, 3 correlated
coefficients), whose posterior is Gaussian and exact, and on which the second-order control
variate is exact too (every test decides on its first batch without error). With 2 x 3,000
draws the independent chain's ESS exceeds 1,200 (asserted; about 1,700 with Barker's test,
3,000 with the t-test), so a mean is estimated to 0.029 sd and an sd to 2.0% (one standard
error): the tolerances, 0.12 sd and 8%, are 4 standard errors or more (false-failure rate
below 1e-4 per assertion, 12 assertions).
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import example_module

import pymc_subsample as pms
from pymc_subsample.step_methods.proposal_parts import PROPOSAL_PARTS, proposal_names

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}


def gaussian_regression(n_rows: int = 3000, seed: int = 3):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n_rows, 3))
    X = np.column_stack([z[:, 0], 0.9 * z[:, 0] + 0.44 * z[:, 1], z[:, 2]])
    y = X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=n_rows)
    cov = np.linalg.inv(X.T @ X + np.eye(3) / 100.0)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y)
    return model, cov @ X.T @ y, cov


def test_the_builtin_proposals_are_registered_parts():
    assert proposal_names() == ("auto", "random_walk", "langevin", "independent", "hmc")
    assert all(PROPOSAL_PARTS[name].name == name for name in PROPOSAL_PARTS)


@pytest.mark.parametrize("step_class", [pms.AusterityMH, pms.MinibatchBarkerMH])
def test_a_registered_proposal_samples_the_exact_posterior(step_class):
    example = example_module("student_t_proposal")
    model, mean, cov = gaussian_regression()
    with model:
        step = step_class(proposal="student_t_independent")
        idata = pm.sample(step=step, tune=300, draws=3000, chains=2, random_seed=8, **SAMPLE)
    assert step.proposal_kind == "student_t_independent"
    assert isinstance(step.proposal_part, example.StudentTIndependentPart)
    assert isinstance(step.proposal, example.StudentTIndependent)
    assert step.draw_path == "python: the student_t_independent proposal runs in Python"
    assert step.scaling == step._initial_scaling  # scaling_rule "none": nothing tuned
    draws = idata.posterior["beta"].values.reshape(-1, 3)
    sd = np.sqrt(np.diag(cov))
    assert float(az.ess(idata)["beta"].min()) > 1200
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.12)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1.0), 0.08)


def test_a_registered_proposal_is_refused_where_its_obstacle_says():
    example_module("student_t_proposal")
    model, _, _ = gaussian_regression(n_rows=500)
    with model, pytest.raises(ValueError, match="cannot be used here: it needs a control"):
        pms.AusterityMH(proposal="student_t_independent", control_variate=None)
    with model, pytest.raises(ValueError, match="'student_t_independent'"):
        pms.AusterityMH(proposal="student_t")  # the message lists the registered names


@pytest.mark.parametrize("name", ["", "auto", "random_walk"])
def test_register_proposal_refuses_an_empty_or_taken_name(name):
    part = type("Clash", (pms.ProposalPart,), {"name": name})
    with pytest.raises(ValueError, match="needs a new name"):
        pms.register_proposal(part)
    assert PROPOSAL_PARTS["random_walk"].__name__ == "RandomWalkPart"


def test_a_part_built_on_the_random_walk_runs_its_own_proposal():
    # The fused draw compiles the built-in random walk and independent proposals only: a part
    # that reuses the random walk's kernel but proposes its own way (here: never moving,
    # ratio 0) must run on the Python path, where its propose() is called. Fused, the chain
    # would move as a random walk and ignore it.
    from pymc_subsample.step_methods.proposal_parts.random_walk import RandomWalkPart

    class StayingPart(RandomWalkPart):
        name = "staying_walk_for_test"

        def propose(self, step, q):
            return q.copy(), 0.0

    if StayingPart.name not in PROPOSAL_PARTS:
        pms.register_proposal(StayingPart)
    model, _, _ = gaussian_regression()
    with model:
        step = pms.AusterityMH(proposal=StayingPart.name)
        idata = pm.sample(step=step, tune=20, draws=50, chains=1, random_seed=1, **SAMPLE)
    assert step.draw_path.startswith("python:")
    draws = idata.posterior["beta"].values[0]
    np.testing.assert_array_equal(draws, np.broadcast_to(draws[0], draws.shape))

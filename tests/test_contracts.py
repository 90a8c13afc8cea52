"""The steps have every member their parts read through ``step_methods/contracts.py``.

mypy checks that the parts use only :class:`StepView`'s members; this checks the other side,
that a built step (and its test and proposal part) has each of them, which mypy cannot see
through PyMC's untyped base class.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
from pymc_subsample.step_methods.contracts import StepProposal, StepTest, StepView


@pytest.mark.parametrize(
    ("step_class", "proposal"),
    [(pms.AusterityMH, "random_walk"), (pms.MinibatchBarkerMH, "hmc")],
)
def test_a_built_step_has_every_member_of_the_contracts(step_class, proposal):
    y = np.random.default_rng(0).normal(size=200)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=y)
        step = step_class(proposal=proposal, control_variate=None, fused=False)
    assert isinstance(step, StepView)
    assert isinstance(step.test, StepTest)
    assert isinstance(step.proposal_part, StepProposal)

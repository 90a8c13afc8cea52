"""The default steps' group route: ``AusterityMH()`` and ``MinibatchBarkerMH()`` on a hierarchy.

Left at their defaults on a hierarchy the group step takes, both build
:class:`~pymc_subsample.GroupEffectsMH` with their own test and say so once on PyMC's logger;
anywhere else (settings of their own, ``group_effects=False``, a model that is not a
hierarchy, a hierarchy the group step refuses) they are the one-block steps. The sampling
itself is tested against exact posteriors in ``test_group_effects.py`` (both tests) and here
once end to end through ``pm.sample`` with two processes.
"""

from __future__ import annotations

import logging

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
from pymc_subsample import GroupEffectsMH

N_GROUPS = 12


def _hierarchy(coupled: bool = False) -> pm.Model:
    rng = np.random.default_rng(3)
    group = rng.integers(0, N_GROUPS, 3_000)
    y = rng.poisson(np.exp(rng.normal(0.3, 0.5, N_GROUPS)[group]))
    with pm.Model(coords={"group": range(N_GROUPS)}) as model:
        index = pm.Data("g", group)
        mu = pm.Normal("mu", 0.0, 2.0)
        sd = pm.HalfNormal("sd", 1.0)
        a = pm.Normal("a", mu, sd, dims="group")
        if coupled:  # a constraint on the groups' sum: their conditionals no longer factorise
            pm.Normal("total", a.sum(), 1.0, observed=2.0)
        pm.Poisson("y", pm.math.exp(a[index]), observed=y)
    return model


def _regression() -> pm.Model:
    rng = np.random.default_rng(4)
    x = rng.normal(size=2_000)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 5.0, shape=2)
        pm.Normal("y", beta[0] + beta[1] * x, 1.0, observed=1.0 + x + rng.normal(size=x.size))
    return model


@pytest.mark.parametrize(
    ("step_class", "test", "sweeps", "batch_size"),
    [(pms.AusterityMH, "t", 1, 25), (pms.MinibatchBarkerMH, "barker", 3, 8)],
)
def test_defaults_on_a_hierarchy_build_the_group_step_and_say_so(
    step_class, test, sweeps, batch_size, caplog
):
    with _hierarchy(), caplog.at_level(logging.INFO, logger="pymc"):
        step = step_class()
    assert isinstance(step, GroupEffectsMH)
    assert step.test.kind == test
    assert step.sweeps == sweeps  # three with Barker's test: it accepts about half as often
    # Barker's test reads only its estimate's variance; the t-test needs rows for its tails.
    assert step.batch_size == batch_size
    said = [r.getMessage() for r in caplog.records if "group by group" in r.getMessage()]
    assert len(said) == 1, said
    assert step_class.__name__ in said[0] and "'a': 12 groups" in said[0]
    assert "group_effects=False" in said[0]


def test_the_test_settings_pass_to_the_group_step():
    with _hierarchy():
        assert pms.AusterityMH(error_tolerance=0.05).error_tolerance == 0.05
        barker = pms.MinibatchBarkerMH(correction_sd=1.2)
    assert barker.test.correction is not None and barker.test.correction.sigma == 1.2


@pytest.mark.parametrize(
    "settings", [{"group_effects": False}, {"proposal": "random_walk"}, {"batch_size": 200}]
)
def test_settings_of_the_one_block_step_keep_it(settings, caplog):
    with _hierarchy(), caplog.at_level(logging.INFO, logger="pymc"):
        step = pms.AusterityMH(**settings)
    assert type(step) is pms.AusterityMH
    assert not [r for r in caplog.records if "group by group" in r.getMessage()]


def test_a_model_without_groups_keeps_the_one_block_step_silently(caplog):
    with _regression(), caplog.at_level(logging.INFO, logger="pymc"):
        step = pms.AusterityMH()
    assert type(step) is pms.AusterityMH
    assert not [r for r in caplog.records if "group" in r.getMessage()]


def test_a_hierarchy_the_group_step_refuses_says_why(caplog):
    with _hierarchy(coupled=True), caplog.at_level(logging.INFO, logger="pymc"):
        step = pms.AusterityMH()
    assert type(step) is pms.AusterityMH
    said = [
        r.getMessage() for r in caplog.records if "cannot be sampled group by" in r.getMessage()
    ]
    assert len(said) == 1 and "one block" in said[0], said


def test_a_categorical_effect_without_one_value_per_group_says_why_in_one_block(caplog):
    # A ZeroSumNormal's unconstrained value has one entry fewer than the groups: no variable is
    # a group effect, and the message says so (not that every variable is read by group).
    rng = np.random.default_rng(5)
    day = rng.integers(0, 7, 2_000)
    with (
        pm.Model(coords={"day": range(7)}),
        caplog.at_level(logging.INFO, logger="pymc"),
    ):
        effect = pm.ZeroSumNormal("effect", 0.5, dims="day")
        beta = pm.Normal("beta", 0.0, 1.0)
        pm.Poisson("y", pm.math.exp(beta + effect[day]), observed=rng.poisson(1.0, day.size))
        step = pms.AusterityMH()
    assert type(step) is pms.AusterityMH
    said = [r.getMessage() for r in caplog.records if "group by group" in r.getMessage()]
    assert len(said) == 1, said
    assert "no sampled variable holds one value per group" in said[0], said
    assert "reads a variable through a group index" in said[0], said


def test_group_effects_true_refuses_what_the_route_cannot_take():
    with _hierarchy():
        with pytest.raises(TypeError, match="takes no proposal"):
            pms.AusterityMH(group_effects=True, proposal="random_walk")
        with pytest.raises(ValueError, match="must be 'auto', True or False"):
            pms.AusterityMH(group_effects="yes")
    with _regression(), pytest.raises(ValueError, match="group index"):
        pms.AusterityMH(group_effects=True)


def test_a_subclass_is_always_the_one_block_step():
    class MyMH(pms.AusterityMH):
        pass

    with _hierarchy():
        step = MyMH()
        assert type(step) is MyMH
        with pytest.raises(ValueError, match="has no group route"):
            MyMH(group_effects=True)


def test_two_sweeps_propose_every_group_twice():
    with _hierarchy():
        with pytest.raises(ValueError, match="sweeps must be an integer >= 1"):
            GroupEffectsMH(sweeps=0)
        idata = pm.sample(
            draws=100,
            tune=100,
            chains=1,
            step=GroupEffectsMH(test="barker", sweeps=2),
            progressbar=False,
            random_seed=5,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    # Up to two acceptances per group and draw; the rate is per proposal (about 1/2).
    assert stats["n_accepted"].values.max() > N_GROUPS
    assert 0.2 < float(stats["accept_rate"].mean()) < 0.8


def test_the_group_route_samples_in_worker_processes():
    """Two chains in two processes: the group step pickles, and each chain moves."""
    with _hierarchy():
        idata = pm.sample(
            draws=200,
            tune=200,
            chains=2,
            cores=2,
            step=pms.MinibatchBarkerMH(),
            progressbar=False,
            random_seed=5,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    assert stats["n_groups"].values.min() == N_GROUPS
    assert 0.2 < float(stats["accept_rate"].mean()) < 0.8  # Barker's: about 1/2 near Delta = 0
    assert idata.posterior["mu"].std(dim="draw").min() > 0.0


def test_the_one_block_step_keeps_its_route_in_worker_processes():
    """A one-block step rebuilt in a worker (unpickled) does not look for the route again."""
    with _hierarchy():
        step = pms.AusterityMH(group_effects=False)
        idata = pm.sample(
            draws=50,
            tune=50,
            chains=2,
            cores=2,
            step=step,
            progressbar=False,
            random_seed=6,
            compute_convergence_checks=False,
        )
    assert "accepted" in idata.sample_stats and "n_groups" not in idata.sample_stats


@pytest.mark.parametrize("fused", [True, False])
def test_fused_reaches_the_group_step(fused):
    # fused=False is a setting both steps share with the group step: it keeps the route and
    # decides the groups in Python, where it used to send the model to the one-block step.
    with _hierarchy():
        step = pms.AusterityMH(fused=fused)
    assert isinstance(step, GroupEffectsMH)
    assert step.draw_path == ("fused" if fused else "python: fused=False")

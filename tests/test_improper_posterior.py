"""Flat priors the data do not identify: a warning (or, with no data at all, an error) at set-up.

Deterministic checks: the empirical Fisher information of an exactly collinear design is singular
to rounding (smallest correlation eigenvalue ~1e-16, threshold 1e-10), of an identified one far
from it (~0.3 here). On the main before this check, the collinear model gave no warning and the
chain drifted (no test fails there by chance: the assertions are on warnings, not draws).
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_subsample as pms
from pymc_subsample.model.identification import unidentified_coordinates
from pymc_subsample.warnings import SubsampleWarning


@pytest.fixture(scope="module")
def design():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 2))
    y = X[:, 0] - X[:, 1] + rng.normal(size=2000)
    return X, y


def _step_warnings(model: pm.Model, **kwargs) -> list[warnings.WarningMessage]:
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pms.AusterityMH(**kwargs)
    return [w for w in caught if issubclass(w.category, SubsampleWarning)]


def test_collinear_predictor_under_flat_priors_warns_at_the_users_line(design):
    X, y = design
    X3 = np.column_stack([X, X[:, 0] + X[:, 1]])  # the third predictor repeats the first two
    with pm.Model() as model:
        b = pm.Flat("b", shape=3)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("y", X3 @ b, sigma, observed=y)
    caught = _step_warnings(model)
    # The identification check, and the default control variate dropped because the reference
    # search finds no mode (a singular Hessian): both at the user's line.
    identification = [w for w in caught if "probably improper" in str(w.message)]
    assert len(identification) == 1
    message = str(identification[0].message)
    assert "b[0], b[1], b[2]" in message and "sigma" not in message
    assert "proper priors" in message
    assert [w.filename for w in caught] == [__file__] * len(caught)
    assert len(caught) == 2 and "singular" in str(caught[1].message)


def test_identified_flat_regression_does_not_warn(design):
    X, y = design
    with pm.Model() as model:
        b = pm.Flat("b", shape=2)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("y", X @ b, sigma, observed=y)
    assert _step_warnings(model) == []


def test_flat_parameter_outside_the_likelihood_is_named(design):
    _, y = design
    with pm.Model() as model:
        offset = pm.Flat("offset")
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    caught = _step_warnings(model)
    assert "offset has a flat prior" in str(caught[0].message)
    assert len(caught) == 2 and "without its default control variate" in str(caught[1].message)
    # A step over that parameter alone: nothing in the data can move it, refused.
    with model, pytest.raises(ValueError, match=r"offset has a flat prior.*improper"):
        pms.AusterityMH(vars=[offset])


@pytest.mark.parametrize("group_effects", ["auto", False])
def test_flat_hyperparameters_of_a_hierarchy_do_not_warn(group_effects):
    """No row reads a centred hierarchy's mean and scale, but the groups' prior does.

    On the main before this case both flat hyperparameters were named "probably improper",
    under the group step and the one-block step alike.
    """
    rng = np.random.default_rng(2)
    group = rng.integers(0, 8, 1_000)
    with pm.Model() as model:
        mu = pm.Flat("mu")
        tau = pm.HalfFlat("tau")
        a = pm.Normal("a", mu, tau, shape=8)
        pm.Normal("y", a[pm.Data("g", group)], 1.0, observed=rng.normal(size=group.size))
    said = [str(w.message) for w in _step_warnings(model, group_effects=group_effects)]
    assert not [message for message in said if "improper" in message], said
    # A step over the scale alone moves it on the groups' prior: not refused.
    with model:
        pms.AusterityMH(vars=[tau], group_effects=False)


@pytest.mark.parametrize("group_effects", ["auto", False])
def test_a_non_centred_hierarchys_flat_scale_does_not_warn(group_effects):
    """``tau * z[g]``: at the initial point z = 0, and no row changes along tau there.

    The data identify tau everywhere else (the spread of the groups' means). On the main before
    this case, the check read the scores at the initial point and named tau "probably
    improper"; it now reads them at that point jittered.
    """
    rng = np.random.default_rng(3)
    group = rng.integers(0, 12, 3_000)
    x = rng.normal(size=group.size)
    y = 0.3 + 0.5 * rng.normal(size=12)[group] + 0.7 * x + rng.normal(size=group.size)
    with pm.Model() as model:
        mu = pm.Flat("mu")
        tau = pm.HalfFlat("tau")
        z = pm.Normal("z", 0.0, 1.0, shape=12)
        beta = pm.Normal("beta", 0.0, 5.0)
        pm.Normal("y", mu + tau * z[pm.Data("g", group)] + beta * pm.Data("x", x), 1.0, observed=y)
    said = [str(w.message) for w in _step_warnings(model, group_effects=group_effects)]
    assert not [message for message in said if "improper" in message], said


def test_unidentified_coordinates_names_the_flat_direction():
    x = np.random.default_rng(1).normal(size=(50, 3))
    x = np.column_stack([x, 2.0 * x[:, 1] - x[:, 2]])
    assert unidentified_coordinates(x.T @ x, ["a", "b", "c", "d"]) == ["b", "c", "d"]
    assert unidentified_coordinates(x[:, :3].T @ x[:, :3], ["a", "b", "c"]) == []

"""The steps' ``step`` maps points to vectors and back as PyMC's ``ArrayStepShared.step`` does.

``SubsampleStepBase.step`` re-implements PyMC's mapping for speed (a single variable is raveled
without a copy). Both wrappers are given the same deterministic ``astep`` (the vector plus its
positions) on models where the mapping can go wrong: several variables in an order that is not
the model's, variables of other shapes left to another step (shared), and a float32 variable.
A wrong order, shape, dtype or a dropped variable changes the returned point; a write into the
given arrays changes the point passed in, which is checked unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pymc as pm
import pytest
from pymc.blocking import RaveledVars
from pymc.step_methods.arraystep import ArrayStepShared

import pymc_subsample as pms


def _model() -> pm.Model:
    rng = np.random.default_rng(0)
    with pm.Model(coords={"group": ["a", "b", "c"]}) as model:
        mu = pm.Normal("mu", 0.0, 1.0, dims="group")
        sigma = pm.HalfNormal("sigma", 1.0)
        scale = pm.Normal("scale", 0.0, 1.0, shape=(2, 2))
        index = rng.integers(0, 3, 200)
        pm.Normal("y", mu[index] + scale.sum(), sigma, observed=rng.normal(size=200))
    return model


def _shifted(q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
    return RaveledVars(q0.data + np.arange(q0.data.size), q0.point_map_info), [{}]


@pytest.mark.parametrize(
    "names", [["mu"], ["sigma"], ["scale", "mu"], ["scale", "sigma", "mu"], ["scale"]]
)
def test_step_maps_points_as_pymc_does(names: list[str]) -> None:
    model = _model()
    with model:
        step = pms.MinibatchBarkerMH(vars=[model[name] for name in names], fused=False)
    step.astep = _shifted  # type: ignore[method-assign]
    point = {
        name: np.asarray(value + 0.25, dtype=value.dtype)
        for name, value in model.initial_point().items()
    }
    if "scale" in names:  # a float32 variable: the new point keeps the variable's dtype
        point["scale"] = point["scale"].astype(np.float32)
    before = {name: value.copy() for name, value in point.items()}
    ours, _ = step.step(dict(point))
    pymcs, _ = ArrayStepShared.step(step, dict(point))
    assert ours.keys() == pymcs.keys()
    for name in pymcs:
        assert ours[name].dtype == pymcs[name].dtype, name
        assert ours[name].shape == pymcs[name].shape, name
        np.testing.assert_array_equal(ours[name], pymcs[name], err_msg=name)
    for name, value in before.items():
        np.testing.assert_array_equal(point[name], value, err_msg=f"{name} was written into")

"""Warnings reach the user, at the user's line: from worker processes, once; Numba stays quiet.

Mutants checked by hand: without the per-run topic set the cores=2 test sees two warnings;
without ``numba_fallbacks_silenced`` in the oracles' compiler the object-mode test sees one
warning per compiled function.
"""

from __future__ import annotations

import pickle
import sys
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

import pymc_subsample as pms
from pymc_subsample.step_methods.warning_relay import RelayedWarnings
from pymc_subsample.warnings import SubsampleWarning, warn_user

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "random_seed": 1}
FAR = "from the reference point of the control variate"


@pytest.fixture(scope="module")
def normal_model() -> pm.Model:
    y = np.random.default_rng(0).normal(size=60)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def _far_step(model: pm.Model) -> pms.AusterityMH:
    # The posterior sd of mu is 0.13, so every draw after tuning is about 38 sd from the
    # reference point: each chain warns at its first draw after tuning.
    with model:
        return pms.AusterityMH(
            batch_size=10, control_variate="taylor1", reference_point={"mu": 5.0}
        )


def _subsample_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, SubsampleWarning)]


def test_warn_user_points_at_the_calling_line():
    with pytest.warns(SubsampleWarning, match="costly") as record:
        line = sys._getframe().f_lineno + 1
        warn_user("costly")
    assert [(w.filename, w.lineno) for w in _subsample_warnings(record.list)] == [(__file__, line)]


def test_construction_warning_points_at_the_users_line(normal_model):
    with normal_model, pytest.warns(SubsampleWarning, match="batch_size=60 >= N=60") as record:
        line = sys._getframe().f_lineno + 1
        pms.AusterityMH(batch_size=60)
    assert [(w.filename, w.lineno) for w in _subsample_warnings(record.list)] == [(__file__, line)]


def test_sampling_warning_points_at_the_sample_line(normal_model):
    step = _far_step(normal_model)
    with normal_model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        pm.sample(draws=5, tune=5, chains=1, cores=1, step=step, **SAMPLE)
    far = [w for w in _subsample_warnings(caught) if FAR in str(w.message)]
    assert [(w.filename, w.lineno) for w in far] == [(__file__, line)]


def test_worker_warning_reaches_the_parent_once(normal_model):
    # Both worker processes warn; the parent shows one warning, at the pm.sample line, and the
    # relay leaves nothing in the returned stats.
    step = _far_step(normal_model)
    with normal_model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        idata = pm.sample(draws=5, tune=5, chains=2, cores=2, step=step, **SAMPLE)
    far = [w for w in _subsample_warnings(caught) if FAR in str(w.message)]
    assert [(w.filename, w.lineno) for w in far] == [(__file__, line)]
    assert "warning" not in idata.sample_stats
    # A second run of the same step warns again.
    with normal_model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.sample(draws=5, tune=5, chains=2, cores=2, step=step, **SAMPLE)
    assert len([w for w in _subsample_warnings(caught) if FAR in str(w.message)]) == 1


def test_worker_warning_obeys_the_error_filter(normal_model):
    step = _far_step(normal_model)
    with normal_model, warnings.catch_warnings():
        warnings.simplefilter("error", SubsampleWarning)
        with pytest.raises(SubsampleWarning, match=FAR):
            pm.sample(draws=5, tune=5, chains=2, cores=2, step=step, **SAMPLE)


def test_relayed_warnings_are_issued_when_unpickled():
    relayed = RelayedWarnings((("test-topic", "relayed once"), ("test-topic", "relayed twice")))
    assert str(relayed) == "relayed once\nrelayed twice"
    with pytest.warns(SubsampleWarning, match="relayed once") as record:
        stat = pickle.loads(pickle.dumps(relayed))
    assert stat is None
    assert len(_subsample_warnings(record.list)) == 1


def test_numba_object_mode_warnings_do_not_leak():
    pytest.importorskip("numba")
    # polygamma has no Numba implementation: PyTensor runs it in object mode, and says so.
    x = pt.dvector("x")
    with pytest.warns(UserWarning, match="object mode"):
        pytensor.function([x], pt.polygamma(2, x), mode="NUMBA")
    y = np.random.default_rng(0).normal(size=40)
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0)
        pm.Normal("y", pt.polygamma(2, 2.0 + a**2), 1.0, observed=y)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = pms.AusterityMH(
            batch_size=40, compile_kwargs={"mode": "NUMBA"}, control_variate=None
        )
        pm.sample(draws=3, tune=3, chains=1, step=step, **SAMPLE)
    assert not [w for w in caught if "object mode" in str(w.message)]
    # Our own warnings still pass, at the user's line.
    assert [w.filename for w in _subsample_warnings(caught)] == [__file__]

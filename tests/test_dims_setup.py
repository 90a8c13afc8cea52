"""Models written with coords/dims and pm.Data set up like frozen ones (issue 13).

With dims, the value variables' lengths are symbolic, so the raveled parameter vector ``q`` had
an unknown length; on PyTensor 2.38 a shape rewrite of the Hessian sums then made the graph
cyclic and compiling never ended (past 15 minutes and 18 GB). The oracles now give ``q`` its
static length, and the control-variate functions of a dims model equal the frozen model's.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pymc as pm
import pytest
from pymc.model.transform.optimization import freeze_dims_and_data
from pytensor.compile.mode import Mode

from pymc_subsample.model.compiled import LazyFunction
from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.model.oracles import ModelOracles

N_ROWS, N_FEATURES = 300, 3
NAMES = ("alpha", "beta")
#: The full rewrites (where the stall was) without the C or Numba compilation: seconds, not a
#: minute, on a cold cache.
REWRITE_ONLY = Mode(linker="py", optimizer="fast_run")


def dims_model() -> pm.Model:
    """Logistic regression in the style of the PyMC examples: coords, pm.Data and dims."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N_ROWS, N_FEATURES))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(0.3 + X @ np.array([1.0, -0.5, 0.2])))))
    coords = {"obs": range(N_ROWS), "feature": ["a", "b", "c"]}
    with pm.Model(coords=coords) as model:
        X_data = pm.Data("X", X, dims=("obs", "feature"))
        y_data = pm.Data("y", y, dims="obs")  # integer data, cast to the Bernoulli's dtype
        alpha = pm.Normal("alpha", 0.0, 5.0)
        beta = pm.Normal("beta", 0.0, 1.0, dims="feature")
        pm.Bernoulli(
            "y_obs", p=pm.math.invlogit(alpha + X_data @ beta), observed=y_data, dims="obs"
        )
    return model


def oracles_for(model: pm.Model, proxy_order: int) -> ModelOracles:
    # Same variable order in both models (freeze_dims_and_data may reorder value_vars).
    vars = [model.rvs_to_values[model[name]] for name in NAMES]
    return build_oracles(
        model,
        vars,
        initial_point=model.initial_point(),
        proxy_order=proxy_order,
        compile_kwargs={"mode": REWRITE_ONLY},
    )


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Fail instead of hanging when graph rewriting does not finish (a pure-Python loop)."""

    def stop(signum: int, frame: object) -> None:
        raise _TimeLimit

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    except _TimeLimit:
        pytest.fail(f"building the oracles took more than {seconds} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class _TimeLimit(BaseException):
    """Not an ``Exception``: PyTensor's rewriters catch and log those, and go on."""


@pytest.fixture(scope="module")
def dims_oracles() -> ModelOracles:
    if not hasattr(signal, "SIGALRM"):
        pytest.skip("needs SIGALRM for the time limit")
    model = dims_model()
    assert model.rvs_to_values[model["beta"]].type.shape == (None,)  # dims: symbolic length
    with time_limit(120):  # before the fix: never finished on PyTensor 2.38
        oracles = oracles_for(model, proxy_order=2)
        for function in _control_variate_functions(oracles):
            function.compile()  # functions compile at first use: compile them here, timed
        return oracles


def _control_variate_functions(oracles: ModelOracles) -> tuple[LazyFunction, ...]:
    functions = oracles._functions
    return (functions.rows, functions.residual[2], functions.sums)


def test_dims_model_parameter_vectors_have_static_length(dims_oracles):
    # Before the fix (PyTensor 3, which did not stall): every q input had shape (None,).
    for function in _control_variate_functions(dims_oracles):
        q_input = function.compile().maker.fgraph.inputs[0]
        assert q_input.type.shape == (1 + N_FEATURES,)


def test_dims_model_taylor2_matches_frozen_model(dims_oracles):
    dims = dims_oracles
    frozen = oracles_for(freeze_dims_and_data(dims_model()), proxy_order=2)
    rng = np.random.default_rng(0)
    q_ref = np.array([0.3, 1.0, -0.5, 0.2])
    q_old = q_ref + rng.normal(scale=0.1, size=4)
    q_new = q_old + rng.normal(scale=0.05, size=4)
    idx = np.sort(rng.choice(N_ROWS, size=50, replace=False)).astype("int64")

    np.testing.assert_allclose(
        dims.residual_ratio_rows(q_new, q_old, q_ref, idx),
        frozen.residual_ratio_rows(q_new, q_old, q_ref, idx),
        rtol=1e-10,
        atol=1e-12,
    )
    for got, expected in zip(
        dims.gradient_hessian_sums(q_ref, chunk_size=128),
        frozen.gradient_hessian_sums(q_ref, chunk_size=128),
        strict=True,
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-10)
    np.testing.assert_allclose(dims.log_prior_hessian(q_ref), frozen.log_prior_hessian(q_ref))
    np.testing.assert_allclose(
        dims.score_rows(q_ref, idx), frozen.score_rows(q_ref, idx), rtol=1e-10
    )

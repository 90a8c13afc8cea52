"""Control variates in the likelihood's parameters (``model/likelihood_parameters.py``).

A non-centred hierarchy's rows read ``a = mu + sd * z``, not ``mu``, ``sd`` and ``z``: Taylor
proxies in ``theta = (a, b)`` are exact for a Gaussian likelihood with known noise, where those
in ``q`` are not (``a`` is not linear in ``log sd`` and ``z``). These checks are deterministic
(no sampling); tests/test_hierarchical.py samples the default step on a tall non-centred model.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

from pymc_subsample.kernels.control_variates import TaylorProxy
from pymc_subsample.model.oracle_builder import build_oracles

N_GROUPS, N_ROWS = 6, 600


def _known_noise_model() -> pm.Model:
    rng = np.random.default_rng(4)
    group = rng.integers(0, N_GROUPS, N_ROWS)
    x = rng.normal(size=N_ROWS)
    y = rng.normal(0.0, 0.5, N_GROUPS)[group] + 0.7 * x + rng.normal(size=N_ROWS)
    with pm.Model(coords={"group": np.arange(N_GROUPS)}) as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        sd = pm.HalfNormal("sd", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        b = pm.Normal("b", 0.0, 1.0)
        pm.Normal("y", (mu + sd * z)[group] + b * x, 1.0, observed=y)
    return model


def _points(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return tuple(rng.normal(0.0, 0.7, size) for _ in range(3))  # type: ignore[return-value]


def test_second_order_proxies_in_the_likelihood_parameters_are_exact_for_gaussian_rows():
    # theta = (a, b): 7 entries for q's 9. The rows' residuals vanish to rounding in theta
    # (< 1e-9), not in q (> 1e-2, from the curvature of sd * z); in both spaces the proxies'
    # exact sum plus the residuals' sum is the log-likelihood difference.
    model = _known_noise_model()
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=2
    )
    likelihood = oracles.in_likelihood_parameters()
    assert likelihood is not None and likelihood.expansion_size == N_GROUPS + 1
    q_ref, q_new, q_old = _points(oracles.n_params)
    rows = np.arange(N_ROWS)
    change = float(oracles.loglik_ratio_rows(q_new, q_old, rows).sum())
    for space, largest in ((likelihood, 1e-9), (oracles, None)):
        reference = space.expansion_point(q_ref)
        residuals = space.residual_ratio_rows(q_new, q_old, reference, rows)
        if largest is None:
            assert np.max(np.abs(residuals)) > 1e-2
        else:
            assert np.max(np.abs(residuals)) < largest
        gradient_sum, hessian_sum = space.gradient_hessian_sums(reference)
        proxy = TaylorProxy(reference, gradient_sum, hessian_sum, order=2)
        exact = proxy.difference(space.expansion_point(q_new), space.expansion_point(q_old))
        assert exact + residuals.sum() == pytest.approx(change, rel=1e-9, abs=1e-9)


def test_trajectory_gradient_in_the_likelihood_parameters_is_exact_for_gaussian_rows():
    # The trajectory's estimate from 20 rows: their remainders (zero here) plus the expansion's
    # exact gradient taken back to q by J_phi(q)^T, against the full-data gradient.
    model = _known_noise_model()
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=2
    )
    likelihood = oracles.in_likelihood_parameters()
    assert likelihood is not None
    q_ref, q, _ = _points(oracles.n_params)
    reference = likelihood.expansion_point(q_ref)
    gradient_sum, hessian_sum = likelihood.gradient_hessian_sums(reference)
    rows = np.random.default_rng(6).integers(0, N_ROWS, 20)
    remainders = likelihood.remainder_gradient_on_rows(rows, reference)(q)
    expansion = gradient_sum + hessian_sum @ (likelihood.expansion_point(q) - reference)
    estimate = remainders + likelihood.expansion_pullback(q, expansion)
    exact = oracles.gradient_on_rows(None)(q)
    np.testing.assert_allclose(estimate, exact, rtol=1e-9, atol=1e-9)


def test_a_model_read_through_q_itself_has_no_smaller_space():
    # A regression reads its coefficients directly: theta is q (no fewer entries), and the
    # step keeps its proxies in q.
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, 3))
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Normal("y", x @ beta, 1.0, observed=x @ np.ones(3) + rng.normal(size=300))
    oracles = build_oracles(model, model.value_vars, initial_point=model.initial_point())
    likelihood = oracles.in_likelihood_parameters()
    assert likelihood is None or likelihood.expansion_size == oracles.n_params

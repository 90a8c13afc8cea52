"""Control variates at temperature T = 4: the proxies' exact sum enters the test as R / T.

The difference estimator writes the tempered log-likelihood ratio as
``(sum_i (l_i - r_i) + R) / T``; the tests see the residuals, and the step adds ``R / T`` to
their threshold (``ControlVariate.log_threshold_shift``). Every other test of control variates
runs at T = 1, where ``R`` and ``R / T`` coincide. Here, on a conjugate Gaussian mean
(``GaussianMean`` with N = 2000 and T = 4, tempered posterior sd sqrt(T / N) = 0.045), the
reference point sits 1 posterior sd from the mode, so that the first-order sum ``G^T a`` is
not negligible (at the mode it is only the prior's gradient): an untempered ``R`` then shifts
the log acceptance ratio by ``(1 - 1/T) R``, of which the first-order part alone is about 4.5
for a proposal of 1.5 sds.

Mutant checked by hand (in a copy of the package): ``log_threshold_shift`` returning ``R``
instead of ``R / T`` fails both tests.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conjugate import GaussianMean, assert_stays_at_posterior, step_end_states

import pymc_subsample as pms

TEMPERATURE = 4.0


def _model() -> GaussianMean:
    x = np.random.default_rng(40).normal(1.0, 1.0, size=2000)
    return GaussianMean(x, prior_sd=10.0, temperature=TEMPERATURE)


def _pymc_model(model: GaussianMean) -> pm.Model:
    with pm.Model() as pymc_model:
        mu = pm.Normal("mu", 0.0, model.prior_sd)
        pm.Normal("x", mu, 1.0, observed=model.x)
    return pymc_model


def _reference(model: GaussianMean) -> dict[str, np.ndarray]:
    return {"mu": np.array(model.post_mean + model.post_sd)}


def test_tempered_zero_tolerance_is_exact_mh():
    # Exact: with error_tolerance=0 the Austerity step sums all residuals (first-order proxies)
    # and adds R / T, which must give the decisions of exact MH on the tempered posterior
    # without control variates, on the same random stream (the paths agree to float rounding
    # of the sums). The second-order proxies are checked by the next test.
    model = _model()
    cov = np.array([[model.post_sd**2]])
    with _pymc_model(model):
        plain = pms.AusterityMH(
            error_tolerance=0,
            batch_size=100,
            temperature=TEMPERATURE,
            proposal_cov=cov,
            rng=41,
            proposal="random_walk",
        )
        control = pms.AusterityMH(
            error_tolerance=0,
            batch_size=100,
            temperature=TEMPERATURE,
            proposal_cov=cov,
            control_variate="taylor1",
            reference_point=_reference(model),
            rng=41,
            proposal="random_walk",
        )
    start = np.full((1, 1), model.post_mean)
    paths = []
    for step in (plain, control):
        path = [start[0]]
        for _ in range(200):
            path.append(step_end_states(step, path[-1][None], 1)[0])
        paths.append(np.concatenate(path))
    moves = np.count_nonzero(np.diff(paths[0]))
    assert 40 < moves < 160, f"{moves} of 200 proposals accepted: the test would see little"
    np.testing.assert_allclose(paths[1], paths[0], rtol=1e-12, err_msg="paths differ")


@pytest.mark.filterwarnings("ignore:The chain reached squared Mahalanobis distance")
def test_tempered_exact_start_is_stationary():
    # 300 chains start at exact draws of the tempered posterior N(post_mean, post_sd^2) and take
    # 5 steps of the subsampling Barker test (50-row batches, second-order proxies, proposals of
    # 1.5 posterior sds). The residuals of a Gaussian mean are equal across rows, so s^2 = 0
    # and every step is an exact Barker step (the correction's CDF error is 7e-8): the end
    # states are independent exact draws (Gandy and Scott 2020). Three exact tests, each at
    # level 1e-5 (false-failure rate below 3e-5): KS of their CDF values, chi-square(300) of
    # their squared z-scores (an sd off by 15% fails with probability above 1/2) and their mean
    # z-score (a mean off by 0.25 sd likewise). With R for R / T the kernel targets the
    # untempered posterior, half as wide: the end states' sd is 0.6 of the tempered one.
    model = _model()
    with _pymc_model(model):
        step = pms.MinibatchBarkerMH(
            batch_size=50,
            temperature=TEMPERATURE,
            control_variate="taylor2",
            reference_point=_reference(model),
            scaling=1.5,
            rng=42,
        )
    # The proposal covariance is the Laplace covariance of the tempered posterior: exact here.
    assert step.control.covariance[0, 0] == pytest.approx(model.post_sd**2, rel=1e-9)
    assert_stays_at_posterior(
        step, model.post_mean, model.post_sd, seed=43, label="tempered posterior's"
    )

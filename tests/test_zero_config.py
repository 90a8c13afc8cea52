"""Steps built with no arguments (issue 14): taylor2 around an automatic reference, or why not.

Before, ``AusterityMH()`` read 91% of 1e6 rows per draw at temperature 1 and said nothing; the
defaults below read about one batch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import linear_regression_data, linear_regression_model, linear_regression_posterior
from conjugate import assert_stays_at_posterior

import pymc_subsample as pms
import pymc_subsample.reference as reference_module
from pymc_subsample.step_methods.defaults import CONTROLLED_BATCH_SIZE

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}
STEPS = [pms.AusterityMH, pms.MinibatchBarkerMH]


def gaussian_mean_model(n_rows: int = 10_000, seed: int = 3) -> tuple[pm.Model, float, float]:
    """x_i ~ N(mu, 1), mu ~ N(0, 10): the exact posterior's mean and sd."""
    x = np.random.default_rng(seed).normal(0.7, 1.0, size=n_rows)
    precision = n_rows + 0.01
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 1.0, observed=x)
    return model, float(x.sum() / precision), float(precision**-0.5)


def _subsample_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, pms.SubsampleWarning)]


@pytest.mark.parametrize("step_class", STEPS)
def test_no_argument_step_uses_taylor2_the_laplace_proposal_and_a_small_batch(step_class):
    model, _, _ = gaussian_mean_model()
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = step_class()
    assert _subsample_warnings(caught) == []
    assert step.control_variate == "taylor2" and step.dropped_default == ""
    assert step.batch_size == CONTROLLED_BATCH_SIZE
    chol = step.proposal.chol_factor  # the Laplace covariance's factor
    np.testing.assert_allclose(chol @ chol.T, step.control.covariance)


@pytest.mark.parametrize("step_class", STEPS)
def test_no_argument_step_keeps_the_exact_posterior(step_class):
    # 300 chains from exact posterior draws, 5 steps each: the end states must still be exact
    # draws (three exact tests, false failure below 3e-5). A threshold shift dropped or doubled,
    # or a proposal covariance off by 2x in the acceptance, moves them by many sds.
    model, mean, sd = gaussian_mean_model()
    with model:
        step = step_class(rng=11)
    assert_stays_at_posterior(step, mean, sd, seed=12)


def test_no_argument_run_reads_one_batch_per_draw_and_is_right():
    # Linear regression on 20,000 rows: exact posterior known. Error allowed: 0.1 posterior sd
    # of bias plus 4.5 Monte Carlo SEs (false failure about 1e-5 per coefficient).
    X, y = linear_regression_data(20_000, seed=5)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        step = pms.AusterityMH()
        idata = pm.sample(draws=2000, tune=300, chains=1, step=step, random_seed=4, **SAMPLE)
    stats = idata.sample_stats
    assert float(stats["n_data"].mean()) <= 3 * CONTROLLED_BATCH_SIZE  # of N = 20,000
    draws = idata.posterior["beta"].values[0]
    import arviz as az

    mcse = az.mcse(idata, var_names=["beta"])["beta"].values
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), 0.1 * sd + 4.5 * mcse)


def test_reference_is_searched_once_per_model_and_data(monkeypatch):
    calls = []
    search = reference_module.optimise_reference

    def counted(*args, **kwargs):
        calls.append(1)
        return search(*args, **kwargs)

    monkeypatch.setattr(reference_module, "optimise_reference", counted)
    X, y = linear_regression_data(3_000, seed=6)
    with pm.Model():
        X_data = pm.Data("X", X)
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("y", X_data @ beta, 1.0, observed=pm.Data("y_obs", y), shape=X_data.shape[0])
        first = pms.AusterityMH()
        second = pms.MinibatchBarkerMH()
        assert len(calls) == 1  # the second step reused the first's search
        np.testing.assert_array_equal(first.control.proxy.reference, second.control.proxy.reference)
        X_new, y_new = linear_regression_data(2_000, seed=7)
        pm.set_data({"X": X_new, "y_obs": y_new})
        second._sync_data()  # as at the start of a chain
        assert len(calls) == 2  # new data: searched again
        new_mean, _ = linear_regression_posterior(X_new, y_new, prior_sd=10.0)
        np.testing.assert_allclose(second.control.proxy.reference, new_mean, atol=1e-2)


def test_step_after_find_reference_point_reuses_it(monkeypatch):
    X, y = linear_regression_data(3_000, seed=8)
    with linear_regression_model(X, y):
        ref = pms.find_reference_point(random_seed=1)
        monkeypatch.setattr(reference_module, "optimise_reference", _no_second_search)
        step = pms.AusterityMH()
    np.testing.assert_array_equal(step.control.proxy.reference, ref.q)


def _no_second_search(*args, **kwargs):
    raise AssertionError("the reference point was searched again")


def test_likelihood_read_by_another_step_drops_the_default_and_says_which():
    X, y = linear_regression_data(2_000, seed=9)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        noise = pm.HalfNormal("noise", 2.0)
        pm.Normal("y", X @ beta, noise, observed=y)
        with pytest.warns(pms.SubsampleWarning, match=r"also reads noise, which another step"):
            step = pms.AusterityMH([beta])
    assert step.control is None and "noise" in step.dropped_default
    assert step.batch_size == 500  # the plain test's own default


@pytest.mark.parametrize("case", ["tempered", "prior only"])
def test_no_control_variate_by_design_is_silent(case):
    model, _, _ = gaussian_mean_model(2_000)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        offset = pm.Normal("offset", 0.0, 1.0)  # no row reads it
        tempered = case == "tempered"
        step = pms.AusterityMH(temperature=10.0) if tempered else pms.AusterityMH([offset])
    assert _subsample_warnings(caught) == [] and step.control is None


def test_reference_point_with_no_usable_control_variate_is_an_error():
    model, _, _ = gaussian_mean_model(2_000)
    with model, pytest.raises(ValueError, match="tempered posterior"):
        pms.AusterityMH(temperature=10.0, reference_point={"mu": np.array(0.7)})


@pytest.mark.parametrize("step_class", STEPS)
def test_passed_reference_point_keeps_the_laplace_check_and_the_proposal(step_class):
    # A ReferencePoint carries the search's Laplace check: passed in, the step chooses the
    # proposal that it chooses from its own search (before issue 37 it read the check as
    # missing and ran Hamiltonian trajectories on the Python path instead).
    X, y = linear_regression_data(3_000, seed=8)
    with linear_regression_model(X, y):
        own = step_class()
        ref = pms.find_reference_point(random_seed=1)
        passed = step_class(control_variate="taylor2", reference_point=ref)
        as_dict = step_class(control_variate="taylor2", reference_point=ref.point)
    assert own.proposal_kind == passed.proposal_kind == "independent"
    assert passed.laplace_spread == ref.laplace_log_weight_sd
    # A plain dict carries no check: the step cannot know the posterior is near-Gaussian.
    assert as_dict.proposal_kind == "hmc" and np.isnan(as_dict.laplace_spread)


def test_passed_search_result_over_other_variables_is_not_read_as_the_steps():
    # A search over (beta, offset) measured another posterior than a step over beta alone in a
    # compound step: that step takes the point but not the check; a search over beta alone
    # is the step's own.
    X, y = linear_regression_data(2_000, seed=9)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 10.0, shape=3)
        pm.Normal("y", X @ beta, 1.0, observed=y)
        pm.Normal("offset", 0.0, 1.0)
        own = pms.find_reference_point([beta], random_seed=1)
        joint = pms.find_reference_point(random_seed=1)
        from_own = pms.AusterityMH([beta], control_variate="taylor2", reference_point=own)
        from_joint = pms.AusterityMH([beta], control_variate="taylor2", reference_point=joint)
    assert from_own.laplace_spread == own.laplace_log_weight_sd
    assert np.isnan(from_joint.laplace_spread)
    np.testing.assert_allclose(from_joint.control.proxy.reference, joint.point["beta"])

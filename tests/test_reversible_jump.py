"""ReversibleJumpMH: variable selection by birth, death and update moves (section 6.3).

The reference is exact: a linear spike-and-slab model with 6 features whose 64 models'
posterior probabilities are known in closed form (``examples/variable_selection.py``). The
check compares the 6 inclusion probabilities with it, to within 4.5 Monte Carlo standard errors
(ArviZ's ESS) plus a bias budget: 0 for exact MH (error_tolerance 0), 0.03 for the sequential
test at epsilon 0.01. False-failure rate from the chains' noise: at most 6 x 7e-6 per check.
Moves whose proposal ratio is left out (the birth density, the pseudo-prior and the move
probabilities) are off by up to 0.3 and fail.

The subsampled run (epsilon 0.01, 20,000 draws) is made once per test session and checked
twice: its inclusion probabilities against the enumeration, and its excluded coefficients
against their prior (``conftest.computed_once_per_session``: one xdist worker samples, the other
loads its draws).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import computed_once_per_session

import pymc_subsample as pms
from pymc_subsample.kernels.reversible_jump import BirthDeathProposal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from variable_selection import (
    exact_model_probabilities,
    linear_selection_model,
    make_linear_data,
    make_logistic_data,
)

TRUTH = np.array([0.4, 0.0, -0.3, 0.0, 0.0, 0.04])
#: pm.sample options of every run here.
QUIET = {"progressbar": False, "compute_convergence_checks": False}
N_ROWS = 5_000
DRAWS = 20_000


@pytest.fixture(scope="module")
def selection() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = make_linear_data(N_ROWS, TRUTH)
    models, probabilities = exact_model_probabilities(X, y)
    return X, y, probabilities @ models


@pytest.fixture(scope="module")
def subsampled(selection, tmp_path_factory) -> az.InferenceData:
    """The sequential test at epsilon 0.01: one run for the two tests that check it."""
    X, y, _ = selection

    def sample() -> az.InferenceData:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Draws after tuning read")
            return _sample(X, y, seed=5, error_tolerance=0.01)

    return computed_once_per_session(tmp_path_factory, "reversible_jump_subsampled", sample)


def _inclusion_errors(idata: az.InferenceData, exact: np.ndarray) -> tuple:
    gamma = idata.posterior["gamma"].to_numpy()[0].astype(float)  # (draws, features)
    ess = np.array([az.ess(column[None, :]) for column in gamma.T], dtype=float)
    mcse = gamma.std(axis=0) / np.sqrt(ess)
    return np.abs(gamma.mean(axis=0) - exact), mcse


def _sample(X: np.ndarray, y: np.ndarray, seed: int, **settings: object) -> az.InferenceData:
    with linear_selection_model(X, y):
        step = pms.ReversibleJumpMH("gamma", "beta", update_sd=0.02, **settings)
        return pm.sample(
            draws=DRAWS,
            tune=0,
            chains=1,
            step=step,
            **QUIET,
            random_seed=seed,
        )


@pytest.mark.filterwarnings("ignore:Draws after tuning read")
@pytest.mark.parametrize(
    ("error_tolerance", "budget"), [(0.0, 0.0), (0.01, 0.03)], ids=["exact", "subsampled"]
)
def test_inclusion_probabilities_match_enumeration(
    selection, error_tolerance, budget, request
) -> None:
    X, y, exact = selection
    if error_tolerance > 0:
        idata = request.getfixturevalue("subsampled")
    else:
        idata = _sample(X, y, seed=5, error_tolerance=error_tolerance)
    errors, mcse = _inclusion_errors(idata, exact)
    assert np.all(errors < 4.5 * mcse + budget + 1e-6), (errors, mcse)
    if error_tolerance > 0:
        assert float(idata.sample_stats["n_data"].mean()) < N_ROWS


def test_a_missing_proposal_ratio_is_detected(selection, monkeypatch) -> None:
    """The check above has power: birth and death moves without their ratio fail it."""
    X, y, exact = selection
    propose = BirthDeathProposal.__call__

    def without_ratio(self, rng, q, scaling):
        return propose(self, rng, q, scaling)[0], 0.0

    monkeypatch.setattr(BirthDeathProposal, "__call__", without_ratio)
    idata = _sample(X, y, seed=5, error_tolerance=0.0)
    errors, mcse = _inclusion_errors(idata, exact)
    assert not np.all(errors < 4.5 * mcse), (errors, mcse)


def test_excluded_coefficients_follow_their_prior(subsampled) -> None:
    """An excluded coefficient is a draw from its prior, N(0, 1): mean 0, sd 1 (pseudo-prior)."""
    idata = subsampled
    gamma = idata.posterior["gamma"].to_numpy()[0]
    beta = idata.posterior["beta"].to_numpy()[0]
    # Features 1 and 3 are excluded 98% and 92% of the time. The values change only at a death
    # (a fresh prior draw each): the sd of the mean of n distinct values is 1 / sqrt(n); 5 sd.
    # A death drawing from the birth proposal N(0, 0.1^2) instead gives sd 0.1 and fails.
    distinct = np.unique(np.concatenate([beta[:, j][gamma[:, j] == 0] for j in (1, 3)]))
    assert distinct.size > 30
    assert abs(distinct.mean()) < 5 / np.sqrt(distinct.size)
    assert abs(distinct.std() - 1.0) < 5 * np.sqrt(0.5 / distinct.size)


def test_lasso_logistic_with_a_sampled_shrinkage_runs_in_a_compound_step() -> None:
    """The paper's model with its scale sampled by another step: the prior's draws read it."""
    X, y, _ = make_logistic_data(3_000, 5, n_relevant=2)
    with pm.Model(coords={"feature": np.arange(5)}):
        scale = pm.HalfNormal("scale", 1.0)
        gamma = pm.Bernoulli("gamma", p=0.5, dims="feature")
        beta = pm.Laplace("beta", 0.0, scale, dims="feature")
        pm.Bernoulli("y", logit_p=X @ (gamma * beta), observed=y)
        steps = [
            pms.ReversibleJumpMH(gamma, beta, update_sd=0.05, error_tolerance=0.01),
            pms.AusterityMH([scale], control_variate=None),
        ]
        idata = pm.sample(
            draws=300,
            tune=100,
            chains=2,
            cores=1,
            step=steps,
            **QUIET,
            random_seed=3,
        )
    assert idata.posterior["gamma"].dtype.kind == "i"
    assert np.all(np.isin(idata.posterior["gamma"].to_numpy(), [0, 1]))
    assert float(idata.posterior["gamma"][..., 0].mean()) > 0.9  # the intercept is needed


def test_refusals(selection) -> None:
    X, y, _ = selection
    with linear_selection_model(X, y) as model:
        with pytest.raises(ValueError, match=r"must be a pm\.Bernoulli"):
            pms.ReversibleJumpMH("beta", "beta")
        with pytest.raises(ValueError, match="not a free variable"):
            pms.ReversibleJumpMH("gamma", "coefficients")
        with pytest.raises(TypeError, match="chooses"):
            pms.ReversibleJumpMH("gamma", "beta", proposal="random_walk")
        with pytest.raises(ValueError, match="birth_sd"):
            pms.ReversibleJumpMH("gamma", "beta", birth_sd=0.0)
        with pytest.raises(ValueError, match="cannot be moved by proposal='auto'"):
            pms.AusterityMH([model["gamma"], model["beta"]])
        with pytest.raises(ValueError, match="control_variate='taylor2' needs gradients"):
            pms.AusterityMH(proposal=lambda rng, q, s: (q, 0.0), control_variate="taylor2")
    with pm.Model():
        gamma = pm.Bernoulli("gamma", 0.5, shape=2)
        beta = pm.HalfNormal("beta", 1.0, shape=2)
        pm.Normal("y", X[:, :2] @ (gamma * beta), 1.0, observed=y)
        with pytest.raises(ValueError, match="without a transform"):
            pms.ReversibleJumpMH(gamma, beta)


def test_move_stats_and_no_update_moves(selection) -> None:
    """Stats name each move and the model size; with updates off only gamma's moves remain."""
    X, y, _ = selection
    with linear_selection_model(X, y):
        step = pms.ReversibleJumpMH(
            "gamma", "beta", move_probabilities=(0.0, 0.5, 0.5), error_tolerance=0.01
        )
        idata = pm.sample(
            draws=300,
            tune=50,
            chains=1,
            step=step,
            **QUIET,
            random_seed=2,
        )
    stats = idata.sample_stats
    gamma = idata.posterior["gamma"].to_numpy()[0]
    assert set(np.unique(stats["move"])) <= {1, 2}
    np.testing.assert_array_equal(stats["n_included"].to_numpy()[0], gamma.sum(axis=1))
    assert np.all(stats["scaling"] == 1.0)  # the moves ignore it: nothing is tuned
    # Where a move changed the model, the size changed by one in its direction.
    changed = np.flatnonzero(np.diff(gamma.sum(axis=1)) != 0) + 1
    sizes = gamma.sum(axis=1)
    expected = np.where(stats["move"].to_numpy()[0][changed] == 1, 1, -1)
    np.testing.assert_array_equal(sizes[changed] - sizes[changed - 1], expected)

"""The ICA example on the orthogonal group (``examples/ica_stiefel.py``; Korattikara et al. 2014,
section 6.2): the user proposal stays on the manifold and is symmetric, and ``AusterityMH``
with it samples the exact posterior.

Exactness is checked against quadrature. For D = 2, O(2) is a rotation angle and a reflection,
the likelihood has period pi/2 in the angle and is the same on both components, so the
posterior of any function invariant under signed row permutations is a one-dimensional
integral (``ica_stiefel.AnglePosterior``, a trapezoidal rule on 2,001 points over +-9
posterior sds). Four chains (two started on rotations, two on reflections) are compared on
three such functions: the Amari distance to the true unmixing matrix (the paper's test
function), and the mean and mean square of the angle relative to the mode, wrapped to one
period. Each must agree within ``Z_LIMIT = 4`` Monte Carlo standard errors (ArviZ's MCSE on
4 x 3,000 draws, ESS about 1,200-1,800): a two-sided false-failure rate of 6e-5 per
assertion, 2e-4 for the three (the MCSE's own error, a few percent at that ESS, moves this
within a factor of about 2).

What breaking the kernel showed (run by hand when the test was written, not a seed search;
the first case is also asserted below, so that the check's power stays measured):

- A wrong non-zero log ratio (the walk returning ``+1.0`` instead of ``0.0``, which accepts
  moves down the posterior too often, so the chain spreads too wide): the Amari distance's
  mean and the angle's mean square came out 14 MCSE off (the test fails; the correct walk's
  three scores were 0.6, 0.4 and 0.8), asserted below to be more than 8.
- A non-orthogonal move (``W' = W + 0.1 scaling noise``, a symmetric walk in R^4 that the
  Flat prior does not stop): the orthonormality assertion fails at once (``|W W^T - I|``
  2.6 to 3.1 after tuning: the rows grow to norm 1.9, where the unit-scale logistic density
  fits the unit-variance rows best), and the Amari distance's mean is 25 MCSE off.
- A drifting rotation (``S`` plus a fixed skew matrix, ratio still 0): the symmetry test
  rejects it (p below 1e-6, asserted below).
"""

from __future__ import annotations

import math
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import example_module
from scipy import stats

import pymc_subsample as pms

ica = example_module("ica_stiefel")

SAMPLE = {"progressbar": False, "compute_convergence_checks": False, "cores": 1}
Z_LIMIT = 4.0
N_ROWS = 2_000


def random_orthogonal(n: int, rng: np.random.Generator, det: float = 1.0) -> np.ndarray:
    """A Haar-distributed matrix of O(n) with the given determinant sign."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q = q * np.sign(np.diag(r))
    if np.sign(np.linalg.det(q)) != det:
        q[0] = -q[0]
    return q


@pytest.mark.parametrize(("n", "det"), [(2, 1.0), (3, -1.0), (4, 1.0)])
def test_the_walk_stays_orthonormal_in_its_component_with_ratio_zero(n, det):
    rng = np.random.default_rng(n)
    q = random_orthogonal(n, rng, det).ravel()
    worst = 0.0
    for scaling in np.repeat([1e-3, 0.1, 1.0, 3.0], 1_000):  # 3.0: expm needs squaring
        q, log_ratio = ica.orthogonal_walk(rng, q, scaling)
        assert log_ratio == 0.0
        worst = max(worst, ica.orthonormality_error(q.reshape(n, n)))
    assert worst < 1e-10
    assert np.sign(np.linalg.det(q.reshape(n, n))) == det


def test_skew_expm_is_the_matrix_exponential():
    from scipy.linalg import expm

    rng = np.random.default_rng(0)
    for scale in (1e-4, 0.3, 5.0):
        noise = rng.standard_normal((4, 4))
        skew = scale * (noise - noise.T)
        np.testing.assert_allclose(ica.skew_expm(skew), expm(skew), atol=1e-13)


def increments(walk, n: int, draws: int, seed: int, start: np.ndarray | None = None):
    """``R = W^T W'`` for ``draws`` proposals from ``start`` (the identity by default)."""
    rng = np.random.default_rng(seed)
    W = np.eye(n) if start is None else start
    out = np.empty((draws, n, n))
    for k in range(draws):
        q_new, _ = walk(rng, W.ravel(), 0.5)
        out[k] = W.T @ q_new.reshape(n, n)
    return out


def drifting_walk(rng, q, scaling):
    """A broken walk: a fixed rotation added to each move, with the ratio still 0."""
    n = math.isqrt(q.size)
    noise = rng.standard_normal((n, n))
    drift = np.zeros((n, n))
    drift[0, 1], drift[1, 0] = 0.05, -0.05
    skew = (noise - noise.T) / math.sqrt(2.0) + drift / scaling
    return (q.reshape(n, n) @ ica.skew_expm(scaling * skew)).ravel(), 0.0


def test_the_walk_is_symmetric_under_the_haar_measure():
    # q(W' | W) is a density f(W^T W') of the increment whatever W is (left invariance), so
    # the proposal is symmetric iff R = W^T W' and R^T = W'^T W have the same distribution.
    # (1) The increment does not depend on W: same generator, two starts, same increments.
    start = random_orthogonal(3, np.random.default_rng(1), det=-1.0)
    np.testing.assert_allclose(
        increments(ica.orthogonal_walk, 3, 50, seed=2),
        increments(ica.orthogonal_walk, 3, 50, seed=2, start=start),
        atol=1e-12,
    )
    # (2) R and R^T agree in distribution: a two-sample KS test on tr(M R) against tr(M R^T)
    # from independent draws, M a fixed non-symmetric matrix; level 1e-3 (false-failure rate
    # 1e-3). The drifting walk, whose increments lean one way, fails it (asserted p < 1e-6).
    M = np.random.default_rng(3).standard_normal((3, 3))

    def p_value(walk):
        forward = np.einsum("ij,kji->k", M, increments(walk, 3, 10_000, seed=4))
        backward = np.einsum("ij,kij->k", M, increments(walk, 3, 10_000, seed=5))
        return stats.ks_2samp(forward, backward).pvalue

    assert p_value(ica.orthogonal_walk) > 1e-3
    assert p_value(drifting_walk) < 1e-6


@pytest.fixture(scope="module")
def two_sources():
    data = ica.make_data(N_ROWS, 2, seed=3)
    return data, ica.AnglePosterior(data.x)


def z_scores(data, exact, walk) -> dict[str, float]:
    """Run 4 exact-MH chains with ``walk`` and return (chains - quadrature) / MCSE."""
    rng = np.random.default_rng(7)
    starts = [
        {"W": random_orthogonal(2, rng, det)} for det in (1.0, 1.0, -1.0, -1.0)
    ]  # both components of O(2): their posteriors are copies of each other
    model = ica.ica_model(data.x, initval=starts[0]["W"])
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pms.AusterityMH(proposal=walk, error_tolerance=0.0, control_variate=None)
        idata = pm.sample(
            step=step, tune=1_000, draws=3_000, chains=4, initvals=starts, random_seed=11, **SAMPLE
        )
    W = idata.posterior["W"].values
    assert ica.orthonormality_error(W) < 1e-10
    assert (np.sign(np.linalg.det(W)) == np.array([1.0, 1.0, -1.0, -1.0])[:, None]).all()
    functions = {
        "amari": lambda V: ica.amari_distance(V, data.unmixing),
        "angle": lambda V: exact.wrapped(ica.angle_of(V)),
        "angle^2": lambda V: exact.wrapped(ica.angle_of(V)) ** 2,
    }
    scores = {}
    for name, function in functions.items():
        draws = function(W)  # (chain, draw)
        mcse = np.asarray(az.mcse(draws)).item()  # 0-d (ArviZ 1) or shape (1,) (ArviZ 0.x)
        scores[name] = (draws.mean() - exact.expectation(function)) / mcse
    return scores


def test_austerity_mh_with_the_walk_matches_the_exact_posterior(two_sources):
    data, exact = two_sources
    scores = z_scores(data, exact, ica.orthogonal_walk)
    for name, z in scores.items():
        assert abs(z) < Z_LIMIT, (name, z)


def test_a_wrong_log_ratio_fails_the_check_above(two_sources):
    # The check's power: a walk that claims log q(W | W') - log q(W' | W) = 1.
    def wrong_ratio(rng, q, scaling):
        return ica.orthogonal_walk(rng, q, scaling)[0], 1.0

    data, exact = two_sources
    scores = z_scores(data, exact, wrong_ratio)
    assert max(abs(z) for z in scores.values()) > 8.0


@pytest.mark.parametrize("copy", ["chain's", "another"])
def test_a_reference_on_another_copy_of_the_mode_is_warned(two_sources, copy):
    # A reference point a quarter turn away (rows swapped, one sign flipped: the same
    # likelihood) is hundreds of sds from the chain: the expansion fails there, and the
    # far-from-reference warning, 10 times the Gaussian limit with a proposal function, says so.
    data, _ = two_sources
    u, _, vt = np.linalg.svd(data.unmixing)
    centre = u @ vt
    reference = centre if copy == "chain's" else np.array([[0.0, 1.0], [-1.0, 0.0]]) @ centre
    with ica.ica_model(data.x, initval=centre), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        step = pms.AusterityMH(
            proposal=ica.orthogonal_walk,
            scaling=2.38 / np.sqrt(N_ROWS),
            error_tolerance=0.05,
            control_variate="taylor2",
            reference_point={"W": reference},
        )
        pm.sample(step=step, tune=200, draws=300, chains=1, random_seed=1, **SAMPLE)
    far = [w for w in record if "squared Mahalanobis distance" in str(w.message)]
    assert bool(far) is (copy == "another")

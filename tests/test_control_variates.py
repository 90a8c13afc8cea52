"""Control variates: proxy sums, unbiasedness, exactness, uniformity, pm.sample at temperature 1.

Mutants checked by hand: dropping the proxies' exact sum ``R / T`` from the threshold, or its
second-order term ``a^T H b / 2``, fails the second-order cases of the zero-tolerance,
exact-start (p = 1e-52) and pm.sample tests, and the latter the proxy-sum test. At a reference
point at the mode the first-order sum ``G^T a`` is only the prior's gradient, so dropping it is
a bias too small for these tests to see; the proxy-sum test checks it exactly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import (
    computed_once_per_session,
    linear_regression_data,
    linear_regression_model,
    linear_regression_posterior,
)
from pymc.blocking import DictToArrayBijection, RaveledVars
from scipy.special import log_expit
from scipy.stats import kstest

import pymc_subsample as pms
from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.step_methods.diagnostics import ChainDiagnostics

SAMPLE = {"progressbar": False, "compute_convergence_checks": False}


def _logistic(n_rows: int, n_features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, n_features))
    truth = np.linspace(-1.0, 1.0, n_features)
    y = rng.binomial(1, 1 / (1 + np.exp(-X @ truth)))
    return X, y


def _logistic_model(X: np.ndarray, y: np.ndarray, prior_sd: float = 10.0) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, prior_sd, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
    return model


@pytest.mark.parametrize("order", [1, 2])
def test_proxy_sums_match_brute_force(order):
    # G and H against closed forms for logistic regression, chunked and not; and the identity
    # sum(residuals) + R = full-data log-ratio (exact algebra: agreement to 1e-9 relative).
    X, y = _logistic(700, 3, seed=1)
    model = _logistic_model(X, y)
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=order
    )
    rng = np.random.default_rng(2)
    q_ref = rng.normal(scale=0.3, size=3)
    p = 1 / (1 + np.exp(-X @ q_ref))
    for chunk in (7, 8192):
        gradient, hessian = oracles.gradient_hessian_sums(q_ref, chunk_size=chunk)
        np.testing.assert_allclose(gradient, X.T @ (y - p), rtol=1e-10)
        np.testing.assert_allclose(hessian, -(X * (p * (1 - p))[:, None]).T @ X, rtol=1e-10)
    proxy = pms.kernels.control_variates.TaylorProxy(q_ref, gradient, hessian, order)
    rows = np.arange(700)
    for _ in range(5):
        q_old = q_ref + rng.normal(scale=0.2, size=3)
        q_new = q_old + rng.normal(scale=0.2, size=3)
        residuals = oracles.residual_ratio_rows(q_new, q_old, q_ref, rows)
        full = oracles.loglik_ratio_rows(q_new, q_old, rows).sum()
        np.testing.assert_allclose(residuals.sum() + proxy.difference(q_new, q_old), full, 1e-9)
        # Each residual is l_i minus the per-row Taylor terms, computed here by hand.
        step, centre = q_new - q_old, q_new + q_old - 2 * q_ref
        by_hand = oracles.loglik_ratio_rows(q_new, q_old, rows) - (y - p) * (X @ step)
        if order == 2:
            by_hand += 0.5 * p * (1 - p) * (X @ step) * (X @ centre)
        np.testing.assert_allclose(residuals, by_hand, rtol=1e-8, atol=1e-12)


def test_difference_estimator_is_unbiased():
    # Averaging (N/n) sum(residuals on a batch) + R over 4000 batches drawn without replacement
    # gives the full-data log-ratio. Tolerance 4.5 standard errors of that average (false
    # failure about 7e-6); an estimator that forgot the N/n scaling is off by ~1000 SEs.
    X, y = _logistic(2000, 2, seed=3)
    model = _logistic_model(X, y)
    oracles = build_oracles(
        model, model.value_vars, initial_point=model.initial_point(), proxy_order=1
    )
    q_ref = np.array([-1.0, 1.0])
    proxy = pms.kernels.control_variates.TaylorProxy(
        q_ref, *oracles.gradient_hessian_sums(q_ref), order=1
    )
    q_old, q_new = q_ref + 0.05, q_ref + np.array([0.1, -0.02])
    full = oracles.loglik_ratio_rows(q_new, q_old, np.arange(2000)).sum()
    rng = np.random.default_rng(4)
    estimates = np.array(
        [
            2000
            / 25
            * oracles.residual_ratio_rows(
                q_new, q_old, q_ref, rng.choice(2000, 25, replace=False)
            ).sum()
            + proxy.difference(q_new, q_old)
            for _ in range(4000)
        ]
    )
    assert abs(estimates.mean() - full) < 4.5 * estimates.std() / np.sqrt(4000)


def _run(step, q0: np.ndarray, n_steps: int) -> np.ndarray:
    info = DictToArrayBijection.map(step._initial_point).point_map_info
    step.tune = False
    q = RaveledVars(q0, info)
    path = []
    for _ in range(n_steps):
        q, _ = step.astep(q)
        path.append(q.data.copy())
    return np.array(path)


@pytest.mark.parametrize("control_variate", ["taylor1", "taylor2"])
def test_zero_tolerance_is_exact_mh(control_variate):
    # With error_tolerance=0 the test sums all residuals plus R: the same decisions as exact MH
    # without control variates on the same random stream (up to float rounding of the sum).
    X, y = _logistic(500, 2, seed=5)
    with _logistic_model(X, y):
        ref = pms.find_reference_point(random_seed=0)
        cov = np.eye(2) * 0.01
        plain = pms.AusterityMH(error_tolerance=0, batch_size=100, proposal_cov=cov, rng=7)
        control = pms.AusterityMH(
            error_tolerance=0,
            batch_size=100,
            proposal_cov=cov,
            control_variate=control_variate,
            reference_point=ref,
            rng=7,
        )
    np.testing.assert_allclose(_run(plain, ref.q, 300), _run(control, ref.q, 300), rtol=1e-12)


def _grid_posterior(X: np.ndarray, y: np.ndarray, prior_sd: float):
    """Exact 1-D posterior of a logistic coefficient on a fine grid: (grid, cdf)."""
    grid = np.linspace(-3.0, 3.0, 60001)
    sign = np.where(y == 1, 1.0, -1.0) * X[:, 0]
    log_post = (
        np.concatenate(
            [log_expit(np.outer(chunk, sign)).sum(1) for chunk in np.array_split(grid, 60)]
        )
        - 0.5 * (grid / prior_sd) ** 2
    )
    density = np.exp(log_post - log_post.max())
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (density[1:] + density[:-1]))])
    return grid, cdf / cdf[-1]


def _exact_start_posterior() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    X, y = _logistic(1500, 1, seed=8)
    X = X + 0.5
    return (X, y, *_grid_posterior(X, y, prior_sd=10.0))


@pytest.fixture(scope="module")
def exact_start_posterior(tmp_path_factory) -> tuple[np.ndarray, ...]:
    """The exact-start test's data and grid posterior (90M log_expit calls): once per session."""
    return computed_once_per_session(
        tmp_path_factory, "control_variates_exact_start", _exact_start_posterior
    )


@pytest.mark.parametrize(
    ("step_class", "kwargs"),
    [
        (pms.MinibatchBarkerMH, {"batch_size": 30, "control_variate": "taylor2"}),
        (
            pms.AusterityMH,
            {"batch_size": 50, "control_variate": "taylor1", "error_tolerance": 0.001},
        ),
    ],
)
def test_exact_start_uniformity(step_class, kwargs, exact_start_posterior):
    # 800 chains start at exact posterior draws (inverse CDF on a 60,001-point grid, spacing
    # 1e-4, of the 1-D logistic posterior, N = 1500, temperature 1) and take 8 steps of 1.5
    # posterior sds. The
    # end states are exact draws for an exact kernel (Gandy and Scott 2020), so their CDF values
    # are uniform: KS at level 1e-3 (false-failure rate 1e-3). The Barker test's error is the
    # correction's 7e-8; the Austerity test's is bounded by its 0.001 tolerance, below what 800
    # chains can see. Dropping R / T from the threshold fails the Barker case at p = 1e-52.
    X, y, grid, cdf = exact_start_posterior
    rng = np.random.default_rng(9)
    starts = np.interp(rng.uniform(size=800), cdf, grid)
    sd = float(np.sqrt(np.interp(0.8413, cdf, grid) - np.interp(0.1587, cdf, grid)) ** 2 / 2)
    with _logistic_model(X, y):
        ref = pms.find_reference_point(random_seed=0)
        step = step_class(**kwargs, reference_point=ref, rng=10)
    step.scaling = 1.5 * sd / np.sqrt(step.control.covariance[0, 0])
    ends = np.array([_run(step, np.array([s]), 8)[-1, 0] for s in starts])
    assert kstest(np.interp(ends, grid, cdf), "uniform").pvalue > 1e-3


@pytest.mark.parametrize(
    ("step_class", "control_variate", "row_share"),
    [(pms.AusterityMH, "taylor1", 0.1), (pms.MinibatchBarkerMH, "taylor2", 0.02)],
)
def test_untempered_regression_matches_exact_posterior(step_class, control_variate, row_share):
    # Temperature 1, N = 20,000: means within 0.1 posterior sd and sds within 10% of the exact
    # posterior (ESS > 600 per coefficient, so 0.1 sd is > 2.4 Monte Carlo SEs; about 1.6%
    # false-failure risk per coefficient). Without control variates both tests read almost all
    # rows here; with them the mean rows per draw must stay below 10% of N (first order, whose
    # residuals grow with the distance from the reference) or 2% (second order: exact proxies).
    X, y = linear_regression_data(20_000, seed=12)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        ref = pms.find_reference_point(random_seed=1)
        step = step_class(batch_size=100, control_variate=control_variate, reference_point=ref)
        idata = pm.sample(
            draws=7000,
            tune=500,
            chains=2,
            cores=1,
            step=step,
            random_seed=13,
            initvals=ref.initvals,
            **SAMPLE,
        )
    import arviz as az

    draws = idata.posterior["beta"].values.reshape(-1, 3)
    assert float(az.ess(idata)["beta"].min()) > 600
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean) / sd, 0.1)
    np.testing.assert_array_less(np.abs(draws.std(0) / sd - 1), 0.1)
    stats = idata.sample_stats
    assert stats["n_data"].values.mean() < row_share * 20_000
    assert np.isfinite(stats["reference_distance"].values).all()


def test_find_reference_point_gaussian_mean_closed_form():
    rng = np.random.default_rng(14)
    x = rng.normal(2.0, 1.5, size=50_000)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 1.5, observed=x)
        ref = pms.find_reference_point(random_seed=2)
    exact = x.sum() / 1.5**2 / (x.size / 1.5**2 + 1 / 100)
    assert ref.converged
    assert abs(float(ref.point["mu"]) - exact) < 1e-6
    assert ref.initvals["mu"] == pytest.approx(ref.point["mu"])


@pytest.mark.parametrize("method", ["newton", "fisher"])
def test_find_reference_point_matches_find_map(method):
    X, y = _logistic(20_000, 4, seed=15)
    with _logistic_model(X, y, prior_sd=2.0) as model:
        ref = pms.find_reference_point(method=method, random_seed=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            map_point = pm.find_MAP(progressbar=False)
    assert ref.converged
    # Within 1e-3 posterior sds: the Newton decrement tolerance is 1e-4 (0.01 sd).
    precision = -model.compile_d2logp()(map_point)
    offset = ref.point["beta"] - map_point["beta"]
    assert float(offset @ precision @ offset) < 1e-3
    assert ref.n_gradient_rows > 0 and len(ref.batch_sizes) == ref.n_iterations


def test_find_reference_point_with_a_positive_parameter():
    # sigma is optimised on its log scale; the result has the value-variable name and
    # initvals holds the constrained value.
    rng = np.random.default_rng(16)
    y = rng.normal(1.0, 2.0, size=10_000)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.Normal("y", mu, sigma, observed=y)
        ref = pms.find_reference_point(random_seed=4)
    assert ref.converged
    assert set(ref.point) == {"mu", "sigma_log__"}
    assert ref.initvals["sigma"] == pytest.approx(np.exp(ref.point["sigma_log__"]))
    assert ref.initvals["sigma"] == pytest.approx(y.std(), rel=0.01)


def test_find_reference_point_bad_input_and_max_iter(small_regression):
    model, _, _ = small_regression
    with model:
        with pytest.raises(ValueError, match="method"):
            pms.find_reference_point(method="bfgs")
        with pytest.raises(ValueError, match="error_tolerance"):
            pms.find_reference_point(error_tolerance=0.7)
        with pytest.raises(ValueError, match="tol"):
            pms.find_reference_point(tol=-1)
        with pytest.warns(pms.SubsampleWarning, match="max_iter"):
            ref = pms.find_reference_point(max_iter=1, tol=1e-300, random_seed=0)
    assert not ref.converged


def test_a_non_finite_hessian_names_the_gradient_only_search_which_then_works():
    # -|y - mu|^1.5 has a finite gradient but an infinite second derivative where y = mu:
    # rows equal to the start make the Newton search's Hessian inf. The warning must say so
    # and point to method='fisher', which needs gradients only and finds the mode.
    y = np.random.default_rng(0).normal(size=5000)
    y[:10] = 0.0
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.CustomDist("y", mu, logp=lambda value, mu: -(pt.abs(value - mu) ** 1.5), observed=y)
        with pytest.warns(pms.SubsampleWarning) as record:
            pms.find_reference_point(random_seed=0)
        message = str(record[0].message)
        assert "summed Hessian is not finite" in message
        assert "method='fisher'" in message and "Raise max_iter" not in message
        with warnings.catch_warnings():
            warnings.simplefilter("error", pms.SubsampleWarning)
            ref = pms.find_reference_point(method="fisher", random_seed=0)
    assert ref.converged and abs(ref.point["mu"]) < 0.05


def test_control_variate_bad_input(small_regression):
    model, _, _ = small_regression
    with model:
        with pytest.raises(ValueError, match="control_variate"):
            pms.AusterityMH(control_variate="taylor3")
        with pytest.raises(ValueError, match="recenter"):
            pms.AusterityMH(control_variate="taylor1", recenter="always")
        with pytest.raises(ValueError, match="control_variate='taylor1'"):
            pms.MinibatchBarkerMH(control_variate=None, reference_point={"beta": np.zeros(3)})
        with pytest.raises(ValueError, match="no value for 'beta'"):
            pms.AusterityMH(control_variate="taylor1", reference_point={"b": np.zeros(3)})
        with pytest.raises(ValueError, match="shape"):
            pms.AusterityMH(control_variate="taylor1", reference_point={"beta": np.zeros(2)})
        with pytest.raises(TypeError, match="reference_point must be a dict"):
            pms.AusterityMH(control_variate="taylor1", reference_point=[0.0, 0.0, 0.0])


def test_far_reference_point_warns(small_regression):
    # A reference 50 posterior sds from the mode: the Laplace distance of the draws exceeds
    # the chi-square's 1 - 1e-6 quantile at once.
    model, X, y = small_regression
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with model:
        step = pms.AusterityMH(
            control_variate="taylor2", reference_point={"beta": mean + 50 * sd}, batch_size=50
        )
        with pytest.warns(pms.SubsampleWarning, match="reference point"):
            pm.sample(
                draws=20,
                tune=0,
                chains=1,
                step=step,
                random_seed=1,
                initvals={"beta": mean},
                **SAMPLE,
            )


def test_chain_diagnostics_warn_once_per_problem():
    diagnostics = ChainDiagnostics(batch_size=100, n_rows=1000)
    diagnostics.reset(draws=50)
    with pytest.warns(pms.SubsampleWarning) as record:
        for i in range(50):
            diagnostics.record(
                full_data=i % 2 == 0, kurtosis=500.0, n_data=1000 if i % 2 == 0 else 100
            )
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert any("50% of 50 draws" in m for m in messages)
    assert any("heavy-tailed" in m for m in messages)
    quiet = ChainDiagnostics(batch_size=100, n_rows=1000)
    quiet.reset(draws=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2000):
            quiet.record(full_data=False, kurtosis=20.0, n_data=100)


def test_exact_austerity_test_does_not_warn_about_full_data():
    # Tolerance 0 reads every row by request; a sequential test that often falls back still
    # warns (a mutant that dropped the switch, or set it for every test, fails one of the two).
    # 1,000 draws: on PyMC 5 the share is checked every 1,000 draws (CHECK_EVERY).
    X, y = linear_regression_data(2_000)
    with linear_regression_model(X, y):
        exact = pms.AusterityMH(
            error_tolerance=0.0,
            batch_size=1000,
            scaling=0.1,
            control_variate=None,
            proposal="random_walk",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", pms.SubsampleWarning)
            pm.sample(draws=1000, tune=0, chains=1, step=exact, random_seed=1, **SAMPLE)
        sequential = pms.AusterityMH(
            error_tolerance=0.001,
            batch_size=1000,
            scaling=0.1,
            control_variate=None,
            proposal="random_walk",
        )
        with pytest.warns(pms.SubsampleWarning, match="used all N=2000 rows"):
            pm.sample(draws=1000, tune=0, chains=1, step=sequential, random_seed=1, **SAMPLE)


def test_recenter_at_end_of_tuning_counts_its_pass():
    X, y = linear_regression_data(3000, seed=17)
    mean, sd = linear_regression_posterior(X, y, prior_sd=10.0)
    with linear_regression_model(X, y):
        step = pms.AusterityMH(
            control_variate="taylor1",
            reference_point={"beta": mean + 3 * sd},
            recenter="tune",
            batch_size=100,
        )
        initial = step.control.proxy.reference.copy()
        idata = pm.sample(
            draws=30,
            tune=400,
            chains=1,
            step=step,
            random_seed=2,
            initvals={"beta": mean},
            **SAMPLE,
        )
    n_data = idata.sample_stats["n_data"].values[0]
    # The first draw carries the re-centring pass (3000 rows) on top of its own test.
    assert n_data[0] >= 3000 + 100
    # The run re-centred near the posterior mean; the next chain starts from the initial point.
    assert np.all(np.abs(step.control.proxy.reference - mean) / sd < 0.5)
    assert np.all(np.abs(initial - mean) / sd > 2.9)
    step.reset_tuning()
    np.testing.assert_array_equal(step.control.proxy.reference, initial)


def test_step_finds_its_own_reference_point():
    # reference_point=None runs the optimiser on the step's own oracles: the expansion point is
    # the posterior mode of a Gaussian mean (closed form) and the rows it read are recorded.
    rng = np.random.default_rng(18)
    x = rng.normal(-1.0, 1.0, size=20_000)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 1.0, observed=x)
        step = pms.MinibatchBarkerMH(control_variate="taylor1", rng=3)
    exact = x.sum() / (x.size + 1 / 100)
    assert abs(float(step.control.proxy.reference[0]) - exact) < 1e-6
    assert step.reference_rows >= x.size
    # The Laplace covariance is the exact posterior variance of this conjugate model.
    assert step.control.covariance[0, 0] == pytest.approx(1 / (x.size + 1 / 100))


class _LogisticRows:
    """Oracles of a 1-parameter logistic likelihood whose per-row proxy gradients can be broken.

    ``gradient_error`` adds a per-row error with zero sum to the proxies' gradient terms, as
    PyTensor's forward-mode terms had on ``pm.MvNormal`` with an ``LKJCholeskyCov`` factor.
    """

    n_rows, n_params, proxy_order = 200, 1, 2
    expansion = "unconstrained"  # proxies in q itself

    def __init__(self, gradient_error: float) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.normal(size=self.n_rows)
        self.y = (rng.uniform(size=self.n_rows) < 0.5).astype(float)
        noise = rng.normal(size=self.n_rows)
        self.error = gradient_error * (noise - noise.mean())

    def loglik_rows(self, q, rows):
        eta = q[0] * self.x[rows]
        return self.y[rows] * eta + log_expit(-eta)

    def _derivatives(self, q, rows):
        p = 1.0 / (1.0 + np.exp(-q[0] * self.x[rows]))
        return (self.y[rows] - p) * self.x[rows], -p * (1 - p) * self.x[rows] ** 2

    def gradient_hessian_sums(self, q):
        g, h = self._derivatives(q, np.arange(self.n_rows))
        return np.array([g.sum()]), np.array([[h.sum()]])

    def residual_ratio_rows(self, q_new, q_old, reference, rows):
        g, h = self._derivatives(reference, rows)
        g = g + self.error[rows]
        a, b = q_new[0] - q_old[0], q_new[0] + q_old[0] - 2 * reference[0]
        change = self.loglik_rows(q_new, rows) - self.loglik_rows(q_old, rows)
        return change - (g * a + 0.5 * h * a * b)

    def log_prior_hessian(self, q):
        return np.array([[-1.0]])

    def freeze_shared(self):
        pass

    def in_unconstrained(self):
        return self

    def frozen_values(self):
        return []


def test_wrong_per_row_taylor_terms_are_refused_when_the_control_variate_is_built():
    # The check compares the residuals at 2 and 1 Laplace sds: a cubic remainder shrinks 8x,
    # a per-row gradient error 2x. Deterministic: no sampling.
    from pymc_subsample.step_methods.control import ControlVariate, ProxyTermsError

    right = _LogisticRows(gradient_error=0.0)
    reference = np.array([0.1])
    ControlVariate(right, reference, 1.0)  # passes
    with pytest.raises(ProxyTermsError, match="divided the residuals by 2"):
        ControlVariate(_LogisticRows(gradient_error=0.05), reference, 1.0)

"""GroupEffectsMH: a hierarchy's group effects, each group tested on its own rows.

Statistical tests compare with exact posteriors:

- Poisson intercepts with fixed hyperparameters: every group's posterior is one-dimensional,
  computed by quadrature. Groups of 0, 1 and up to ``batch_size`` rows are decided exactly, the
  others by sampled tests on the control variate's residuals (a Poisson row's residual is not
  zero, so those tests do read and decide). Each group's mean must be within 4 Monte Carlo
  standard errors (from the chain's ESS) and its sd within 10%: 14 groups, a false failure
  rate near 1e-3; the bias they detect is about 0.1 posterior sd.
- A Gaussian hierarchy with an unknown mean and scale, in the centred and the non-centred
  form: the posterior of the scale is one-dimensional (the group effects and the mean
  integrate out in closed form), and the mean's is Gaussian given the scale, so both are exact
  on a grid. The non-centred form moves the hyperparameters with the groups' means held fixed,
  which needs the Jacobian of the effects' change; dropping it moves the scale's mean by
  several sds.

The Poisson and shared-slope cases run with both tests (``test="t"`` and ``test="barker"``,
the step the defaults of ``AusterityMH`` and ``MinibatchBarkerMH`` build on a hierarchy); the
Poisson case with the decisions fused into one compiled call and in Python
(``step_methods/fused_group_path.py``).

Breaking the kernel (dropping the reverse proposal's density, or the hyperparameters'
Jacobian; in the Barker test, Gaussian noise in place of the logistic noise and correction;
in the fused decisions, the t-test's threshold without the control variate's exact part, or
Barker's estimate not scaled by the group's size) fails these tests (checked when they were
written). Smaller breaks of the fused decisions (the threshold shifted by 0.1 log-units per
group, Barker's correction variable left out) pass them: the groups' proposals are close to
their conditionals, so the decisions' ``Delta_g`` are small and those breaks move the
posterior by less than the 0.1 sd these tests detect; ``tests/test_fused_groups.py`` compares
the fused decisions with Python's one by one.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_subsample as pms
from pymc_subsample import GroupEffectsMH
from pymc_subsample.kernels.group_newton import lapack_symmetric_eigen, symmetric_eigen

SIZES = [0, 1, 3, 20, 50, 51, 80, 200, 400, 1_500, 4_000, 6, 120, 900]


def _poisson_groups(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(SIZES)), SIZES)
    effect = rng.normal(0.5, 1.0, len(SIZES))
    return group, rng.poisson(np.exp(effect[group]))


def _poisson_model(group: np.ndarray, y: np.ndarray) -> pm.Model:
    """Each group's effect ``a ~ Normal(0.5, 1)``, Poisson counts at rate ``exp(a[g])``."""
    with pm.Model(coords={"group": range(len(SIZES))}) as model:
        index = pm.Data("g", group)
        a = pm.Normal("a", 0.5, 1.0, dims="group")
        pm.Poisson("y", pm.math.exp(a[index]), observed=y)
    return model


def _quadrature(y: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    grid = np.linspace(-8.0, 8.0, 200_001)
    means, sds = [], []
    for g in range(len(SIZES)):
        rows = y[group == g]
        log_density = -0.5 * (grid - 0.5) ** 2 + rows.sum() * grid - rows.size * np.exp(grid)
        weights = np.exp(log_density - log_density.max())
        weights /= weights.sum()
        mean = float(weights @ grid)
        means.append(mean)
        sds.append(float(np.sqrt(weights @ (grid - mean) ** 2)))
    return np.array(means), np.array(sds)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "python"])
@pytest.mark.parametrize("test", ["t", "barker"])
def test_poisson_groups_match_quadrature(test, fused):
    group, y = _poisson_groups()
    with _poisson_model(group, y) as model:
        step = GroupEffectsMH([model["a"]], test=test, fused=fused)
        assert (step.draw_path == "fused") == fused
        idata = pm.sample(
            tune=300,
            draws=2_000,
            chains=2,
            cores=1,
            step=step,
            progressbar=False,
            random_seed=11,
            compute_convergence_checks=False,
        )
    means, sds = _quadrature(y, group)
    draws = idata.posterior["a"].values.reshape(-1, len(SIZES))
    ess = az.ess(idata)["a"].values
    z = (draws.mean(axis=0) - means) / (sds / np.sqrt(ess))
    assert np.all(np.abs(z) < 4.0), z
    assert np.all(np.abs(draws.std(axis=0) / sds - 1.0) < 0.1), draws.std(axis=0) / sds
    stats_ = idata.sample_stats
    # Some groups were decided on a sample of their rows: fewer rows than N per draw.
    assert float(stats_["n_data"].mean()) < 0.5 * y.size
    assert float(stats_["n_full_groups"].mean()) < len(SIZES)
    # Barker's acceptance is 1 / (1 + exp(-Delta)): about 1/2 for near-exact proposals.
    assert (0.5 if test == "t" else 0.3) < float(stats_["accept_rate"].mean()) <= 1.0


def test_last_tuning_expansion_is_at_the_mean_of_the_draws_before_it():
    # The expansion at tuning draw 200 is at the mean of draws 50 to 199 (RECENTRE_AT,
    # MEAN_FROM), not at the chain's point then: one draw of a small group's broad
    # conditional can lie in its tail. Fails if the expansion stays at draw 200's point or
    # averages another window (each moves reference_q by far more than 1e-12).
    from pymc.blocking import DictToArrayBijection

    from pymc_subsample.step_methods.group_effects import MEAN_FROM, RECENTRE_AT

    group, y = _poisson_groups()
    with _poisson_model(group, y) as model:
        step = GroupEffectsMH([model["a"]], rng=3)
        q = DictToArrayBijection.map({"a": np.full(len(SIZES), 0.5)})
    points = []
    for _ in range(RECENTRE_AT[-1] + 1):
        points.append(q.data.copy())
        q, _ = step.astep(q)
    window = np.mean(points[MEAN_FROM : RECENTRE_AT[-1]], axis=0)
    np.testing.assert_allclose(step.expansion.reference_q, window, rtol=0, atol=1e-12)
    assert np.max(np.abs(window - points[RECENTRE_AT[-1]])) > 1e-3


GAUSSIAN_SIZES = [1, 2, 5, 10, 30, 60, 100, 300, 1_000, 2, 4, 8]
PRIOR_MEAN_SD, PRIOR_SCALE_SD = 2.0, 1.0


def _gaussian_data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(GAUSSIAN_SIZES)), GAUSSIAN_SIZES)
    effect = 0.7 + 0.6 * rng.normal(size=len(GAUSSIAN_SIZES))
    return group, effect[group] + rng.normal(size=group.size)


def _exact_hyperparameters(group: np.ndarray, y: np.ndarray) -> dict[str, tuple[float, float]]:
    """Posterior mean and sd of the scale and the mean, on a grid over the scale."""
    n = np.bincount(group)
    means = np.bincount(group, y) / n
    scales = np.linspace(1e-4, 4.0, 40_001)
    log_density, mean_given, var_given = [], [], []
    for tau in scales:
        variance = tau**2 + 1.0 / n  # the group means given the scale and the mean
        precision = 1.0 / PRIOR_MEAN_SD**2 + np.sum(1.0 / variance)
        centre = np.sum(means / variance) / precision
        # log N(means; 0, D + s0^2 11^T) by completing the square in the mean.
        log_marginal = (
            -0.5 * np.sum(np.log(variance))
            - 0.5 * np.sum(means**2 / variance)
            + 0.5 * precision * centre**2
            - 0.5 * np.log(precision * PRIOR_MEAN_SD**2)
        )
        log_density.append(log_marginal + stats.halfnorm.logpdf(tau, scale=PRIOR_SCALE_SD))
        mean_given.append(centre)
        var_given.append(1.0 / precision)
    log_density = np.array(log_density)
    weights = np.exp(log_density - log_density.max())
    weights /= weights.sum()
    mean_given, var_given = np.array(mean_given), np.array(var_given)
    scale_mean = float(weights @ scales)
    mu_mean = float(weights @ mean_given)
    return {
        "sd": (scale_mean, float(np.sqrt(weights @ (scales - scale_mean) ** 2))),
        "mu": (mu_mean, float(np.sqrt(weights @ (var_given + (mean_given - mu_mean) ** 2)))),
    }


@pytest.mark.parametrize("form", ["centred", "non_centred", "inline"])
def test_gaussian_hierarchy_hyperparameters_match_the_exact_posterior(form):
    # "inline" writes the non-centred rows as mu + sd * z[g]: the gather-sinking rewrite
    # (model/grouped_rows.sink_gathers) makes mu and sd hyperparameters, as in "non_centred";
    # before it they were coefficients every row reads, moved with z held, and their chains
    # crawled (min ESS of sd far below the 400 asserted here).
    group, y = _gaussian_data()
    with pm.Model(coords={"group": range(len(GAUSSIAN_SIZES))}):
        index = pm.Data("g", group)
        mu = pm.Normal("mu", 0.0, PRIOR_MEAN_SD)
        sd = pm.HalfNormal("sd", PRIOR_SCALE_SD)
        if form == "centred":
            a = pm.Normal("a", mu, sd, dims="group")
        else:
            z = pm.Normal("z", 0.0, 1.0, dims="group")
            a = mu + sd * z
        if form == "inline":
            pm.Normal("y", mu + sd * z[index], 1.0, observed=y)
        else:
            pm.Normal("y", a[index], 1.0, observed=y)
        step = GroupEffectsMH()
        if form != "centred":
            # mu and sd (log) are hyperparameters, read by no row directly.
            assert step.functions.direct_coordinates.size == 0
        idata = pm.sample(
            tune=1_000,
            draws=4_000,
            chains=2,
            cores=1,
            step=step,
            progressbar=False,
            random_seed=5,
            compute_convergence_checks=False,
        )
    exact = _exact_hyperparameters(group, y)
    ess = az.ess(idata)
    for name in ("mu", "sd"):
        draws = idata.posterior[name].values.ravel()
        mean, sd = exact[name]
        z = (draws.mean() - mean) / (sd / np.sqrt(float(ess[name])))
        assert abs(z) < 4.0, (name, draws.mean(), mean, z)
        assert abs(draws.std() / sd - 1.0) < 0.1, (name, draws.std(), sd)
    assert float(ess["sd"]) > 400


def test_variable_read_directly_and_inside_the_groups_parameters_is_refused():
    """``mu`` in ``mu * x + a[g]`` with ``a = mu + sd * z``: its moves would change the rows.

    (``mu + a[g]`` is accepted: the rows read ``mu`` only through ``(mu + a)[g]``.)
    """
    group, y = _poisson_groups()
    x = np.linspace(-1.0, 1.0, group.size)
    with pm.Model(coords={"group": range(len(SIZES))}):
        index = pm.Data("g", group)
        mu = pm.Normal("mu", 0.0, 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        a = mu + 0.5 * z
        pm.Poisson("y", pm.math.exp(mu * x + a[index]), observed=y)
        with pytest.raises(ValueError, match="read both directly and inside"):
            GroupEffectsMH()


def test_a_scale_read_inside_and_beside_the_groups_is_a_shared_coefficient():
    """``sigma`` in ``Normal(mu + sigma * z[g], sigma)``: read by every row as the noise too.

    Moved inside the gather, ``(mu + sigma * z)[g]``, it would be read both there and directly
    (refused); the rows as written, with ``mu`` and ``sigma`` coefficients every row reads,
    have the structure, and the step builds on them.
    """
    group, y = _gaussian_data()
    with pm.Model(coords={"group": range(len(GAUSSIAN_SIZES))}):
        index = pm.Data("g", group)
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        pm.Normal("y", mu + sigma * z[index], sigma, observed=y)
        step = GroupEffectsMH()
    assert step.functions.direct_coordinates.size == 2  # mu and sigma's log


def test_a_scale_read_inside_a_table_and_by_every_row_is_refused():
    """``a = mu + sigma * z; Normal(a[g], sigma)``: the table and the rows both read ``sigma``.

    Before, the check looked for the variables a table reads at the start, where every ``z``
    is 0 and ``sigma`` drops out of ``mu + sigma * z``: it took ``sigma`` for a coefficient
    the table does not read, and its moves held the table's old values.
    """
    group, y = _gaussian_data()
    with pm.Model(coords={"group": range(len(GAUSSIAN_SIZES))}):
        index = pm.Data("g", group)
        mu = pm.Normal("mu", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, dims="group")
        a = mu + sigma * z
        pm.Normal("y", a[index], sigma, observed=y)
        with pytest.raises(ValueError, match="read both directly and inside"):
            GroupEffectsMH()


def test_model_without_groups_is_refused():
    rng = np.random.default_rng(0)
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 1.0)
        pm.Normal("y", beta, 1.0, observed=rng.normal(size=200))
        with pytest.raises(ValueError, match="group index"):
            GroupEffectsMH()


def test_prior_coupling_the_groups_is_refused():
    group, y = _poisson_groups()
    with pm.Model(coords={"group": range(len(SIZES))}):
        index = pm.Data("g", group)
        a = pm.Normal("a", 0.5, 1.0, dims="group")
        pm.Normal("total", a.sum(), 1.0, observed=2.0)
        pm.Poisson("y", pm.math.exp(a[index]), observed=y)
        with pytest.raises(ValueError, match="not group effects"):
            GroupEffectsMH([a])


def test_multivariate_prior_across_groups_is_refused():
    group, y = _poisson_groups()
    n_groups = len(SIZES)
    with pm.Model(coords={"group": range(n_groups)}):
        index = pm.Data("g", group)
        a = pm.MvNormal("a", np.zeros(n_groups), np.eye(n_groups) + 0.5, dims="group")
        pm.Poisson("y", pm.math.exp(a[index]), observed=y)
        with pytest.raises(ValueError, match=r"factorise|another group"):
            GroupEffectsMH([a])


def test_a_rich_group_far_from_the_start_is_reached():
    """A group whose mode is far from the start (4 units on a log link) is not left behind.

    Newton's step from the start overshoots without bound there (exp(32) counts); the start's
    steps are capped, and the chain's mean must be within 5 sds of the exact one.
    """
    rng = np.random.default_rng(3)
    y = rng.poisson(np.exp(4.5), size=3_000)
    with pm.Model():
        a = pm.Normal("a", 0.5, 1.0, shape=1)
        pm.Poisson("y", pm.math.exp(a[np.zeros(y.size, dtype="int64")]), observed=y)
        idata = pm.sample(
            tune=50,
            draws=200,
            chains=1,
            step=GroupEffectsMH([a]),
            progressbar=False,
            random_seed=2,
            compute_convergence_checks=False,
        )
    grid = np.linspace(3.0, 6.0, 300_001)
    log_density = -0.5 * (grid - 0.5) ** 2 + y.sum() * grid - y.size * np.exp(grid)
    weights = np.exp(log_density - log_density.max())
    weights /= weights.sum()
    mean = weights @ grid
    sd = np.sqrt(weights @ (grid - mean) ** 2)
    assert abs(float(idata.posterior["a"].mean()) - mean) < 5 * sd


SHARED_SIZES = [1, 3, 8, 20, 60, 200, 700, 2_500, 5, 40]
TAU, PRIOR_MU_SD, PRIOR_BETA_SD = 0.5, 2.0, 1.0


def _shared_slope_data(
    seed: int = 4, x_mean: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(len(SHARED_SIZES)), SHARED_SIZES)
    # A covariate of mean 1: the slope and the groups' effects are correlated in the
    # posterior, so the cross terms of the expansion matter.
    x = rng.normal(x_mean, 1.0, size=group.size)
    effect = 0.3 + TAU * rng.normal(size=len(SHARED_SIZES))
    return group, x, effect[group] - 0.8 * x + rng.normal(size=group.size)


def _exact_shared_slope(group, x, y) -> tuple[np.ndarray, np.ndarray]:
    """The joint Gaussian posterior of (mu, beta, a_1..a_G): mean and sds."""
    n_groups = len(SHARED_SIZES)
    design = np.zeros((y.size, n_groups + 2))
    design[:, 1] = x
    design[np.arange(y.size), 2 + group] = 1.0
    precision = design.T @ design
    precision[0, 0] += 1.0 / PRIOR_MU_SD**2 + n_groups / TAU**2
    precision[1, 1] += 1.0 / PRIOR_BETA_SD**2
    precision[0, 2:] -= 1.0 / TAU**2
    precision[2:, 0] -= 1.0 / TAU**2
    precision[2:, 2:] += np.eye(n_groups) / TAU**2
    covariance = np.linalg.inv(precision)
    return covariance @ (design.T @ y), np.sqrt(np.diag(covariance))


@pytest.mark.parametrize(
    ("form", "test"),
    [("centred", "t"), ("non_centred", "t"), ("centred", "barker"), ("compound", "t")],
)
def test_shared_coefficient_matches_the_exact_gaussian_posterior(form, test):
    """A slope shared by every row moves on its own test (the groups as strata).

    Everything is Gaussian, so the joint posterior of the mean, the slope and the groups'
    effects is exact; each of them must be within 4 Monte Carlo standard errors (from its
    ESS) and its sd within 10% (12 quantities: false failures near 1e-3). ``compound``: a
    user's compound step, ``AusterityMH(vars=[mu, a])`` (the group route, the slope held at
    PyMC's value) beside ``pm.Metropolis([beta])``, on a centred covariate: with the
    covariate's mean at 1 the slope and the large groups' effects are correlated at 0.99 in
    the posterior, and any Gibbs sampler that moves them apart mixes too slowly for 6,000
    draws (ESS 31).
    """
    group, x, y = _shared_slope_data(x_mean=0.0 if form == "compound" else 1.0)
    with pm.Model(coords={"group": range(len(SHARED_SIZES))}):
        index = pm.Data("g", group)
        covariate = pm.Data("x", x)
        mu = pm.Normal("mu", 0.0, PRIOR_MU_SD)
        beta = pm.Normal("beta", 0.0, PRIOR_BETA_SD)
        if form == "non_centred":
            a = pm.Deterministic("a", mu + TAU * pm.Normal("z", 0.0, 1.0, dims="group"))
        else:
            a = pm.Normal("a", mu, TAU, dims="group")
        pm.Normal("y", a[index] + beta * covariate, 1.0, observed=y)
        if form == "compound":
            step = [pms.AusterityMH([mu, a]), pm.Metropolis([beta])]
            assert isinstance(step[0], GroupEffectsMH) and tuple(step[0].var_names) == ("mu", "a")
        else:
            step = GroupEffectsMH(test=test)
        idata = pm.sample(
            tune=500,
            # pm.Metropolis mixes the slope at ESS ~370 per 6,000 draws: twice the draws keep
            # its sd's check at 10% near 4 of its standard errors.
            draws=6_000 if form == "compound" else 3_000,
            chains=2,
            cores=1,
            step=step,
            progressbar=False,
            random_seed=8,
            compute_convergence_checks=False,
        )
    means, sds = _exact_shared_slope(group, x, y)
    posterior = idata.posterior
    draws = np.column_stack(
        [
            posterior["mu"].values.ravel(),
            posterior["beta"].values.ravel(),
            posterior["a"].values.reshape(-1, len(SHARED_SIZES)),
        ]
    )
    ess = np.array(
        [
            float(az.ess(posterior["mu"].values)),
            float(az.ess(posterior["beta"].values)),
            *(float(az.ess(posterior["a"].values[..., g])) for g in range(len(SHARED_SIZES))),
        ]
    )
    z = (draws.mean(axis=0) - means) / (sds / np.sqrt(ess))
    assert np.all(np.abs(z) < 4.0), z
    assert np.all(np.abs(draws.std(axis=0) / sds - 1.0) < 0.1), draws.std(axis=0) / sds
    if form != "compound":
        assert bool(idata.sample_stats["shared_accepted"].mean() > (0.3 if test == "t" else 0.2))
    else:  # the group step read its own groups' samples, not every row per draw
        assert float(idata.sample_stats["n_data"].mean()) < 0.5 * y.size


N_SITES, N_YEARS, TAU_SITE, TAU_YEAR = 8, 40, 0.6, 0.4


def test_crossed_factors_and_an_intercept_match_the_exact_gaussian_posterior():
    """Two crossed factors and an intercept they are confounded with (a ridge).

    The rows read ``intercept + u[site] + v[year]``: the blocked updates alone cross the
    ridge in steps of the conditional sds (intercept ESS about 3 in 1,000 draws before the
    ridge moves); the factors' cross terms shift each other's expansions. All Gaussian with
    known scales, so the posterior is exact; 14 quantities within 4 Monte Carlo standard
    errors and sds within 10% (false failures near 1e-3).
    """
    rng = np.random.default_rng(6)
    site = rng.integers(0, N_SITES, 3_000)
    year = rng.integers(0, N_YEARS, 3_000)
    u_true = TAU_SITE * rng.normal(size=N_SITES)
    v_true = TAU_YEAR * rng.normal(size=N_YEARS)
    y = 1.0 + u_true[site] + v_true[year] + rng.normal(size=site.size)
    with pm.Model(coords={"site": range(N_SITES), "year": range(N_YEARS)}):
        site_index = pm.Data("site_idx", site)
        year_index = pm.Data("year_idx", year)
        intercept = pm.Normal("intercept", 0.0, 2.0)
        u = pm.Normal("u", 0.0, TAU_SITE, dims="site")
        v = pm.Normal("v", 0.0, TAU_YEAR, dims="year")
        # With two factors no parameter is moved inside a gather (``sink_gathers``): inside
        # the site factor's table the intercept would move along its ridge with u only, and
        # the chain would stick on its ridge with v.
        pm.Normal("y", intercept + u[site_index] + v[year_index], 1.0, observed=y)
        # Batches of 5 rows: every group's test is sampled, so the cross terms decide.
        step = GroupEffectsMH(batch_size=5)
        idata = pm.sample(
            tune=500,
            draws=3_000,
            chains=2,
            cores=1,
            step=step,
            progressbar=False,
            random_seed=9,
            compute_convergence_checks=False,
        )
    assert step.expansion.ridges, "the intercept's ridges with u and v were not found"
    design = np.zeros((y.size, 1 + N_SITES + N_YEARS))
    design[:, 0] = 1.0
    design[np.arange(y.size), 1 + site] = 1.0
    design[np.arange(y.size), 1 + N_SITES + year] = 1.0
    prior = np.concatenate(
        [[1 / 4.0], np.full(N_SITES, TAU_SITE**-2), np.full(N_YEARS, TAU_YEAR**-2)]
    )
    covariance = np.linalg.inv(design.T @ design + np.diag(prior))
    means, sds = covariance @ (design.T @ y), np.sqrt(np.diag(covariance))
    posterior = idata.posterior
    columns = [
        posterior["intercept"].values[..., None],
        posterior["u"].values,
        posterior["v"].values,
    ]
    draws = np.concatenate(columns, axis=-1)
    ess = np.array([float(az.ess(draws[..., k])) for k in range(draws.shape[-1])])
    flat = draws.reshape(-1, draws.shape[-1])
    z = (flat.mean(axis=0) - means) / (sds / np.sqrt(ess))
    assert np.all(np.abs(z) < 4.0), z
    assert np.all(np.abs(flat.std(axis=0) / sds - 1.0) < 0.1), flat.std(axis=0) / sds
    assert ess.min() > 200, ess


def test_groups_read_whole_warn_that_full_data_is_faster():
    """300 groups of 4 rows: every draw reads every row, and the user is told why (once).

    1,000 draws: PyMC 5 does not tell a step how many draws a chain makes, and the check
    then runs every 1,000 draws after tuning (``diagnostics.CHECK_EVERY``).
    """
    rng = np.random.default_rng(2)
    group = np.repeat(np.arange(300), 4)
    y = rng.poisson(np.exp(rng.normal(0.0, 0.5, 300)[group]))
    with pm.Model(coords={"group": range(300)}):
        index = pm.Data("g", group)
        mu = pm.Normal("mu", 0.0, 1.0)
        a = pm.Normal("a", mu, 0.5, dims="group")
        pm.Poisson("y", pm.math.exp(a[index]), observed=y)
        with pytest.warns(pms.SubsampleWarning, match="groups of at most batch_size") as caught:
            pm.sample(
                tune=20, draws=1_000, chains=1, step=pms.AusterityMH(), progressbar=False,
                random_seed=1, compute_convergence_checks=False,
            )  # fmt: skip
    said = [w for w in caught if "full-data NUTS" in str(w.message)]
    assert len(said) == 1 and "100%" in str(said[0].message)


def test_error_tolerance_zero_reads_every_group_whole_without_stages():
    """Exact Metropolis-within-Gibbs: each group read once, whole, and no cost warning."""
    group, y = _poisson_groups()
    with _poisson_model(group, y):
        with warnings.catch_warnings():
            warnings.simplefilter("error", pms.SubsampleWarning)
            idata = pm.sample(
                tune=5, draws=20, chains=1, step=GroupEffectsMH(error_tolerance=0.0),
                progressbar=False, random_seed=3, compute_convergence_checks=False,
            )  # fmt: skip
    stats_ = idata.sample_stats
    assert np.all(stats_["n_data"].values == y.size)  # every row once: no stage read before
    assert np.all(stats_["n_full_groups"].values == len(SIZES))


@pytest.mark.parametrize("eigen", [symmetric_eigen, lapack_symmetric_eigen])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_symmetric_eigen_reconstructs_every_matrix(k, eigen):
    """The closed-form decompositions (k = 1, 2) and LAPACK's (k = 3, and the compiled sweep's
    for k > 2 at every k) give V diag(w) V^T = A.

    Deterministic: random symmetric matrices, diagonal ones (theta = 0) and a multiple of the
    identity (a repeated eigenvalue, any rotation) to rounding error; a wrong angle or a
    swapped sign in the 2 x 2 rotation fails by O(1).
    """
    rng = np.random.default_rng(0)
    matrices = rng.normal(size=(200, k, k))
    matrices = matrices + np.swapaxes(matrices, 1, 2)
    matrices[:3] = np.diag(np.arange(1.0, k + 1.0))
    matrices[3] = 2.0 * np.eye(k)
    values, vectors = eigen(matrices)
    rebuilt = np.einsum("gij,gj,gkj->gik", vectors, values, vectors)
    np.testing.assert_allclose(rebuilt, matrices, atol=1e-12)
    orthogonality = np.einsum("gji,gjk->gik", vectors, vectors)
    np.testing.assert_allclose(
        orthogonality, np.broadcast_to(np.eye(k), orthogonality.shape), atol=1e-12
    )


@pytest.mark.parametrize("k", [1, 2, 3])
def test_newton_proposals_match_the_linear_algebra_they_stand_for(k):
    """The compiled proposal algebra (``kernels/group_newton.py``) against NumPy's formulas.

    The quadratic model's derivatives (``grad log p + J^T (s + H (c - c_r))``, ``Hess log p +
    J^T H J``), the Newton mean ``x + P^-1 grad`` with ``P = -Hess`` (negative definite here,
    so no eigenvalue is flipped or floored) and the Student-t log-density up to its constant;
    deterministic, to rounding error. A group with a NaN gradient gets a NaN mean.
    """
    from pymc_subsample.kernels.group_newton import (
        PROPOSAL_DF,
        cell_model_derivatives,
        newton_gaussian,
        proposal_log_density,
    )

    rng = np.random.default_rng(1)
    n_groups, n_cells = 50, k + 1
    prior_gradient = rng.normal(size=(n_groups, k))
    prior_hessian = -np.eye(k) * rng.uniform(0.5, 2.0, (n_groups, 1, 1))
    cells, reference = rng.normal(size=(2, n_groups, n_cells))
    jacobian = rng.normal(size=(n_groups, n_cells, k))
    cell_gradient = rng.normal(size=(n_groups, n_cells))
    root = rng.normal(size=(n_groups, n_cells, n_cells))
    cell_hessian = -np.einsum("gij,gkj->gik", root, root)  # negative semi-definite
    gradient, hessian = cell_model_derivatives(
        prior_gradient, prior_hessian, cells, jacobian, reference, cell_gradient, cell_hessian
    )
    at_cells = cell_gradient + np.einsum("gcd,gd->gc", cell_hessian, cells - reference)
    np.testing.assert_allclose(
        gradient, prior_gradient + np.einsum("gci,gc->gi", jacobian, at_cells), atol=1e-12
    )
    expected_hessian = prior_hessian + np.einsum(
        "gci,gcd,gdj->gij", jacobian, cell_hessian, jacobian
    )
    np.testing.assert_allclose(hessian, expected_hessian, atol=1e-12)
    x = rng.normal(size=(n_groups, k))
    gradient[0, 0] = np.nan
    mean, vectors, values = newton_gaussian(x, gradient, hessian)
    solved = x + np.linalg.solve(-hessian, gradient[:, :, None])[:, :, 0]
    np.testing.assert_allclose(mean[1:], solved[1:], rtol=1e-9, atol=1e-9)
    assert np.all(np.isnan(mean[0]))
    y = rng.normal(size=(n_groups, k))
    difference = (y - mean)[1:]
    distance = np.einsum("gi,gij,gj->g", difference, -hessian[1:], difference)
    expected = -0.5 * (PROPOSAL_DF + k) * np.log1p(distance / PROPOSAL_DF) + 0.5 * np.log(
        np.linalg.det(-hessian[1:])
    )
    np.testing.assert_allclose(
        proposal_log_density(y, mean, vectors, values)[1:], expected, rtol=1e-9
    )


TABLE_SIZES = (2, 9, 30, 120, 600, 2_500)
TABLE_PRIOR_MEAN, TABLE_PRIOR_SD = np.array([0.3, -0.8]), np.array([0.7, 0.4])


def test_a_table_read_by_group_and_column_matches_the_exact_posterior():
    """Intercepts and slopes as one (group, 2) table read ``ab[g, 0] + ab[g, 1] * x``.

    The gallery's spelling of correlated effects (an ``MvNormal`` table); here with a fixed
    Normal prior, so each group's (intercept, slope) posterior is an exact bivariate
    Gaussian. ``AusterityMH()`` must take the group route (``ab[g, j]`` read as ``ab[g][:,
    j]``, ``grouped_rows.split_column_gathers``), and each group's two means be within 4
    Monte Carlo standard errors and sds within 10% (12 quantities: false failures near
    1e-3). Reading every row's column 0 for both terms (tried) moves the slopes by many sds.
    """
    rng = np.random.default_rng(11)
    group = np.repeat(np.arange(len(TABLE_SIZES)), TABLE_SIZES)
    x = rng.normal(0.5, 1.0, group.size)
    effects = TABLE_PRIOR_MEAN + TABLE_PRIOR_SD * rng.normal(size=(len(TABLE_SIZES), 2))
    y = effects[group, 0] + effects[group, 1] * x + rng.normal(size=group.size)
    with pm.Model(coords={"group": range(len(TABLE_SIZES)), "param": ["a", "b"]}):
        index = pm.Data("g", group)
        covariate = pm.Data("x", x)
        ab = pm.Normal("ab", TABLE_PRIOR_MEAN, TABLE_PRIOR_SD, dims=("group", "param"))
        pm.Normal("y", ab[index, 0] + ab[index, 1] * covariate, 1.0, observed=y)
        step = pms.AusterityMH()
        assert isinstance(step, GroupEffectsMH)
        idata = pm.sample(
            tune=500, draws=3_000, chains=2, cores=1, step=step, progressbar=False,
            random_seed=5, compute_convergence_checks=False,
        )  # fmt: skip
    draws = idata.posterior["ab"].values  # (chain, draw, group, 2)
    for g in range(len(TABLE_SIZES)):
        rows = group == g
        design = np.column_stack([np.ones(rows.sum()), x[rows]])
        precision = design.T @ design + np.diag(1.0 / TABLE_PRIOR_SD**2)
        covariance = np.linalg.inv(precision)
        mean = covariance @ (design.T @ y[rows] + TABLE_PRIOR_MEAN / TABLE_PRIOR_SD**2)
        sd = np.sqrt(np.diag(covariance))
        for j in range(2):
            values = draws[..., g, j]
            standard_error = sd[j] / np.sqrt(float(az.ess(values)))
            assert abs(values.mean() - mean[j]) < 4.0 * standard_error, (g, j)
            assert abs(values.std() / sd[j] - 1.0) < 0.1, (g, j, values.std() / sd[j])

"""PyMC translations of posteriordb's Stan models, and the loader of their data files.

Each builder mirrors the Stan program named in its docstring (path under
``posterior_database/models/stan/``): the same priors (Stan's improper defaults become
``pm.Flat``/``pm.HalfFlat``), the same parametrisation and the same parameter names, so that a
PyMC variable ``beta`` of length k maps to Stan's ``beta[1]`` ... ``beta[k]``. Stan's
``transformed data`` is computed here in NumPy (reductions over rows inside a model would change
its meaning on a subset of rows). Each builder returns the model and its number of rows N.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pymc.distributions.transforms import ordered

DATA_DIR = Path(__file__).parent / "data"
Builder = Callable[[dict[str, Any]], tuple[pm.Model, int]]


@dataclass(frozen=True)
class RealModel:
    """A posteriordb posterior, its PyMC builder and a one-line description."""

    posterior: str
    kind: str
    build: Builder
    #: Free variables that only the prior sees (a hierarchy's location and scale): the
    #: documented recipe samples them in their own step, without control variates.
    hyperparameters: tuple[str, ...] = ()


def load(posterior: str) -> dict[str, Any]:
    """The data file of ``posterior`` (data, provenance, reference summary)."""
    path = DATA_DIR / f"{posterior}.json"
    if path.exists():
        return json.loads(path.read_text())
    return json.loads(gzip.decompress((DATA_DIR / f"{posterior}.json.gz").read_bytes()))


def arr(data: dict[str, Any], key: str) -> np.ndarray:
    return np.asarray(data[key], dtype="float64")


def diamonds(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """diamonds.stan (brms): centred predictors, normal_id_glm, 24 slopes."""
    X = np.asarray(d["X"], dtype="float64")[:, 1:]
    Xc = X - X.mean(axis=0)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=Xc.shape[1])
        intercept = pm.StudentT("Intercept", nu=3, mu=8, sigma=10)
        sigma = pm.HalfStudentT("sigma", nu=3, sigma=10)
        pm.Normal("Y", intercept + Xc @ b, sigma, observed=arr(d, "Y"))
    return model, Xc.shape[0]


def nes(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """nes.stan: party id on ideology, race, age class, education, gender, income (flat priors)."""
    age = np.asarray(d["age_discrete"])
    cols = ["real_ideo", "race_adj"]
    X = np.column_stack(
        [np.ones(age.size)]
        + [arr(d, c) for c in cols]
        + [(age == k).astype("float64") for k in (2, 3, 4)]
        + [arr(d, c) for c in ("educ1", "gender", "income")]
    )
    with pm.Model() as model:
        beta = pm.Flat("beta", shape=9)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("partyid7", X @ beta, sigma, observed=arr(d, "partyid7"))
    return model, X.shape[0]


def kidscore_interaction(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """kidscore_interaction.stan: flat beta, sigma ~ cauchy(0, 2.5) on sigma > 0."""
    hs, iq = arr(d, "mom_hs"), arr(d, "mom_iq")
    X = np.column_stack([np.ones_like(hs), hs, iq, hs * iq])
    with pm.Model() as model:
        beta = pm.Flat("beta", shape=4)
        sigma = pm.HalfCauchy("sigma", 2.5)
        pm.Normal("kid_score", X @ beta, sigma, observed=arr(d, "kid_score"))
    return model, X.shape[0]


def logearn_interaction_z(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """logearn_interaction_z.stan: log earnings on standardised height, sex and their product."""
    height, male = arr(d, "height"), arr(d, "male")
    z = (height - height.mean()) / height.std(ddof=1)
    X = np.column_stack([np.ones_like(z), z, male, z * male])
    with pm.Model() as model:
        beta = pm.Flat("beta", shape=4)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("log_earn", X @ beta, sigma, observed=np.log(arr(d, "earn")))
    return model, X.shape[0]


def blr(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """blr.stan: beta ~ normal(0, 10), sigma ~ normal(0, 10) on sigma > 0."""
    X = np.asarray(d["X"], dtype="float64")
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=X.shape[1])
        sigma = pm.HalfNormal("sigma", 10.0)
        pm.Normal("y", X @ beta, sigma, observed=arr(d, "y"))
    return model, X.shape[0]


def logmesquite_logvash(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """logmesquite_logvash.stan: log weight on log canopy volume, area, shape, height, group."""
    d1, d2, ch = arr(d, "diam1"), arr(d, "diam2"), arr(d, "canopy_height")
    X = np.column_stack(
        [
            np.ones_like(d1),
            np.log(d1 * d2 * ch),
            np.log(d1 * d2),
            np.log(d1 / d2),
            np.log(arr(d, "total_height")),
            arr(d, "group"),
        ]
    )
    with pm.Model() as model:
        beta = pm.Flat("beta", shape=6)
        sigma = pm.HalfFlat("sigma")
        pm.Normal("log_weight", X @ beta, sigma, observed=np.log(arr(d, "weight")))
    return model, X.shape[0]


def kilpisjarvi(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """kilpisjarvi.stan: temperature on year (uncentred, x near 4000), flat sigma > 0."""
    x = arr(d, "x")
    with pm.Model() as model:
        alpha = pm.Normal("alpha", d["pmualpha"], d["psalpha"])
        beta = pm.Normal("beta", d["pmubeta"], d["psbeta"])
        sigma = pm.HalfFlat("sigma")
        pm.Normal("y", alpha + beta * x, sigma, observed=arr(d, "y"))
    return model, x.size


def ark(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """arK.stan: AR(K) written as a regression of y[t] on the K lagged columns, t > K."""
    y, k = arr(d, "y"), int(d["K"])
    lags = np.column_stack([y[k - j - 1 : y.size - j - 1] for j in range(k)])
    with pm.Model() as model:
        alpha = pm.Normal("alpha", 0.0, 10.0)
        beta = pm.Normal("beta", 0.0, 10.0, shape=k)
        sigma = pm.HalfCauchy("sigma", 2.5)
        pm.Normal("y", alpha + lags @ beta, sigma, observed=y[k:])
    return model, y.size - k


def low_dim_gauss_mix(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """low_dim_gauss_mix.stan: two-component normal mixture, ordered means."""
    y = arr(d, "y")
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0, shape=2, transform=ordered, initval=np.array([-1.0, 1.0]))
        sigma = pm.HalfNormal("sigma", 2.0, shape=2)
        theta = pm.Beta("theta", 5.0, 5.0)
        weights = pt.stack([theta, 1.0 - theta])
        pm.NormalMixture("y", w=weights, mu=mu, sigma=sigma, observed=y)
    return model, y.size


def eight_schools_noncentered(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """eight_schools_noncentered.stan: one latent effect per row (school)."""
    y, s = arr(d, "y"), arr(d, "sigma")
    with pm.Model() as model:
        theta_trans = pm.Normal("theta_trans", 0.0, 1.0, shape=y.size)
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta = pm.Deterministic("theta", theta_trans * tau + mu)
        pm.Normal("y", theta, s, observed=y)
    return model, y.size


def wells_daae_c(d: dict[str, Any]) -> tuple[pm.Model, int]:
    """wells_daae_c_model.stan: logistic regression, 5 centred predictors, flat priors."""
    dist, ars = arr(d, "dist"), arr(d, "arsenic")
    c_dist100 = (dist - dist.mean()) / 100.0
    c_arsenic = ars - ars.mean()
    X = np.column_stack(
        [c_dist100, c_arsenic, c_dist100 * c_arsenic, arr(d, "assoc"), arr(d, "educ") / 4.0]
    )
    with pm.Model() as model:
        alpha = pm.Flat("alpha")
        beta = pm.Flat("beta", shape=5)
        pm.Bernoulli("switched", logit_p=alpha + X @ beta, observed=np.asarray(d["switched"]))
    return model, X.shape[0]


def radon_intercept(d: dict[str, Any], centred: bool) -> tuple[pm.Model, int]:
    """radon_variable_intercept_(non)centered.stan: 85 county intercepts, one floor slope."""
    county = np.asarray(d["county_idx"]) - 1
    floor = arr(d, "floor_measure")
    with pm.Model() as model:
        sigma_y = pm.HalfNormal("sigma_y", 1.0)
        sigma_alpha = pm.HalfNormal("sigma_alpha", 1.0)
        mu_alpha = pm.Normal("mu_alpha", 0.0, 10.0)
        beta = pm.Normal("beta", 0.0, 10.0)
        if centred:
            alpha = pm.Normal("alpha", mu_alpha, sigma_alpha, shape=int(d["J"]))
        else:
            alpha_raw = pm.Normal("alpha_raw", 0.0, 1.0, shape=int(d["J"]))
            alpha = pm.Deterministic("alpha", mu_alpha + sigma_alpha * alpha_raw)
        pm.Normal("log_radon", alpha[county] + floor * beta, sigma_y, observed=arr(d, "log_radon"))
    return model, floor.size


def radon_centred(d: dict[str, Any]) -> tuple[pm.Model, int]:
    return radon_intercept(d, centred=True)


def radon_noncentred(d: dict[str, Any]) -> tuple[pm.Model, int]:
    return radon_intercept(d, centred=False)


MODELS: dict[str, RealModel] = {
    m.posterior: m
    for m in [
        RealModel("diamonds-diamonds", "linear, 24 predictors", diamonds),
        RealModel("nes2000-nes", "linear, 8 predictors", nes),
        RealModel("kidiq-kidscore_interaction", "linear, 3 predictors", kidscore_interaction),
        RealModel("earnings-logearn_interaction_z", "linear, 3 predictors", logearn_interaction_z),
        RealModel("sblrc-blr", "linear, 5 predictors", blr),
        RealModel("mesquite-logmesquite_logvash", "linear, 5 predictors", logmesquite_logvash),
        RealModel("kilpisjarvi_mod-kilpisjarvi", "linear, 1 predictor, uncentred", kilpisjarvi),
        RealModel("arK-arK", "autoregression AR(5)", ark),
        RealModel("low_dim_gauss_mix-low_dim_gauss_mix", "2-component mixture", low_dim_gauss_mix),
        RealModel("wells_data-wells_daae_c_model", "logistic, 5 predictors", wells_daae_c),
        RealModel(
            "radon_mn-radon_variable_intercept_centered",
            "hierarchical, 85 groups",
            radon_centred,
            hyperparameters=("mu_alpha", "sigma_alpha"),
        ),
        RealModel(
            "radon_mn-radon_variable_intercept_noncentered",
            "hierarchical, 85 groups, non-centred",
            radon_noncentred,
        ),
        RealModel(
            "eight_schools-eight_schools_noncentered",
            "per-row latents",
            eight_schools_noncentered,
        ),
    ]
}

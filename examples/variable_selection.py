"""Variable selection with ``pms.ReversibleJumpMH`` (Korattikara et al. 2014, section 6.3).

Two spike-and-slab models, written in PyMC with D inclusion indicators ``gamma`` and D
coefficients ``beta`` whose likelihood reads ``gamma * beta``:

- :func:`linear_selection_model`: Gaussian regression with known noise and a Gaussian slab.
  Each model ``gamma``'s marginal likelihood is Gaussian in closed form, so the posterior over
  all ``2^D`` models is known exactly (:func:`exact_model_probabilities`): the reference the
  tests compare the sampler with.
- :func:`lasso_logistic_model`: the paper's experiment, logistic regression with a Laplace
  (Bayesian lasso) slab and a prior on the model size; for tall synthetic data from
  :func:`make_logistic_data` (the MiniBooNE data of the paper cannot be downloaded here).

Run ``python examples/variable_selection.py`` for the linear model against enumeration.
"""

from __future__ import annotations

import itertools

import numpy as np
import pymc as pm
from scipy.special import logsumexp

import pymc_subsample as pms

__all__ = [
    "exact_model_probabilities",
    "lasso_logistic_model",
    "linear_selection_model",
    "make_linear_data",
    "make_logistic_data",
]


def make_linear_data(
    n_rows: int, coefficients: np.ndarray, noise_sd: float = 1.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal covariates (pairwise correlation 0.5) and ``y = X beta + noise``."""
    rng = np.random.default_rng(seed)
    d = len(coefficients)
    covariance = 0.5 * np.eye(d) + 0.5
    X = rng.multivariate_normal(np.zeros(d), covariance, size=n_rows)
    return X, X @ np.asarray(coefficients) + noise_sd * rng.normal(size=n_rows)


def linear_selection_model(
    X: np.ndarray,
    y: np.ndarray,
    noise_sd: float = 1.0,
    slab_sd: float = 1.0,
    inclusion: float = 0.5,
) -> pm.Model:
    """``y ~ N(X (gamma * beta), noise_sd)``, ``beta_j ~ N(0, slab_sd)``, ``gamma_j ~ Bern``."""
    with pm.Model(coords={"feature": np.arange(X.shape[1])}) as model:
        gamma = pm.Bernoulli("gamma", p=inclusion, dims="feature")
        beta = pm.Normal("beta", 0.0, slab_sd, dims="feature")
        pm.Normal("y", mu=X @ (gamma * beta), sigma=noise_sd, observed=y)
    return model


def exact_model_probabilities(
    X: np.ndarray,
    y: np.ndarray,
    noise_sd: float = 1.0,
    slab_sd: float = 1.0,
    inclusion: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior probability of every model of :func:`linear_selection_model`, by enumeration.

    ``log p(y | gamma) = -N/2 log(2 pi s^2) - k log t - 1/2 log det A - 1/2 (y'y / s^2 -
    b' A^-1 b)`` with ``A = X_g' X_g / s^2 + I / t^2`` and ``b = X_g' y / s^2`` (the Gaussian
    marginal likelihood of Bayesian linear regression; ``s`` the noise sd, ``t`` the slab sd).

    Returns
    -------
    models : ndarray
        Shape (2^D, D), entries 0 and 1.
    probabilities : ndarray
        Shape (2^D,).
    """
    n_rows, d = X.shape
    gram, cross, yy = X.T @ X, X.T @ y, float(y @ y)
    models = np.array(list(itertools.product([0, 1], repeat=d)), dtype=np.int64)
    log_posterior = np.empty(len(models))
    for m, gamma in enumerate(models):
        idx = np.flatnonzero(gamma)
        k = idx.size
        log_ml = -0.5 * n_rows * np.log(2 * np.pi * noise_sd**2) - 0.5 * yy / noise_sd**2
        if k:
            A = gram[np.ix_(idx, idx)] / noise_sd**2 + np.eye(k) / slab_sd**2
            b = cross[idx] / noise_sd**2
            _, log_det = np.linalg.slogdet(A)
            log_ml += -k * np.log(slab_sd) - 0.5 * log_det + 0.5 * b @ np.linalg.solve(A, b)
        log_prior = k * np.log(inclusion) + (d - k) * np.log1p(-inclusion)
        log_posterior[m] = log_ml + log_prior
    return models, np.exp(log_posterior - logsumexp(log_posterior))


def make_logistic_data(
    n_rows: int, n_features: int, n_relevant: int = 5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Covariates (a column of ones first), labels, and the true coefficients (a few nonzero)."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_rows), rng.normal(size=(n_rows, n_features - 1))])
    truth = np.zeros(n_features)
    truth[:n_relevant] = rng.choice([-1.0, 1.0], size=n_relevant) * rng.uniform(
        0.2, 1.0, size=n_relevant
    )
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-X @ truth))).astype(np.int64)
    return X, y, truth


def lasso_logistic_model(
    X: np.ndarray, y: np.ndarray, slab_scale: float = 1.0, inclusion: float = 0.1
) -> pm.Model:
    """Logistic regression with a Laplace (Bayesian lasso) slab and Bernoulli indicators."""
    with pm.Model(coords={"feature": np.arange(X.shape[1])}) as model:
        gamma = pm.Bernoulli("gamma", p=inclusion, dims="feature")
        beta = pm.Laplace("beta", 0.0, slab_scale, dims="feature")
        pm.Bernoulli("y", logit_p=X @ (gamma * beta), observed=y)
    return model


def main() -> None:
    """ReversibleJumpMH on a linear model with 6 features against the exact posterior."""
    truth = np.array([0.4, 0.0, -0.3, 0.0, 0.0, 0.15])
    X, y = make_linear_data(20_000, truth)
    models, probabilities = exact_model_probabilities(X, y)
    exact = probabilities @ models
    with linear_selection_model(X, y):
        step = pms.ReversibleJumpMH("gamma", "beta", update_sd=0.01, error_tolerance=0.01)
        idata = pm.sample(draws=20_000, tune=1_000, chains=2, step=step, random_seed=1)
    sampled = idata.posterior["gamma"].mean(("chain", "draw")).to_numpy()
    print("exact inclusion probabilities  ", exact.round(3))
    print("ReversibleJumpMH               ", sampled.round(3))
    print("rows per draw", float(idata.sample_stats["n_data"].mean()), "of", len(y))


if __name__ == "__main__":
    main()

"""A dense Boltzmann machine sampled by Gibbs updates on subsampled terms (``pms.AusterityGibbs``).

Korattikara, Chen and Welling (2014), supplementary F, run Gibbs sampling on a densely
connected Markov random field whose joint density is a product of many terms, deciding each
update from a subsample of them. This example is such a field written as a PyMC model: D
binary units ``x`` (spins ``s = 2 x - 1``) and N terms, one per stored pattern ``xi_n`` in
``{-1, 1}^D``,

    log f_n(x) = beta / (2 D N) (xi_n . s)^2,

so that ``sum_n log f_n = (beta / 2D) s^T W s`` with couplings ``W`` the patterns' mean outer
product: every term reads every unit (a fully connected Boltzmann machine), and the terms are
the rows of an observed ``pm.CustomDist``. The patterns are noisy copies of a few prototypes,
so the units are strongly correlated. For small D the distribution is known exactly by
enumerating its ``2^D`` states (:func:`exact_distribution`).

- :func:`make_patterns`: the N patterns;
- :func:`boltzmann_model`: the PyMC model;
- :func:`exact_distribution`: the ``2^D`` states and their probabilities, from the model's own
  log-density (PyMC's ``compile_logp``), independent of the package's per-row code.

Run ``python examples/boltzmann_gibbs.py`` to compare exact Gibbs with the subsampled one.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pymc as pm
import pytensor.tensor as pt

import pymc_subsample as pms

__all__ = ["boltzmann_model", "exact_distribution", "make_patterns"]


def make_patterns(
    n_patterns: int,
    n_units: int,
    n_prototypes: int = 2,
    flip_probability: float = 0.2,
    seed: int = 0,
) -> np.ndarray:
    """Noisy copies of a few random prototypes in ``{-1, 1}^D``.

    Parameters
    ----------
    n_patterns : int
        N, the number of terms.
    n_units : int
        D, the number of binary units.
    n_prototypes : int, default 2
        Prototypes the patterns are copied from (each pattern picks one at random).
    flip_probability : float, default 0.2
        Probability that a pattern's entry is flipped from its prototype's.
    seed : int, default 0

    Returns
    -------
    ndarray
        Shape (N, D), entries -1.0 and 1.0.
    """
    rng = np.random.default_rng(seed)
    prototypes = rng.choice([-1.0, 1.0], size=(n_prototypes, n_units))
    which = rng.integers(n_prototypes, size=n_patterns)
    flips = np.where(rng.random((n_patterns, n_units)) < flip_probability, -1.0, 1.0)
    return prototypes[which] * flips


def boltzmann_model(
    patterns: np.ndarray, beta: float = 1.0, bias: np.ndarray | None = None
) -> pm.Model:
    """The Boltzmann machine of the module's docstring as a PyMC model.

    Parameters
    ----------
    patterns : ndarray
        Shape (N, D): the terms' patterns (rows).
    beta : float, default 1.0
        Inverse temperature of the couplings.
    bias : ndarray, optional
        Log-odds of each unit's prior ``pm.Bernoulli`` (default 0: ``p = 1/2``).

    Returns
    -------
    pymc.Model
        Free variable ``"x"`` (``pm.Bernoulli``, shape D) and observed ``"patterns"``, a
        ``pm.CustomDist`` with one term per row.
    """
    n_patterns, n_units = patterns.shape
    scale = beta / (2.0 * n_units * n_patterns)

    def term(value: pt.TensorVariable, x: pt.TensorVariable) -> pt.TensorVariable:
        spins = 2.0 * x - 1.0
        return scale * pt.sqr(pt.sum(value * spins, axis=-1))

    with pm.Model() as model:
        logit_p = np.zeros(n_units) if bias is None else np.asarray(bias, dtype=float)
        x = pm.Bernoulli("x", logit_p=logit_p, shape=n_units)
        pm.CustomDist("patterns", x, logp=term, observed=patterns, signature="(d)->(d)")
    return model


def exact_distribution(model: pm.Model) -> tuple[np.ndarray, np.ndarray]:
    """Every state of the model's binary ``x`` and its probability, by enumeration.

    Parameters
    ----------
    model : pymc.Model
        A model from :func:`boltzmann_model` (D up to about 16).

    Returns
    -------
    states : ndarray
        Shape (2^D, D), entries 0 and 1.
    probabilities : ndarray
        Shape (2^D,), summing to 1.
    """
    logp = model.compile_logp()
    n_units = int(model.initial_point()["x"].size)
    states = np.array(list(itertools.product([0, 1], repeat=n_units)), dtype=np.int64)
    log_density = np.array([logp({"x": state}) for state in states])
    weights = np.exp(log_density - log_density.max())
    return states, weights / weights.sum()


def main() -> None:
    """Exact and subsampled Gibbs on 8 units and 20,000 terms, against enumeration."""
    patterns = make_patterns(20_000, 8)
    model = boltzmann_model(patterns)
    states, probabilities = exact_distribution(model)
    exact = probabilities @ states
    for tolerance in (0.0, 0.01, 0.05):
        with model:
            step = pms.AusterityGibbs(error_tolerance=tolerance)
            start = time.perf_counter()
            idata = pm.sample(
                draws=2_000, tune=0, chains=1, step=step, progressbar=False, random_seed=1
            )
            seconds = time.perf_counter() - start
        means = idata.posterior["x"].mean(("chain", "draw")).to_numpy()
        rows = idata.sample_stats["n_data"] / idata.sample_stats["n_updates"]
        print(
            f"epsilon {tolerance}: rows per update {float(rows.mean()):8.0f} of "
            f"{len(patterns)}, max marginal error {np.abs(means - exact).max():.3f}, "
            f"{seconds:.1f} s"
        )


if __name__ == "__main__":
    main()

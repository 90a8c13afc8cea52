"""NumPyro's HMCECS on a logistic regression saved by ``benchmarks/hmcecs_logistic.py``.

Runs in the optional environment of ``requirements.txt`` (NumPyro and CPU JAX; no PyMC), as
``run_hmcecs.py DATA.npz OUT.npz``. It reads ``X`` and ``y``, and then, timed together as the
wall time of the run:

1. finds the reference point by full-data Newton on the log posterior (prior Normal(0, 2) on
   every coefficient, as the PyMC model), jitted by JAX: the fastest reference NumPyro users
   have (the HMCECS example uses SVI, which is slower);
2. samples with ``HMCECS(NUTS(model), num_blocks=100, proxy=HMCECS.taylor_proxy(reference))``,
   subsample size 1,000, one chain, as in NumPyro's ``examples/hmcecs.py`` (Dang, Quiroz,
   Kohn, Tran and Villani 2019: energy-conserving subsampled HMC with a second-order Taylor
   proxy).

Writes the draws, the wall seconds (set-up and sampling), the number of leapfrog steps per
draw and the subsample size to ``OUT.npz``; the parent computes ESS and errors with ArviZ, as
for every other sampler of the benchmark.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import HMCECS, MCMC, NUTS

PRIOR_SD = 2.0
SUBSAMPLE = 1_000
BLOCKS = 100


def model(X: jnp.ndarray, y: jnp.ndarray, n_rows: int) -> None:
    """Logistic regression with the subsampled likelihood of NumPyro's HMCECS."""
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(X.shape[1]), PRIOR_SD))
    with numpyro.plate("N", n_rows, subsample_size=SUBSAMPLE):
        rows = numpyro.subsample(X, event_dim=1)
        labels = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=rows @ beta), obs=labels)


def newton_reference(X: jnp.ndarray, y: jnp.ndarray, iterations: int = 20) -> jnp.ndarray:
    """Mode of the full-data log posterior by Newton's method (a fixed number of iterations)."""

    def log_posterior(beta: jnp.ndarray) -> jnp.ndarray:
        logits = X @ beta
        return jnp.sum(y * logits - jnp.logaddexp(0.0, logits)) - 0.5 * beta @ beta / PRIOR_SD**2

    gradient, hessian = jax.grad(log_posterior), jax.hessian(log_posterior)

    @jax.jit
    def newton(beta: jnp.ndarray) -> jnp.ndarray:
        def update(_: int, current: jnp.ndarray) -> jnp.ndarray:
            return current - jnp.linalg.solve(hessian(current), gradient(current))

        return jax.lax.fori_loop(0, iterations, update, beta)

    return newton(jnp.zeros(X.shape[1]))


def main(data_path: str, out_path: str, tune: int, draws: int, seed: int) -> None:
    data = np.load(data_path)
    X, y = jnp.asarray(data["X"]), jnp.asarray(data["y"], dtype=jnp.float64)
    start = time.perf_counter()
    reference = newton_reference(X, y).block_until_ready()
    setup = time.perf_counter() - start
    kernel = HMCECS(NUTS(model), num_blocks=BLOCKS, proxy=HMCECS.taylor_proxy({"beta": reference}))
    mcmc = MCMC(kernel, num_warmup=tune, num_samples=draws, num_chains=1, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), X, y, X.shape[0], extra_fields=("hmc_state.num_steps",))
    beta = np.asarray(mcmc.get_samples()["beta"])
    wall = time.perf_counter() - start
    num_steps = np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"])
    np.savez(
        out_path,
        beta=beta,
        setup_seconds=setup,
        wall_seconds=wall,
        num_steps=num_steps,
        subsample_size=SUBSAMPLE,
        versions=np.array([numpyro.__version__, jax.__version__]),
    )


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    numpyro.set_host_device_count(1)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))

"""An acceptance test added from outside the package: the penalty method.

The worked example of ``docs/architecture.md`` ("Tests"). One module: a test part
(``pms.AcceptanceTest``) and one class statement that makes a PyMC step of it,
``class PenaltyMH(pms.SubsampleMH, test=PenaltyTest)``. The step takes the test's setting
(``variance_limit``) next to every setting of the package's steps (proposal, control variate,
batch size, ...), and records the test's decision fields as ``sample_stats``.

The penalty method (Ceperley and Dewing 1999, "The penalty method for random walks with
uncertain energies", J. Chem. Phys. 110, 9812) accepts on a noisy estimate of the log
acceptance ratio. If ``Delta* ~ N(Delta, s^2)``, accepting with probability
``min(1, exp(Delta* - s^2 / 2))`` satisfies detailed balance exactly: the penalty ``s^2 / 2``
cancels the noise's bias in the acceptance probability. Here ``Delta*`` is the minibatch
estimate from one batch of ``batch_size`` rows drawn without replacement (with a control
variate, of its residuals) and ``s^2`` the estimate of its variance, with the
finite-population correction of Korattikara et al. (2014, eq. 4). Two approximations remain:
the batch mean's CLT (as for the package's tests), and ``s^2`` being estimated, whose error
Ceperley and Dewing correct with further terms of order ``s^4 / n`` that this example leaves
out. Both are small when ``s^2`` is small, so a batch whose ``s^2`` exceeds
``variance_limit`` grows to all N rows and decides exactly instead.

    python examples/penalty_test.py
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pymc as pm

import pymc_subsample as pms


class PenaltyDecision(NamedTuple):
    """One decision; the field names are the step's stat names."""

    accepted: bool
    n_data: int
    full_data: bool
    variance: float
    nonfinite_proposal: bool
    delta_star: float
    residual_kurtosis: float = math.nan


class PenaltyTest(pms.AcceptanceTest):
    """Accept iff ``log u < Delta* - s^2 / 2`` on one batch (Ceperley and Dewing 1999).

    Parameters
    ----------
    variance_limit : float, default 1
        Largest ``s^2`` the test decides on; a batch with a larger one reads all rows and
        makes the exact decision (a noisy estimate's acceptance falls as ``exp(-s^2 / 2)``).
    """

    decision = PenaltyDecision
    stats: ClassVar[dict[str, tuple[type, list[int]]]] = {
        "accepted": (np.float64, []),
        "n_data": (np.int64, []),
        "full_data": (bool, []),
        "variance": (np.float64, []),
        "nonfinite_proposal": (bool, []),
        "delta_star": (np.float64, []),
        "residual_kurtosis": (np.float64, []),
    }

    def __init__(self, variance_limit: float = 1.0) -> None:
        if not (isinstance(variance_limit, int | float) and variance_limit > 0):
            raise ValueError(f"variance_limit must be a positive number, got {variance_limit!r}.")
        self.variance_limit = float(variance_limit)

    def decide(
        self,
        step: Any,
        log_ratio_rows: Callable[[np.ndarray], np.ndarray],
        log_prior_proposal_ratio: float,
    ) -> PenaltyDecision:
        """Decide on one batch, or on all rows when its variance is above the limit."""
        u = step.rng.uniform()
        log_u = math.log(u) if u > 0.0 else -math.inf
        if not math.isfinite(log_prior_proposal_ratio):
            return PenaltyDecision(False, 0, False, math.nan, True, -math.inf)
        n_rows, scale = step.n_rows, step.n_rows / step.temperature
        rows = step.row_sampler
        rows.start_test()
        values = log_ratio_rows(rows.draw(step.rng, min(step.batch_size, n_rows)))
        n = values.size
        variance = 0.0
        if n < n_rows:  # Korattikara et al. (2014), eq. 4, for Delta* = (N / T) mean
            variance = scale**2 * values.var(ddof=1) / n * (1.0 - (n - 1) / (n_rows - 1))
        if not variance <= self.variance_limit:  # too noisy (or NaN): read every row
            rest = log_ratio_rows(rows.draw(step.rng, n_rows - n))
            values, n, variance = np.concatenate([values, rest]), n_rows, 0.0
        if not np.all(np.isfinite(values)):
            return PenaltyDecision(False, n, n == n_rows, math.nan, True, -math.inf)
        delta_star = scale * float(values.mean()) + log_prior_proposal_ratio
        accepted = log_u < delta_star - variance / 2.0  # the penalty s^2 / 2
        return PenaltyDecision(accepted, n, n == n_rows, variance, False, delta_star)


class PenaltyMH(pms.SubsampleMH, test=PenaltyTest):
    """Metropolis-Hastings accepted by the penalty method on one batch (``PenaltyTest``).

    Takes ``variance_limit`` (:class:`PenaltyTest`) and every argument of
    :class:`pymc_subsample.SubsampleMH`.
    """

    name = "penalty_mh"


def main() -> None:
    """Sample a logistic regression with 100,000 rows and print what the test read."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100_000, 3))
    y = rng.random(100_000) < 1.0 / (1.0 + np.exp(-X @ np.array([0.5, -1.0, 0.25])))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
        step = PenaltyMH()
        print(step)
        idata = pm.sample(step=step, chains=2, cores=1, random_seed=1, progressbar=False)
    stats = idata.sample_stats
    print(idata.posterior["beta"].mean(("chain", "draw")).values)
    rows, variance = float(stats["n_data"].mean()), float(stats["variance"].mean())
    print(f"rows per draw {rows:.0f}, mean s^2 {variance:.3g}")


if __name__ == "__main__":
    main()

"""A proposal added from outside the package: a heavy-tailed independent proposal.

The worked example of ``docs/architecture.md`` ("Proposals"). One module, one registration
line (``@pms.register_proposal``): once it is imported, ``proposal="student_t_independent"``
is a choice of ``pms.AusterityMH`` and ``pms.MinibatchBarkerMH``.

It draws ``q' = q* + L z / sqrt(w / nu)`` with ``z ~ N(0, I)`` and ``w ~ chi-square(nu)``: a
multivariate Student-t with ``nu`` degrees of freedom around the control variate's reference
point ``q*``, shaped by the proposal covariance ``L L^T`` (the Laplace covariance). Like
``proposal="independent"`` it ignores the current point, but its tails are heavier than the
posterior's Gaussian approximation, so a posterior with heavier tails than that is still
reached. It is not symmetric: its log proposal ratio is ``log t(q) - log t(q')``.

    python examples/student_t_proposal.py
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
from scipy.linalg import solve_triangular

import pymc_subsample as pms


class StudentTIndependent:
    """The kernel: ``(rng, q, scaling) -> (q_new, log q(q | q') - log q(q' | q))``."""

    def __init__(self, mean: np.ndarray, cov: np.ndarray, nu: float) -> None:
        self.mean, self.nu = mean, nu
        self.factor = np.linalg.cholesky(cov)

    def __call__(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float
    ) -> tuple[np.ndarray, float]:
        """Draw ``q'`` independently of ``q``; ``scaling`` is unused."""
        z = rng.standard_normal(q.size)
        q_new = self.mean + self.factor @ z / math.sqrt(rng.chisquare(self.nu) / self.nu)
        return q_new, self._log_density(q) - self._log_density(q_new)

    def _log_density(self, q: np.ndarray) -> float:
        # Multivariate t up to a constant: -(nu + d) / 2 log(1 + |L^-1 (q - mean)|^2 / nu).
        whitened = solve_triangular(self.factor, q - self.mean, lower=True)
        return -0.5 * (self.nu + q.size) * math.log1p(float(whitened @ whitened) / self.nu)


@pms.register_proposal
class StudentTIndependentPart(pms.ProposalPart):
    """``proposal="student_t_independent"``: a Student-t with 5 degrees of freedom at ``q*``."""

    name = "student_t_independent"
    scaling_rule = "none"  # no scale to tune: the spread is the covariance's

    @classmethod
    def obstacle(cls, step: pms.AusterityMH | pms.MinibatchBarkerMH) -> str | None:
        """Refuse a step without a control variate: its reference point is the centre."""
        return None if step.control is not None else "it needs a control variate's reference"

    def build_kernel(self, step: pms.AusterityMH | pms.MinibatchBarkerMH) -> StudentTIndependent:
        """Centre the Student-t at the reference point, shaped by the Laplace covariance."""
        assert step.control is not None  # obstacle() holds
        cov = step.control.covariance if self.proposal_cov is None else self.proposal_cov
        return StudentTIndependent(step.control.proxy.reference, np.asarray(cov), nu=5.0)


def main() -> None:
    """Sample a logistic regression of 100,000 rows with the new proposal."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100_000, 4))
    y = rng.random(100_000) < 1.0 / (1.0 + np.exp(-X @ np.array([0.5, -1.0, 0.25, 0.0])))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 2.0, shape=4)
        pm.Bernoulli("y", logit_p=X @ beta, observed=y.astype(int))
        step = pms.AusterityMH(proposal="student_t_independent")
        print(step)
        idata = pm.sample(step=step, draws=2000, chains=2, random_seed=1, progressbar=False)
    stats, draws = idata.sample_stats, idata.posterior["beta"].values.reshape(-1, 4)
    print(f"acceptance {float(stats['accepted'].mean()):.2f}, rows per draw", end=" ")
    print(f"{float(stats['n_data'].mean()):.0f} of 100,000")
    print("posterior means", draws.mean(0).round(3), "sds", draws.std(0).round(3))


if __name__ == "__main__":
    main()

"""Per-group accept tests of a group sweep, every group at once: the t-test or the Barker test.

A sweep (``kernels/group_effects.py``) proposes new effects for every group and accepts or
rejects each on its own log-likelihood change ``Delta_g = L_g(x') - L_g(x) + rest_g``
(``rest_g`` the prior and proposal ratio). A group of at most ``batch_size`` rows, and a
group whose sampled test is not sure, is decided on all its rows; a larger group estimates
``L_g(x') - L_g(x) = known_g + sum_{i in g} d_i`` from the residuals ``d_i`` of a sample of its
rows (``known_g`` the control variate's exact part), in stages that each draw as many rows
again as the group has read. Each stage hands every undecided group's estimate to the test:

- :data:`T_TEST`: Korattikara et al. (2014), Algorithm 1, with the group as the population
  (eq. 2 with ``N = n_g``): accept iff ``mean(d) > mu_0``, once the Student-t test is confident
  at level ``error_tolerance``; exact: accept iff ``Delta_g > log u``;
- :data:`BARKER`: Seita et al. (2018), Algorithm 1, with the group as the population: once the
  estimate's variance ``s^2 = n_g^2 Var(d) / m`` is below ``sigma^2``, accept iff
  ``Delta*_g + X_nc + X_corr > 0`` (eq. 13, ``X_nc ~ N(0, sigma^2 - s^2)``, ``X_corr`` from
  ``kernels/correction.py``); exact: accept iff ``Delta_g + X_log > 0`` (eq. 10).

Both also require the estimate's standard error to be at most :data:`ESTIMATE_SD`: far from the
control variate's expansion the residuals are large and heavy-tailed, their spread in one batch
is no guide to the group's, and such a group is read whole instead. The rows are drawn with
replacement, which leaves out the finite-population correction (the tests are more cautious).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy import special

from pymc_subsample.kernels.correction import CorrectionDistribution, sample_corrections

__all__ = [
    "BARKER",
    "ESTIMATE_SD",
    "T_TEST",
    "GroupTest",
    "StageEstimate",
    "exact_decisions",
    "staged_decisions",
]

#: The test names :class:`GroupTest` takes.
T_TEST = "t"
BARKER = "barker"
#: Largest standard error of a group's estimated log-likelihood ratio (``n_g`` times the
#: residuals' standard error) that a sampled decision accepts. The control variate makes it
#: tiny where the chain is near the expansion (1e-3 to 1e-2 on a Poisson hierarchy's groups);
#: far from it the residuals are large and heavy-tailed (``exp(eta_i)`` times a cubic in the
#: move), and a t-test on them decided wrongly and confidently often enough to hold chains in
#: a group's tail, so such a group is read whole instead.
ESTIMATE_SD = 0.2
#: Each stage after the first reads this many times the rows the group has read so far.
STAGE_GROWTH = 2


class GroupTest(NamedTuple):
    """Which test decides each group, and its setting."""

    #: :data:`T_TEST` or :data:`BARKER`.
    kind: str
    #: The t-test's epsilon (Korattikara et al. 2014, Algorithm 1); unused by the Barker test.
    error_tolerance: float
    #: The Barker test's correction distribution (its sigma, eq. 14); None for the t-test.
    correction: CorrectionDistribution | None = None

    @property
    def exact(self) -> bool:
        """Whether no sampled decision is allowed (the t-test at ``error_tolerance=0``)."""
        return self.kind == T_TEST and self.error_tolerance == 0.0


class StageEstimate(NamedTuple):
    """One stage's estimates for the groups still undecided (arrays over those groups)."""

    #: Mean of the group's sampled residuals.
    mean: np.ndarray
    #: Standard error of that mean (the residuals' sd over ``sqrt(n_rows)``).
    error: np.ndarray
    #: Rows read so far per group.
    n_rows: np.ndarray


#: ``(rows, groups, residual) -> values`` of the given rows (their group per row).
RowValues = Callable[[np.ndarray, np.ndarray, bool], np.ndarray]


def exact_decisions(
    rng: np.random.Generator, test: GroupTest, delta: np.ndarray, log_u: np.ndarray
) -> np.ndarray:
    """Decide groups whose ``Delta_g`` is known exactly (all their rows read).

    The t-test's is Metropolis-Hastings (``Delta_g > log u``); the Barker test's adds logistic
    noise (Seita et al., eq. 10) and uses no uniform.
    """
    if test.kind == BARKER:
        return delta + rng.logistic(size=delta.shape) > 0.0
    return delta > log_u


def staged_decisions(
    rng: np.random.Generator,
    test: GroupTest,
    groups: np.ndarray,
    sizes: np.ndarray,
    draw_rows: Callable[[np.ndarray, int], np.ndarray],
    values: RowValues,
    known: np.ndarray,
    log_u: np.ndarray,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Decide the sampled ``groups`` stage by stage; leave those the test is unsure of.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the rows and the Barker test's noise.
    test : GroupTest
        The test.
    groups : ndarray
        The groups to decide.
    sizes : ndarray
        ``(G,)``: every group's number of rows.
    draw_rows : callable
        ``(groups, k) -> (len(groups), k)`` rows drawn with replacement from each group.
    values : callable
        See :data:`RowValues`: the residuals ``d_i`` with ``residual=True``.
    known : ndarray
        ``(G,)``: ``rest_g`` plus the control variate's exact part ``known_g``, so that
        ``Delta_g = known + sum_{i in g} d_i``.
    log_u : ndarray
        ``(G,)``: the t-test's ``log u`` per group.
    batch_size : int
        Rows read per group at the first stage.

    Returns
    -------
    accept : ndarray
        ``(G,)`` bool: the decisions made (False elsewhere).
    unsure : ndarray
        The groups left to be read whole: those whose next stage would read as many rows as
        they hold, or whose residuals are not finite.
    read : int
        Rows read.
    """
    n_groups = sizes.size
    accept = np.zeros(n_groups, bool)
    if test.exact:  # every group is read whole: no stage would be sure
        return accept, groups, 0
    shift = np.zeros(n_groups)
    total = np.zeros(n_groups)
    squares = np.zeros(n_groups)
    count = np.zeros(n_groups, np.int64)
    unsure: list[np.ndarray] = []
    active, draw, read = groups, batch_size, 0
    while active.size:
        picks = draw_rows(active, draw)
        residual = values(picks.ravel(), np.repeat(active, draw), True).reshape(active.size, draw)
        read += picks.size
        with np.errstate(invalid="ignore", over="ignore"):
            if not count[active[0]]:  # the first stage: shift by its mean (stable sums)
                shift[active] = residual.mean(axis=1)
            centred = residual - shift[active][:, None]
            total[active] += centred.sum(axis=1)
            squares[active] += (centred * centred).sum(axis=1)
        count[active] += draw
        m = count[active]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_centred = total[active] / m
            variance = np.maximum(squares[active] - m * mean_centred**2, 0.0) / (m - 1)
            estimate = StageEstimate(shift[active] + mean_centred, np.sqrt(variance / m), m)
        finite = np.isfinite(estimate.mean) & np.isfinite(estimate.error)
        size = sizes[active]
        confident, accepted = _decide(rng, test, estimate, size, known[active], log_u[active])
        confident &= finite & (size * estimate.error <= ESTIMATE_SD)
        sure = active[confident]
        accept[sure] = accepted[confident]
        draw = STAGE_GROWTH * draw
        left = active[~confident]
        whole = ~finite[~confident] | (sizes[left] <= count[left] + draw)
        unsure.append(left[whole])
        active = left[~whole]
    return accept, np.concatenate(unsure), read


def _decide(
    rng: np.random.Generator,
    test: GroupTest,
    estimate: StageEstimate,
    size: np.ndarray,
    known: np.ndarray,
    log_u: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Return which groups the stage decides, and their decisions (where decided)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if test.kind == BARKER:
            assert test.correction is not None
            limit = test.correction.sigma**2
            variance = (size * estimate.error) ** 2  # s^2 of Delta*_g
            confident = variance < limit  # Seita et al., Algorithm 1
            noise = np.sqrt(np.maximum(limit - variance, 0.0)) * rng.standard_normal(size.size)
            corrections = sample_corrections(rng, test.correction, size.size)
            delta_star = known + size * estimate.mean  # eq. 8, the group's rows
            return confident, delta_star + noise + corrections > 0.0  # eq. 13
        # Korattikara et al. (2014), eq. 2 with N = n_g, and Algorithm 1, line 7 (stdtr is
        # the Student-t CDF).
        threshold = (log_u - known) / size
        statistic = np.abs(estimate.mean - threshold) / estimate.error
        confident = special.stdtr(estimate.n_rows - 1, -statistic) < test.error_tolerance
        return confident, estimate.mean > threshold

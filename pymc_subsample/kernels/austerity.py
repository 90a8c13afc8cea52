"""The approximate Metropolis-Hastings test of Korattikara, Chen and Welling (2014), Algorithm 1.

Notation of the paper: ``l_i = log p(x_i | theta') - log p(x_i | theta)`` are the per-row
log-likelihood ratios, ``mu`` their mean over all N rows (eq. 3) and ``mu_0`` the threshold
(eq. 2) that folds in the uniform draw, the prior and the proposal:

    mu_0 = (1/N) log[u rho(theta) q(theta'|theta) / (rho(theta') q(theta|theta'))].

Exact MH accepts iff ``mu > mu_0``. The sequential test estimates ``mu`` from growing batches
drawn without replacement and stops as soon as a Student-t test on ``mu - mu_0`` is confident at
level ``error_tolerance`` (the paper's epsilon). With all N rows it makes the exact decision.

The same test decides a Gibbs update of a binary variable (supplementary F, eqs. 39-42) with
Barker's rule in place of Metropolis's: ``x_i = 1`` iff ``Delta > logit(u)``, where ``Delta``
is the log ratio of the joint densities at ``x_i = 1`` and ``x_i = 0``, so that ``x_i = 1``
with the conditional probability ``sigmoid(Delta)`` (eq. 39). ``rule="barker"`` draws
``logit(u)`` where Metropolis draws ``log u``; everything else is Algorithm 1.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.kernels.stages import LogRatioRows, StageStatistics, run_stages

__all__ = [
    "RULES",
    "AusterityDecision",
    "exact_mh_test",
    "sequential_mh_test",
]

#: The acceptance rules: Metropolis's ``Delta > log u`` (accept with probability
#: ``min(1, exp(Delta))``) and Barker's ``Delta > logit(u)`` (probability ``sigmoid(Delta)``, the
#: Gibbs update of a binary variable, supplementary F).
RULES = ("metropolis", "barker")

#: Rows per call when a full-data pass is made in chunks (bounds memory, not cost).
FULL_PASS_CHUNK = 65_536


class AusterityDecision(NamedTuple):
    """Outcome of one test; field names are the step method's stat names."""

    accepted: bool
    n_data: int
    n_batches: int
    full_data: bool
    nonfinite_proposal: bool
    #: The estimate of the log acceptance ratio, ``N mu_hat / T`` plus the log prior and
    #: proposal ratio: the test accepts when it exceeds ``log u`` (eq. 2 multiplied through by
    #: N); -inf after a non-finite proposal.
    delta_star: float
    #: Excess kurtosis of the first batch's ``l_i`` (with a control variate, its residuals);
    #: NaN for the exact test, which assumes nothing of their distribution.
    residual_kurtosis: float = math.nan


def _log_uniform(rng: np.random.Generator) -> float:
    # log u for u ~ U(0, 1), the same draw as rng.uniform(); u = 0 (probability 2^-53) is -inf.
    u = rng.uniform()
    return math.log(u) if u > 0.0 else -math.inf


def _logit_uniform(rng: np.random.Generator) -> float:
    # logit(u) = log u - log(1 - u) for u ~ U(0, 1): a standard logistic draw (Barker's rule).
    u = rng.uniform()
    return math.log(u) - math.log1p(-u) if u > 0.0 else -math.inf


def _rule_draw(rule: str, rng: np.random.Generator) -> float:
    if rule == "metropolis":
        return _log_uniform(rng)
    if rule == "barker":
        return _logit_uniform(rng)
    raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")


def _threshold(log_u: float, log_prior_proposal_ratio: float, n_rows: int) -> float:
    # Korattikara 2014, eq. 2, with log_prior_proposal_ratio =
    # log rho(theta') + log q(theta|theta') - log rho(theta) - log q(theta'|theta).
    return (log_u - log_prior_proposal_ratio) / n_rows


def sequential_mh_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    rows: RowSampler,
    log_prior_proposal_ratio: float,
    error_tolerance: float | np.ndarray,
    batch_size: int,
    temperature: float = 1.0,
    rule: str = "metropolis",
) -> AusterityDecision:
    """Run Algorithm 1 for one proposal.

    The stages are those of the paper: after every ``batch_size`` rows (drawn without
    replacement) the t-test is applied, and the first stage with ``delta < error_tolerance``
    decides (evaluated by :func:`pymc_subsample.kernels.stages.run_stages`: the decision and
    its stage are those of Algorithm 1 on the same rows; ``n_data`` counts rows evaluated,
    which can exceed the rows the decision used by less than a factor 2).

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws ``u`` first, then the rows.
    log_ratio_rows : callable
        ``log_ratio_rows(idx)`` returns ``l_i`` for the int64 rows ``idx``.
    rows : RowSampler
        Row sampler over the N rows; a new test is started here.
    log_prior_proposal_ratio : float
        ``log rho(theta') - log rho(theta) + log q(theta|theta') - log q(theta'|theta)``.
    error_tolerance : float or ndarray
        The paper's epsilon: stop when ``delta < error_tolerance``. An array gives one per
        stage (a designed test's bound sequence, ``kernels/test_design.py``); 0 where the test
        may not stop.
    batch_size : int
        The paper's m: rows added per stage.
    temperature : float, default 1
        The likelihood is raised to ``1 / temperature``: the test compares ``mu / T`` with
        ``mu_0``, i.e. ``mu`` with ``T mu_0``.
    rule : {"metropolis", "barker"}, default "metropolis"
        The threshold's draw: ``log u`` (eq. 2), or ``logit(u)`` for a Gibbs update of a
        binary variable (supplementary F, eq. 41 with ``mu_0 = logit(u) / N``).

    Returns
    -------
    AusterityDecision
        ``n_batches`` is the stage at which the decision was made.

    """
    log_u = _rule_draw(rule, rng)
    if not math.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True, -math.inf)
    n_rows = rows.n_rows
    threshold = temperature * _threshold(log_u, log_prior_proposal_ratio, n_rows)

    def confident(stats: StageStatistics, _prefix: object) -> np.ndarray:
        if isinstance(error_tolerance, np.ndarray):  # stage j ends at j * batch_size rows
            stage = (stats.n_values.astype(np.int64) - 1) // batch_size
            return stats.test_error < error_tolerance[stage]
        return stats.test_error < error_tolerance  # Algorithm 1, line 8

    outcome = run_stages(rng, log_ratio_rows, rows, batch_size, threshold, confident)
    if outcome.nonfinite:  # a NaN or infinite l_i: reject
        return AusterityDecision(False, outcome.n_data, outcome.n_batches, False, True, -math.inf)
    delta_star = outcome.mean * n_rows / temperature + log_prior_proposal_ratio
    if outcome.full_data:
        total = outcome.mean * n_rows / temperature
        accepted = _exact_decision(total, log_prior_proposal_ratio, log_u)
    else:
        accepted = outcome.mean > threshold
    return AusterityDecision(
        bool(accepted),
        outcome.n_data,
        outcome.n_batches,
        outcome.full_data,
        False,
        delta_star,
        outcome.first_stage_kurtosis,
    )


def exact_mh_test(
    rng: np.random.Generator,
    log_ratio_rows: LogRatioRows,
    n_rows: int,
    log_prior_proposal_ratio: float,
    temperature: float = 1.0,
    rule: str = "metropolis",
) -> AusterityDecision:
    """Exact Metropolis-Hastings on all rows, in row order, drawing only ``u`` from ``rng``.

    This is the ``error_tolerance = 0`` limit of the sequential test (which can then never stop
    early): the same decision, without drawing rows, so that the random stream is the one of
    plain MH. ``rule`` is as in :func:`sequential_mh_test` (``"barker"``: exact Gibbs).
    """
    log_u = _rule_draw(rule, rng)
    if not math.isfinite(log_prior_proposal_ratio):
        return AusterityDecision(False, 0, 0, False, True, -math.inf)
    total = 0.0
    for start in range(0, n_rows, FULL_PASS_CHUNK):
        total += float(log_ratio_rows(np.arange(start, min(start + FULL_PASS_CHUNK, n_rows))).sum())
    if not math.isfinite(total):
        return AusterityDecision(False, n_rows, 1, True, True, -math.inf)
    accepted = _exact_decision(total / temperature, log_prior_proposal_ratio, log_u)
    delta_star = total / temperature + log_prior_proposal_ratio
    return AusterityDecision(accepted, n_rows, 1, True, False, delta_star)


def _exact_decision(total_log_ratio: float, log_prior_proposal_ratio: float, log_u: float) -> bool:
    # mu > mu_0 (eq. 2, 3) multiplied through by N; total_log_ratio already tempered.
    return bool(total_log_ratio + log_prior_proposal_ratio > log_u)

"""The minibatch Barker test of Seita, Pan, Chen and Canny (UAI 2018), Algorithm 1, as a part."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pymc_subsample.kernels import fused as fused_kernels
from pymc_subsample.kernels.barker import (
    BarkerDecision,
    estimate_noise_shortfall,
    minibatch_barker_test,
)
from pymc_subsample.kernels.correction import MAX_SIGMA, correction_distribution
from pymc_subsample.kernels.stratified import stratified_barker_test
from pymc_subsample.step_methods.acceptance_tests import AcceptanceTest, StatSpec
from pymc_subsample.step_methods.contracts import FusedTest
from pymc_subsample.step_methods.defaults import TRAJECTORY_TARGET_ACCEPTANCE
from pymc_subsample.step_methods.stratification import rows_per_stratum

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView, TestDecision

__all__ = ["BarkerTest", "barker_tune"]


def barker_tune(scaling: float, acceptance: float) -> float:
    """Adapt the proposal scale for a Barker test, whose acceptance never exceeds 1/2.

    PyMC's Metropolis rule only enlarges steps above 50% acceptance, which a Barker test never
    reaches, so small steps would stay small. This rule aims at 15% to 30% (the optimal random
    walk Barker acceptance is about 15.8% in high dimension; Agrawal, Vats, Latuszynski and
    Roberts 2023) and doubles the scale above 40%, where steps are far below the posterior scale.

    Examples
    --------
    >>> barker_tune(1.0, 0.48), barker_tune(1.0, 0.2), barker_tune(1.0, 0.0)
    (2.0, 1.0, 0.1)
    """
    for below, factor in ((0.001, 0.1), (0.05, 0.5), (0.15, 0.9)):
        if acceptance < below:
            return scaling * factor
    for above, factor in ((0.4, 2.0), (0.3, 1.1)):
        if acceptance > above:
            return scaling * factor
    return scaling


class BarkerTest(AcceptanceTest):
    """Accept iff ``Delta* + X_nc + X_corr > 0``, growing the batch while ``s^2 >= sigma^2``.

    Seita et al., eq. 13.

    Parameters
    ----------
    error_bound : float, optional
        The paper's delta, in (0, 1): also grow the batch until Corollary 1's bound on the CDF
        error of ``Delta*`` is at most this (then the draw runs in Python). None skips it.
    correction_sd : float, default 1.0
        The sigma of eq. 14: the Gaussian part of the logistic noise, in (0, 1.5]. A batch
        passes once the variance ``s^2`` of its estimate is below ``sigma^2``, and the test adds
        ``X_nc ~ N(0, sigma^2 - s^2)`` and ``X_corr`` for this sigma. Algorithm 1 uses 1; a
        larger sigma passes smaller batches (rows per decision fall about as ``1 / sigma^2``) with
        a correction whose CDF error grows (below 1e-7 at 1, 2e-5 at 1.2, see
        ``kernels/correction.py``), and the batch's CLT error grows as it shrinks.
    """

    decision = BarkerDecision
    reads_strata = True
    stats: ClassVar[dict[str, StatSpec]] = {
        "accepted": (np.float64, []),
        "n_data": (np.int64, []),
        "n_batches": (np.int64, []),
        "full_data": (bool, []),
        "variance": (np.float64, []),
        "clt_error": (np.float64, []),
        "nonfinite_proposal": (bool, []),
        "delta_star": (np.float64, []),
        "residual_kurtosis": (np.float64, []),
    }

    def __init__(self, error_bound: float | None = None, correction_sd: float = 1.0) -> None:
        self.error_bound = _check_error_bound(error_bound)
        #: X_corr for sigma = correction_sd (``kernels/correction.py``), computed once per sigma.
        self.correction = correction_distribution(_check_correction_sd(correction_sd))

    def fused(self, step: StepView) -> FusedTest | None:
        """Return the Barker test with its correction; with ``error_bound``, None (Python)."""
        if self.error_bound is not None:
            return None
        return FusedTest(fused_kernels.BARKER, 0.0, self.correction)

    def tune(self, scaling: float, acceptance: float) -> float:
        """:func:`barker_tune`: Barker accepts at most about half of the proposals."""
        return barker_tune(scaling, acceptance)

    def acceptance_statistic(self, decision: TestDecision) -> float:
        """Return the Metropolis acceptance probability of the estimate, corrected for its noise.

        Barker accepts at most about half of the proposals whatever the step size, so the HMC
        step size is tuned on ``min(1, exp(Delta*))``, as Stan tunes on its own acceptance
        probability, plus what the estimate's noise (its ``variance``, below the correction's
        ``sigma^2``) takes off that probability's mean
        (:func:`~pymc_subsample.kernels.barker.estimate_noise_shortfall`). Without it the
        noise alone held the mean near 0.76, below the 0.8 aimed at, and the step size fell
        to 0.01 (100 leapfrog steps) on a centred 100-group Poisson model where nutpie's is
        0.41 (``docs/hmc.md``).
        """
        probability = float(min(1.0, np.exp(min(decision.delta_star, 0.0))))
        variance = float(getattr(decision, "variance", 0.0))
        return probability + estimate_noise_shortfall(variance, TRAJECTORY_TARGET_ACCEPTANCE)

    def decide(
        self,
        step: StepView,
        log_ratio_rows: Callable[[np.ndarray], np.ndarray],
        log_prior_proposal_ratio: float,
    ) -> BarkerDecision:
        """Run Algorithm 1 of Seita et al. (``kernels/barker.py``).

        On a hierarchy's rows by group (``step.strata``) the estimate and its variance are the
        stratified ones (``kernels/stratified.py``), except with ``error_bound``: Corollary 1's
        bound is for a uniform sample.
        """
        if step.strata is not None and self.error_bound is None:
            return stratified_barker_test(
                step.rng,
                log_ratio_rows,
                step.strata,
                log_prior_proposal_ratio,
                rows_per_stratum(step.strata, step.batch_size),
                step.temperature,
                self.correction,
            )
        return minibatch_barker_test(
            step.rng,
            log_ratio_rows,
            step.row_sampler,
            log_prior_proposal_ratio,
            step.batch_size,
            step.temperature,
            self.error_bound,
            self.correction,
        )


def _check_correction_sd(correction_sd: float) -> float:
    value = float(correction_sd)
    if not 0.0 < value <= MAX_SIGMA:
        raise ValueError(
            f"correction_sd must be in (0, {MAX_SIGMA}], got {correction_sd!r}. It is the sigma of "
            "the Gaussian part of the test's logistic noise (Seita et al., eq. 14), which must "
            "leave room for the correction below the logistic variance pi^2/3; 1.0 is the "
            "paper's choice."
        )
    return value


def _check_error_bound(error_bound: float | None) -> float | None:
    if error_bound is None:
        return None
    value = float(error_bound)
    if not 0.0 < value < 1.0:
        raise ValueError(
            f"error_bound must be in (0, 1) or None, got {error_bound!r}. It bounds the CDF "
            "error of the minibatch estimate (the paper's delta); None skips the bound."
        )
    return value

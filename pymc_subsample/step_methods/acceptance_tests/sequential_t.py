"""The sequential t-test of Korattikara, Chen and Welling (2014), Algorithm 1, as a test part."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pymc_subsample.kernels import fused as fused_kernels
from pymc_subsample.kernels.austerity import (
    AusterityDecision,
    exact_mh_test,
    sequential_mh_test,
)
from pymc_subsample.step_methods.acceptance_tests import AcceptanceTest, FusedTest, StatSpec

if TYPE_CHECKING:
    from pymc_subsample.step_methods.base import SubsampleMH

__all__ = ["DEFAULT_ERROR_TOLERANCE", "SequentialTTest"]

DEFAULT_ERROR_TOLERANCE = 0.001


class SequentialTTest(AcceptanceTest):
    """Accept when a t-test on growing batches is confident that ``mu > mu_0`` (eq. 2-5).

    Parameters
    ----------
    error_tolerance : float, default 0.001
        The paper's epsilon, in [0, 0.5): the error allowed in each t-test. 0 runs exact
        Metropolis-Hastings on all rows (``kernels/austerity.exact_mh_test``).
    """

    decision = AusterityDecision
    stats: ClassVar[dict[str, StatSpec]] = {
        "accepted": (np.float64, []),
        "n_data": (np.int64, []),
        "n_batches": (np.int64, []),
        "full_data": (bool, []),
        "nonfinite_proposal": (bool, []),
        "delta_star": (np.float64, []),
        "residual_kurtosis": (np.float64, []),
    }
    #: Without a control variate the l_i are far from Gaussian in small batches (the paper's m).
    uncontrolled_batch_size = 500

    def __init__(self, error_tolerance: float = DEFAULT_ERROR_TOLERANCE) -> None:
        self.error_tolerance = _check_error_tolerance(error_tolerance)

    def exact(self, step: SubsampleMH) -> bool:
        """Tolerance 0, or a first batch of all rows: exact MH, every row read by request."""
        return self.error_tolerance == 0.0 or step.batch_size >= step.n_rows

    def fused(self, step: SubsampleMH) -> FusedTest | None:
        """Return the sequential t-test with its epsilon; the exact test runs in Python."""
        if self.exact(step):
            return None
        return FusedTest(fused_kernels.AUSTERITY, self.error_tolerance, None)

    def decide(
        self,
        step: SubsampleMH,
        log_ratio_rows: Callable[[np.ndarray], np.ndarray],
        log_prior_proposal_ratio: float,
    ) -> AusterityDecision:
        """Run Algorithm 1 (``kernels/austerity.py``), or exact MH when :meth:`exact`."""
        if self.exact(step):
            return exact_mh_test(
                step.rng, log_ratio_rows, step.n_rows, log_prior_proposal_ratio, step.temperature
            )
        return sequential_mh_test(
            step.rng,
            log_ratio_rows,
            step.row_sampler,
            log_prior_proposal_ratio,
            self.error_tolerance,
            step.batch_size,
            step.temperature,
        )


def _check_error_tolerance(error_tolerance: float) -> float:
    try:
        value = float(error_tolerance)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 <= value < 0.5:
        raise ValueError(
            f"error_tolerance must be in [0, 0.5), got {error_tolerance!r}. It is the error "
            "allowed in each t-test: 0 gives exact MH, 0.001 to 0.05 are typical, and 0.5 or "
            "more would decide on the sign of a noisy estimate."
        )
    return value

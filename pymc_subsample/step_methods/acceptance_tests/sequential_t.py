"""The sequential t-test of Korattikara, Chen and Welling (2014), Algorithm 1, as a test part."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pymc_subsample.kernels import fused as fused_kernels
from pymc_subsample.kernels.austerity import (
    FULL_PASS_CHUNK,
    AusterityDecision,
    exact_mh_test,
    sequential_mh_test,
)
from pymc_subsample.kernels.design_search import design_test
from pymc_subsample.kernels.stratified import stratified_mh_test
from pymc_subsample.kernels.test_design import (
    DesignChoice,
    OptimalDesign,
    ProposalSample,
    SequentialDesign,
)
from pymc_subsample.step_methods.acceptance_tests import AcceptanceTest, StatSpec
from pymc_subsample.step_methods.contracts import FusedTest
from pymc_subsample.step_methods.stratification import rows_per_stratum
from pymc_subsample.warnings import warn_user

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView

__all__ = ["DEFAULT_ERROR_TOLERANCE", "SequentialTTest"]

DEFAULT_ERROR_TOLERANCE = 0.001


class SequentialTTest(AcceptanceTest):
    """Accept when a t-test on growing batches is confident that ``mu > mu_0`` (eq. 2-5).

    Parameters
    ----------
    error_tolerance : float, SequentialDesign, OptimalDesign or "optimal", default 0.001
        The paper's epsilon, in [0, 0.5): the error allowed in each t-test. 0 runs exact
        Metropolis-Hastings on all rows (``kernels/austerity.exact_mh_test``). A
        :class:`~pymc_subsample.SequentialDesign` fixes the first batch (it replaces
        ``batch_size``), the tolerance, the Wang-Tsiatis shape of the bounds and the stages
        tested; an :class:`~pymc_subsample.OptimalDesign` (``"optimal"`` is
        ``OptimalDesign()``) chooses them to minimise the expected rows with the error in the
        acceptance probability bounded (section 5.2 of the 2014 paper,
        ``kernels/test_design.py``).
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
    setting_stats: ClassVar[dict[str, StatSpec]] = {
        "error_tolerance": (np.float64, []),
        "design_rows": (np.float64, []),
        "design_error": (np.float64, []),
    }
    #: Without a control variate the l_i are far from Gaussian in small batches (the paper's m).
    uncontrolled_batch_size = 500
    reads_strata = True

    def __init__(
        self,
        error_tolerance: float | str | SequentialDesign | OptimalDesign = DEFAULT_ERROR_TOLERANCE,
    ) -> None:
        #: What was asked: a tolerance, a fixed design or an optimal design to find.
        self.requested = _check_request(error_tolerance)
        #: The design in use (None: the paper's test with one tolerance at every stage).
        self.design: SequentialDesign | None = (
            self.requested if isinstance(self.requested, SequentialDesign) else None
        )
        #: The optimal design chosen and what the dynamic programme predicts for it.
        self.choice: DesignChoice | None = None
        #: The design's per-stage tolerances for the step's N, computed once per design and N
        #: (not per draw: there are N / batch_size of them).
        self._stage_tolerances: np.ndarray | None = None
        self._tuning_states: list[np.ndarray] = []
        #: The step's own batch, which an average design's tuning runs with.
        self._tuning_batch = 0

    @property
    def error_tolerance(self) -> float:
        """The first stage's epsilon: the one asked for, the design's, or 0.001 while tuning."""
        if isinstance(self.requested, float):
            return self.requested
        return DEFAULT_ERROR_TOLERANCE if self.design is None else self.design.error_tolerance

    @property
    def _designs_from_tuning(self) -> bool:
        request = self.requested
        return isinstance(request, OptimalDesign) and request.kind == "average"

    def exact(self, step: StepView) -> bool:
        """Tolerance 0, or a first batch of all rows: exact MH, every row read by request."""
        return self.error_tolerance == 0.0 or step.batch_size >= step.n_rows

    def fused(self, step: StepView) -> FusedTest | None:
        """Return the sequential t-test with its epsilon; the exact test runs in Python."""
        if self.exact(step):
            return None
        return FusedTest(fused_kernels.AUSTERITY, self._tolerances(step), None)

    def prepare(self, step: StepView) -> None:
        """Take a fixed design, or find the worst-case optimal design (eq. 8), for this N."""
        if self.design is None:  # the step's own batch (a design replaces it)
            self._tuning_batch = step.batch_size
        request = self.requested
        if isinstance(request, OptimalDesign) and request.kind == "worst":
            self._adopt(step, self._design(step, None))
        elif self.design is not None:  # a fixed design, or an average one before new data
            self._use(step, self.design)

    def start_chain(self, step: StepView, tune: bool) -> None:
        """Forget an average design: each chain finds its own from its tuning (eq. 7)."""
        if not self._designs_from_tuning:
            return
        self._tuning_states = []
        self.design, self.choice, self._stage_tolerances = None, None, None
        step.batch_size = self._tuning_batch

    def record_tuning_state(self, step: StepView, q: np.ndarray) -> None:
        """Keep the last ``n_proposals`` tuning points, where the design's proposals start."""
        if self._designs_from_tuning:
            assert isinstance(self.requested, OptimalDesign)
            self._tuning_states.append(q.copy())
            del self._tuning_states[: -self.requested.n_proposals]

    def stop_tuning(self, step: StepView) -> None:
        """Find the average design from the proposals of the last tuning points (eq. 7)."""
        if not self._designs_from_tuning or self.choice:
            return
        if len(self._tuning_states) < 2:
            warn_user(
                "error_tolerance=OptimalDesign(kind='average') designs the test from tuning "
                "draws, and this chain has none: it uses the worst-case design (eq. 8 of "
                "Korattikara et al. 2014), which reads more rows. Give tune= draws, or "
                "OptimalDesign(kind='worst') to say so."
            )
            self._adopt(step, self._design(step, None))
            return
        self._adopt(step, self._design(step, self._proposal_sample(step)))

    def setting_values(self, step: StepView) -> dict[str, Any]:
        """Return the first stage's tolerance and the design's predicted rows and error."""
        choice = self.choice
        return {
            "error_tolerance": self.error_tolerance,
            "design_rows": math.nan if choice is None else choice.predicted_rows,
            "design_error": math.nan if choice is None else choice.predicted_error,
        }

    def _tolerances(self, step: StepView) -> float | np.ndarray:
        if self._stage_tolerances is None:
            return self.error_tolerance
        return self._stage_tolerances

    def _design(self, step: StepView, sample: ProposalSample | None) -> DesignChoice:
        request = self.requested
        assert isinstance(request, OptimalDesign)
        return design_test(
            step.n_rows,
            request.max_error,
            sample,
            batch_sizes=request.batch_sizes,
            shapes=request.shapes,
        )

    def _adopt(self, step: StepView, choice: DesignChoice) -> None:
        self.choice = choice
        self._use(step, choice.design)

    def _use(self, step: StepView, design: SequentialDesign) -> None:
        self.design = design
        self._stage_tolerances = design.stage_tolerances(step.n_rows)
        step.batch_size = design.batch_size

    def _proposal_sample(self, step: StepView) -> ProposalSample:
        """``(mu, sigma_l)`` of a proposal from each kept tuning point (section 5.2).

        Each proposal's ``mu`` and ``sigma_l`` are the mean and sd of its ``l_i`` (with a
        control variate, its residuals) over ``rows_per_proposal`` rows drawn at random (all
        N when there are fewer); the rows read are added to the next draw's ``n_data``.
        """
        request = self.requested
        assert isinstance(request, OptimalDesign)
        n_rows = step.n_rows
        size = min(n_rows, request.rows_per_proposal)
        means, sds, ratios = [], [], []
        for q in self._tuning_states:
            q_new, log_proposal_ratio = step.proposal_part.propose(step, q)
            ratio = step.oracles.log_prior_ratio(q_new, q) + log_proposal_ratio
            rows_of: Callable[[np.ndarray], np.ndarray]
            if step.control is None:
                rows_of = partial(step.oracles.loglik_ratio_rows, q_new, q)
            else:
                rows_of = step.control.residual_rows(q_new, q)
                ratio += step.control.log_threshold_shift(q_new, q)
            rows = (
                np.arange(n_rows)
                if size == n_rows
                else np.sort(step.rng.choice(n_rows, size, replace=False))
            )
            values = np.concatenate(
                [rows_of(rows[k : k + FULL_PASS_CHUNK]) for k in range(0, size, FULL_PASS_CHUNK)]
            )
            if not (np.all(np.isfinite(values)) and math.isfinite(ratio)):
                continue
            means.append(values.mean())
            sds.append(max(values.std(ddof=1), np.finfo(float).tiny))
            ratios.append(ratio)
            step.charge_rows(size)
        self._tuning_states = []
        return ProposalSample.from_estimates(
            np.array(means), np.array(sds), np.array(ratios), n_rows, step.temperature
        )

    def decide(
        self,
        step: StepView,
        log_ratio_rows: Callable[[np.ndarray], np.ndarray],
        log_prior_proposal_ratio: float,
    ) -> AusterityDecision:
        """Run Algorithm 1 (``kernels/austerity.py``), or exact MH when :meth:`exact`."""
        if self.exact(step):
            return exact_mh_test(
                step.rng, log_ratio_rows, step.n_rows, log_prior_proposal_ratio, step.temperature
            )
        tolerances = self._tolerances(step)
        if step.strata is not None and not isinstance(tolerances, np.ndarray):
            # The rows by group (kernels/stratified.py); a designed test's per-stage
            # tolerances are for uniform stages of batch_size rows.
            return stratified_mh_test(
                step.rng,
                log_ratio_rows,
                step.strata,
                log_prior_proposal_ratio,
                tolerances,
                rows_per_stratum(step.strata, step.batch_size),
                step.temperature,
            )
        return sequential_mh_test(
            step.rng,
            log_ratio_rows,
            step.row_sampler,
            log_prior_proposal_ratio,
            tolerances,
            step.batch_size,
            step.temperature,
        )


def _check_request(
    error_tolerance: float | str | SequentialDesign | OptimalDesign,
) -> float | SequentialDesign | OptimalDesign:
    if isinstance(error_tolerance, SequentialDesign | OptimalDesign):
        return error_tolerance.checked()
    if isinstance(error_tolerance, str):
        if error_tolerance != "optimal":
            raise ValueError(
                f"error_tolerance must be in [0, 0.5), 'optimal', a SequentialDesign or an "
                f"OptimalDesign, got {error_tolerance!r}."
            )
        return OptimalDesign()
    return _check_error_tolerance(error_tolerance)


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

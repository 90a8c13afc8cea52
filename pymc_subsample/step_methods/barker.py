"""MinibatchBarkerMH: the minibatch Barker test with a correction variable (Seita et al.)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import numpy as np
import pymc as pm
from numpy.typing import ArrayLike
from pymc.util import RandomGenerator
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels import fused as fused_kernels
from pymc_subsample.kernels.barker import BarkerDecision, minibatch_barker_test
from pymc_subsample.kernels.correction import CorrectionDistribution, correction_distribution
from pymc_subsample.kernels.user_proposal import ProposalFunction
from pymc_subsample.step_methods.base import SubsampleMetropolisBase, TestDecision
from pymc_subsample.step_methods.defaults import AUTO

__all__ = ["MinibatchBarkerMH", "barker_tune"]


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


class MinibatchBarkerMH(SubsampleMetropolisBase):
    r"""Metropolis-Hastings whose accept test is the minibatch Barker test of Seita et al.

    Implements Algorithm 1 of Seita, Pan, Chen and Canny, "An Efficient Minibatch Acceptance
    Test for Metropolis-Hastings" (UAI 2018). Each step proposes ``q' = q + scaling * L z`` in the
    unconstrained space and estimates

    ``Delta* = (N / T) mean_batch(l_i) + log prior(q') - log prior(q)``

    from a batch of rows drawn without replacement, together with the variance ``s^2`` of that
    estimate. While ``s^2 >= 1`` (and, if ``error_bound`` is set, while the CLT bound of the
    paper's Corollary 1 exceeds it) the batch grows by ``batch_size`` rows. Then it draws
    ``X_nc ~ N(0, 1 - s^2)`` and ``X_corr`` from the correction distribution and accepts iff
    ``Delta* + X_nc + X_corr > 0``: the total noise is standard logistic, which makes this the
    Barker test ``P(accept) = 1 / (1 + exp(-Delta))`` up to the CLT error. With all N rows it
    makes the exact Barker decision (``full_data``). Never assigned automatically.

    Parameters
    ----------
    vars : list of variables, optional
        Continuous variables to sample (default: all free variables).
    batch_size : int, optional
        Initial batch and increment (the paper's m); at least 2. Default 100.
    temperature : float, default 1
        The likelihood is raised to ``1 / temperature``: **the target changes** (tempered
        posterior). Temperatures above 1 shrink ``s^2`` and so the batches; the paper's
        headline batch sizes (about 100 to 200 rows) were measured at temperatures of 100 and
        10,000. It is recorded in every draw's ``temperature`` stat.
    error_bound : float, optional
        The paper's delta, in (0, 1): also grow the batch until Corollary 1's bound on the
        CDF error of ``Delta*`` is at most this. The bound is loose (about ``11.8 / sqrt(b)`` on
        Gaussian data, so 0.1 needs about 14,000 rows); None (default) skips it.
    proposal, scaling, proposal_cov, tune_interval, obs_dim, model, rng, compile_kwargs
        As for :class:`~pymc_subsample.AusterityMH`. Tuning follows :func:`barker_tune`. With
        ``proposal="langevin"`` the Barker test compares ``Delta*`` plus the log proposal
        ratio of the minibatch-gradient proposal (eq. 21-22 of Korattikara et al. 2016).
    fused : bool, default True
        One compiled call per draw, as for :class:`~pymc_subsample.AusterityMH`; with
        ``error_bound`` set the draw runs in Python.
    control_variate, reference_point, recenter
        Taylor control variates around a reference point, as for
        :class:`~pymc_subsample.AusterityMH` (default ``"auto"``: ``"taylor2"`` around an
        automatic reference point at temperature 1). The Barker variance ``s^2`` is then that
        of the residuals' estimate, which at temperature 1 falls below 1 with O(1) rows instead
        of needing all N.

    Notes
    -----
    **What the knobs control.** ``batch_size`` and ``temperature`` set how many rows are needed
    for ``s^2 < 1``; the test's error comes from the CLT approximation of ``Delta*`` (Corollary
    2 of the paper: the CDF error of the total noise equals that of ``Delta*``) and from the
    correction distribution (sup-CDF error below 1e-7). Heavy-tailed ``l_i`` break the CLT.
    **At temperature 1** with proposals on the posterior scale, ``s^2`` is about
    ``N s_l^2 (N - b) / b`` (with the finite-population correction) where ``s_l^2``, the
    variance of the ``l_i``, is of order ``1 / N``: ``s^2 < 1`` then needs ``b`` of order N, and
    the test uses most rows or all of them (exact, but not cheaper than plain MH).

    **Stats** recorded for every draw (in ``sample_stats``):

    accepted : float64
        1.0 if the proposal was accepted, else 0.0 (a float, as in PyMC's ``Metropolis``, so
        that both can share a compound step).
    n_data : int64
        Rows whose log-likelihood ratio was evaluated for this draw (the cost).
    n_batches : int64
        Stage at which the test stopped: it used ``min(n_batches * batch_size, N)`` rows.
    full_data : bool
        The draw read all N rows (``n_data == N``) and the exact Barker test (logistic noise)
        decided on them.
    variance : float64
        The ``s^2`` of ``Delta*`` used (0 with all rows; NaN after a non-finite proposal).
    clt_error : float64
        Corollary 1's bound at the final batch; NaN unless ``error_bound`` is set.
    nonfinite_proposal : bool
        Rejected because the prior or a row's log-likelihood was NaN or infinite.
    delta_star : float64
        The estimate of the log acceptance ratio the decision was made on (eq. 8); -inf after
        a non-finite proposal.
    n_grad_rows, n_steps, diverging, energy_error : int64, int64, bool, float64
        The proposal's gradient rows, leapfrog steps, divergences and (for HMC) change in the
        Hamiltonian ``-delta_star``, as for :class:`~pymc_subsample.AusterityMH`.
    scaling : float64
        Proposal scale used (the leapfrog step size for HMC).
    temperature : float64
        The likelihood temperature of this run (constant).
    residual_kurtosis, reference_distance : float64
        Control-variate diagnostics, as for :class:`~pymc_subsample.AusterityMH` (NaN
        without a control variate).
    """

    name = "minibatch_barker_mh"
    _decision_fields = BarkerDecision._fields
    stats_dtypes_shapes: ClassVar[dict[str, tuple[type, list[int]]]] = {
        "accepted": (np.float64, []),
        "n_data": (np.int64, []),
        "n_batches": (np.int64, []),
        "full_data": (bool, []),
        "variance": (np.float64, []),
        "clt_error": (np.float64, []),
        "nonfinite_proposal": (bool, []),
        "delta_star": (np.float64, []),
        "n_grad_rows": (np.int64, []),
        "n_steps": (np.int64, []),
        "diverging": (bool, []),
        "energy_error": (np.float64, []),
        "scaling": (np.float64, []),
        "temperature": (np.float64, []),
        "residual_kurtosis": (np.float64, []),
        "reference_distance": (np.float64, []),
    }
    _tune_rule = staticmethod(barker_tune)

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None = None,
        *,
        batch_size: int | None = None,
        temperature: float = 1.0,
        proposal: str | ProposalFunction = "auto",
        error_bound: float | None = None,
        scaling: float | None = None,
        proposal_cov: ArrayLike | None = None,
        tune_interval: int = 100,
        obs_dim: str | None = None,
        model: pm.Model | None = None,
        rng: RandomGenerator = None,
        compile_kwargs: dict[str, Any] | None = None,
        blocked: bool = True,
        control_variate: str | None = AUTO,
        reference_point: Any = None,
        recenter: str | None = None,
        fused: bool = True,
    ) -> None:
        self.error_bound = _check_error_bound(error_bound)
        self.correction = correction_distribution(1.0)
        super().__init__(
            vars,
            batch_size=batch_size,
            temperature=temperature,
            proposal=proposal,
            scaling=scaling,
            proposal_cov=proposal_cov,
            tune_interval=tune_interval,
            obs_dim=obs_dim,
            model=model,
            rng=rng,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
            control_variate=control_variate,
            reference_point=reference_point,
            recenter=recenter,
            fused=fused,
        )

    @staticmethod
    def _acceptance_statistic(decision: TestDecision) -> float:
        # Barker accepts at most about half of the proposals whatever the step size, so the
        # HMC step size is tuned on the Metropolis acceptance probability of the estimated
        # log ratio, min(1, exp(Delta*)), as Stan tunes on its own acceptance probability.
        delta_star = cast(BarkerDecision, decision).delta_star
        return float(min(1.0, np.exp(min(delta_star, 0.0))))

    def fused_test(self) -> tuple[int, float, CorrectionDistribution | None] | None:
        """Return the Barker test with its correction; with ``error_bound``, None."""
        return (
            None if self.error_bound is not None else (fused_kernels.BARKER, 0.0, self.correction)
        )

    def _decide(
        self, log_ratio_rows: Callable[[np.ndarray], np.ndarray], log_prior_proposal_ratio: float
    ) -> BarkerDecision:
        return minibatch_barker_test(
            self.rng,
            log_ratio_rows,
            self.row_sampler,
            log_prior_proposal_ratio,
            self.batch_size,
            self.temperature,
            self.error_bound,
            self.correction,
        )


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

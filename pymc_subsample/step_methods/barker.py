"""MinibatchBarkerMH: the minibatch Barker test with a correction variable (Seita et al.)."""

from __future__ import annotations

from pymc_subsample.kernels.group_tests import BARKER
from pymc_subsample.step_methods.acceptance_tests.barker import BarkerTest, barker_tune
from pymc_subsample.step_methods.base import SubsampleMH

__all__ = ["MinibatchBarkerMH", "barker_tune"]


class MinibatchBarkerMH(SubsampleMH, test=BarkerTest):
    r"""Metropolis-Hastings whose accept test is the minibatch Barker test of Seita et al.

    Implements Algorithm 1 of Seita, Pan, Chen and Canny, "An Efficient Minibatch Acceptance
    Test for Metropolis-Hastings" (UAI 2018). Each step proposes ``q' = q + scaling * L z`` in the
    unconstrained space and estimates

    ``Delta* = (N / T) mean_batch(l_i) + log prior(q') - log prior(q)``

    from a batch of rows drawn without replacement, together with the variance ``s^2`` of that
    estimate. While ``s^2 >= sigma^2`` (``sigma = correction_sd``, 1 in the paper; and, if
    ``error_bound`` is set, while the CLT bound of the paper's Corollary 1 exceeds it) the batch
    grows by ``batch_size`` rows. Then it draws ``X_nc ~ N(0, sigma^2 - s^2)`` and ``X_corr``
    from the correction distribution for that sigma (eq. 14) and accepts iff
    ``Delta* + X_nc + X_corr > 0``: the total noise is standard logistic, which makes this the
    Barker test ``P(accept) = 1 / (1 + exp(-Delta))`` up to the CLT error. With all N rows it
    makes the exact Barker decision (``full_data``). Never assigned automatically.

    Parameters
    ----------
    vars : list of variables, optional
        Continuous variables to sample (default: every continuous free variable, as NUTS;
        ``pm.sample`` assigns its own steps to discrete ones).
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
    correction_sd : float, default 1.0
        The sigma of the paper's eq. 14, in (0, 1.5]: the Gaussian part of the test's logistic
        noise, so the largest ``s^2`` a batch may have. Rows per decision fall about as
        ``1 / sigma^2``; the correction's CDF error grows from below 1e-7 at 1 to 2e-5 at 1.2
        (the paper's appendix C.1 weighs 0.8 to 1.1), and a smaller batch's CLT error grows.
        On the paper's section 6.1 mixture 1.2 reads 0.8x the rows of 1.0 (``docs/barker.md``,
        "Measured: the paper's section 6.1").
    proposal, scaling, proposal_cov, tune_interval, obs_dim, model, rng, compile_kwargs
        As for :class:`~pymc_subsample.AusterityMH`. Tuning follows :func:`barker_tune`. With
        ``proposal="langevin"`` the Barker test compares ``Delta*`` plus the log proposal
        ratio of the minibatch-gradient proposal (eq. 21-22 of Korattikara et al. 2016).
    fused : bool, default True
        One compiled call per draw, as for :class:`~pymc_subsample.AusterityMH`; with
        ``error_bound`` set the draw runs in Python. On a hierarchy the group step takes it
        (:class:`~pymc_subsample.GroupEffectsMH`'s ``fused``).
    control_variate, reference_point, recenter
        Taylor control variates around a reference point, as for
        :class:`~pymc_subsample.AusterityMH` (default ``"auto"``: ``"taylor2"`` around an
        automatic reference point at temperature 1). The Barker variance ``s^2`` is then that
        of the residuals' estimate, which at temperature 1 falls below 1 with O(1) rows instead
        of needing all N.
    group_effects : {"auto", True, False}, default "auto"
        As for :class:`~pymc_subsample.AusterityMH` (with ``correction_sd`` in place of
        ``error_tolerance``): on a hierarchy, :class:`~pymc_subsample.GroupEffectsMH` with
        ``test="barker"``.

    Notes
    -----
    **What the knobs control.** ``batch_size``, ``temperature`` and ``correction_sd`` set how
    many rows are needed for ``s^2 < sigma^2``; the test's error comes from the CLT
    approximation of ``Delta*`` (Corollary 2 of the paper: the CDF error of the total noise
    equals that of ``Delta*``) and from the
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
        Rows whose log-likelihood ratio was evaluated for this draw (the cost); on a
        hierarchy's rows by group (``docs/architecture.md``, "Stratified tests"), row
        evaluations (a row can be drawn twice, and an exact decision reads every row after
        its stages).
    n_batches : int64
        Stage at which the test stopped: it used ``min(n_batches * batch_size, N)`` rows; by
        group, each stage doubles the rows of the one before.
    full_data : bool
        The draw read all N rows (``n_data == N``; at least N by group) and the exact Barker
        test (logistic noise) decided on them.
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
    batch_size : int64
        The test's first batch and increment (constant).
    residual_kurtosis, reference_distance : float64
        Control-variate diagnostics, as for :class:`~pymc_subsample.AusterityMH` (NaN
        without a control variate).
    """

    name = "minibatch_barker_mh"
    group_test = BARKER

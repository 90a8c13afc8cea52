"""AusterityMH: approximate Metropolis-Hastings with a sequential t-test (Korattikara et al.)."""

from __future__ import annotations

from pymc_subsample.kernels.group_tests import T_TEST
from pymc_subsample.step_methods.acceptance_tests.sequential_t import SequentialTTest
from pymc_subsample.step_methods.base import SubsampleMH

__all__ = ["AusterityMH"]


class AusterityMH(SubsampleMH, test=SequentialTTest):
    r"""Metropolis-Hastings accepted by a sequential test on growing minibatches.

    Implements Algorithm 1 of Korattikara, Chen and Welling, "Austerity in MCMC Land" (ICML
    2014; Algorithm 2 of the 2016 version). Each step proposes
    ``q' = q + scaling * L z`` in the unconstrained space (``L L^T = proposal_cov``), or a
    Langevin step on a minibatch gradient (``proposal="langevin"``), draws
    ``u ~ U(0, 1)``, and decides whether the mean over all N rows of
    ``l_i = log p(x_i | q') - log p(x_i | q)`` exceeds
    ``mu_0 = (log u - log prior(q') + log prior(q) - log proposal ratio) / N``. It draws
    ``batch_size`` rows at a time without replacement and stops when a Student-t test with the
    finite-population correction is confident at level ``error_tolerance``; with all N rows it
    makes the exact MH decision. Never assigned automatically by ``pm.sample``: pass it as
    ``step=``.

    Parameters
    ----------
    vars : list of variables, optional
        Continuous variables to sample (default: every continuous free variable, as NUTS;
        ``pm.sample`` assigns its own steps to discrete ones).
    error_tolerance : float, "optimal", OptimalDesign or SequentialDesign, default 0.001
        Probability of a wrong decision allowed in each single t-test (the paper's epsilon),
        in [0, 0.5). 0 gives exact Metropolis-Hastings on all rows. ``"optimal"`` (or
        :class:`~pymc_subsample.OptimalDesign`) designs the test, its first batch, epsilon and
        bound shape, for the fewest expected rows under a bound on the error in the
        acceptance probability, at the end of tuning (section 5.2 of the paper); a
        :class:`~pymc_subsample.SequentialDesign` fixes them (its batch replaces
        ``batch_size``). See ``docs/austerity.md``, "Designing the test".
    batch_size : int, optional
        Rows added per stage of the test (the paper's m); at least 2. Default 100 with a
        control variate (whose residuals are small and close to Gaussian), else 500, which
        keeps the t-statistic close to its CLT limit. ``batch_size >= N`` runs exact MH (with a
        warning).
    temperature : float, default 1
        The likelihood is raised to ``1 / temperature`` (the target changes: a tempered
        posterior); recorded in every draw's ``temperature`` stat.
    proposal : {"auto", "random_walk", "langevin", "independent", "hmc"} or callable, default "auto"
        ``"independent"``: ``q' ~ N(q*, Sigma)``, the Laplace approximation at the control
        variate's reference point (``proposal_cov`` if given), whatever ``q`` (the independence
        sampler; needs a control variate; ``scaling`` unused). ``"hmc"``: a leapfrog
        trajectory (Hamiltonian Monte Carlo) with momentum ``p ~ N(0, proposal_cov^-1)``, step
        size ``scaling`` and an integration time of a quarter period of the Gaussian with
        covariance ``proposal_cov`` (jittered by [0.5, 1.5], at most 100 steps), driven by the
        gradient of all rows when N <= 2,000 or without a control variate at temperature 1,
        else of 2,000 rows drawn once per trajectory (estimating only what the control
        variate's Taylor proxies leave, whose sums over all rows are known); its log proposal
        ratio is the
        kinetic energies' difference, so the test keeps the chain on the posterior whatever the
        gradient's noise (``docs/hmc.md``). Tuning adapts the step size by dual averaging and,
        without a ``proposal_cov`` or a Laplace covariance, a diagonal mass (Stan's windows).
        ``"auto"``: independent where the automatic reference search measured the Laplace
        approximation close (the sd of its log importance weights at most 0.5), no
        ``proposal_cov`` is given and the step samples every free variable of the model; else
        ``"hmc"``, or ``"random_walk"`` for a step over variables no row of the likelihood
        reads. ``"random_walk"``: ``q' = q + scaling * L z``. ``"langevin"``: the
        stochastic-gradient Langevin proposal of Korattikara et al. (2016), eq. 21,
        ``q' ~ N(q + (alpha / 2) M g(q), alpha M)`` with ``alpha = scaling**2``,
        ``M = proposal_cov`` and ``g`` the gradient of the log prior plus ``N / (n T)`` times
        the summed per-row scores of ``batch_size`` rows drawn with replacement. The same rows
        give the gradient at ``q'`` for the proposal ratio, which enters the test's threshold
        (eq. 22), so the chain still targets the posterior. Costs ``2 * batch_size`` per-row
        gradients per step (stat ``n_grad_rows``) on top of the test's rows. A function
        ``proposal(rng, q, scaling) -> (q_new, log_proposal_ratio)``: your own proposal
        (a random walk on a manifold, as in section 6.2 of the paper; ``docs/austerity.md``,
        "Your own proposal"), with ``q`` the step's unconstrained values raveled in the order of
        ``vars`` (a copy: writing into it is harmless) and the ratio
        ``log q(q | q_new) - log q(q_new | q)`` (0 if symmetric; NaN rejects). It is called
        once when the step is built, at the model's initial point, to check its output; the
        chain starts where ``pm.sample`` starts it (not at a Laplace draw), and ``scaling``
        (default 1) is tuned like the random walk's.
    scaling : float, optional
        Initial proposal scale; default ``2.38 / sqrt(d)`` for the random walk,
        ``1.65 / d**(1/6)`` for Langevin (optimal for proposals on the posterior scale) and
        ``d**(-1/4)`` for the HMC step size, 1 for a proposal function. Adapted during tuning; pass
        ``pm.sample(tune=0)`` to keep it fixed.
    proposal_cov : array_like, optional
        Proposal covariance: a vector of variances or a (d, d) SPD matrix. Default: the Laplace
        covariance at the reference point with a control variate, else the identity.
    tune_interval : int, default 100
        Steps between scale adaptations during tuning (PyMC's Metropolis rule, which aims at
        an acceptance rate between 0.2 and 0.5).
    obs_dim : str, optional
        Name of the row dimension in ``coords``. Needed only when observed variables of
        different lengths exist or an array of length N is not row-aligned.
    model : pymc.Model, optional
        Defaults to the model in context.
    rng : int or numpy.random.Generator, optional
        Source of randomness; ``pm.sample(random_seed=...)`` replaces it per chain.
    compile_kwargs : dict, optional
        Passed to PyTensor, e.g. ``{"mode": "NUMBA"}``, ``{"mode": "C"}`` or ``{"mode": "JAX"}``.
    control_variate : {"auto", None, "taylor1", "taylor2"}, default "auto"
        Difference estimator of the log-likelihood ratio (Bardenet, Doucet and Holmes 2017;
        Quiroz et al. 2019): Taylor proxies of each row's log-likelihood around a reference
        point, whose exact sum costs O(d) or O(d^2) per step, so that the minibatch estimates
        only the residuals. At temperature 1 this turns O(N) rows per step into O(1).
        ``"taylor2"`` (gradients and Hessians) leaves the smallest residuals; ``"taylor1"``
        needs only gradients per row; None turns it off. ``"auto"`` is ``"taylor2"`` at
        temperature 1, and None for tempered posteriors and for steps over variables no row
        reads (hyperparameters: one batch per draw anyway); where it cannot apply (the
        likelihood reads variables another step samples, or the automatic reference search
        fails) the step runs without it and says why in one ``SubsampleWarning`` (attribute
        ``dropped_default``). Set-up costs a few chunked
        passes over the data (the reference search's rows are in attribute
        ``reference_rows``). The proposal covariance defaults to the Laplace approximation at
        the reference point, and chains start near it. The decision is still exact
        when all N rows are used.
    reference_point : dict or ReferencePoint, optional
        Expansion point of the control variate, in the unconstrained space, keyed by
        value-variable names (``pms.find_reference_point(...)`` or ``pm.find_MAP()``). Default:
        found from the model's initial point by the search of
        :func:`pymc_subsample.find_reference_point` (default settings, a fixed seed), once per
        model, data and start: every chain and every step built on the same model reuses it,
        as does a step built after ``find_reference_point()``; after ``pm.set_data`` it is found
        again. A chain that starts far from it starts at a draw from the Laplace
        approximation there instead.
    recenter : {None, "tune"}, default None
        ``"tune"``: at the end of tuning, re-expand at the mean of the last half of the tuning
        draws (one more pass over the data, counted in the first draw's ``n_data``); the
        Laplace proposal covariance is recomputed there too.
    fused : bool, default True
        Run each draw as one compiled call (the proposal, prior ratio, rows and test in one
        Numba function, with the per-row terms compiled from the model's graph by PyTensor's
        Numba backend) where the step allows it: a random-walk or independent proposal and
        ``error_tolerance > 0``. Attribute ``draw_path`` says ``"fused"``, or ``"python: "``
        and why not. The algorithm is the same; the random numbers come from Numba's generator
        (seeded from the chain's), so draws differ from ``fused=False`` for the same seed.
        The first step on a new model compiles the draw (about 2 s, cached on disk). On a
        hierarchy the group step takes it (:class:`~pymc_subsample.GroupEffectsMH`'s
        ``fused``: each sweep's decisions in one compiled call).
    group_effects : {"auto", True, False}, default "auto"
        On a hierarchy (group effects read by the rows through a group index, such as
        ``a[group_idx]``), ``"auto"`` builds :class:`~pymc_subsample.GroupEffectsMH` with
        this step's test instead, when no argument but ``vars``, ``error_tolerance``,
        ``model``, ``rng``, ``obs_dim``, ``compile_kwargs`` and ``fused`` is given (``vars``
        holding a hierarchy's group effects, as in a compound step with PyMC's samplers,
        which the group step then holds at their values): each group's effects are
        decided on their own rows, the hyperparameters on none, so a draw reads
        O(groups x batch) rows whatever N. It says so once on PyMC's logger (the line beside
        ``pm.sample``'s own), and why not where a hierarchy's structure is one that step
        refuses (then this step samples every variable in one block). ``True`` requires the
        group route (an error where it does not apply); ``False`` is always this step.

    Notes
    -----
    **What error_tolerance controls.** It bounds the error of each t-test in the sequence, not
    of the whole sequential test nor of the stationary distribution; by Theorem 1 of the paper
    the total-variation bias of the chain is at most ``Delta_max / (1 - eta)``, where
    ``Delta_max`` is the largest error in the acceptance probability. The t-test assumes the
    batch mean is Gaussian (CLT); heavy-tailed per-row log-ratios break that assumption.

    **What it costs on untempered posteriors.** With proposals on the posterior's own scale,
    the spread of the ``l_i`` is about ``1/sqrt(N)`` and so is the gap ``mu - mu_0``: the test
    then needs a fixed fraction of the N rows, not a fixed number. Measured on a conjugate
    linear regression (N = 50,000, three coefficients, optimal random-walk proposal,
    ``benchmarks/austerity_bias_sweep.py``): tolerances 0.05, 0.01 and 0.001 decided on 30%,
    60% and 78% of the rows and inflated posterior standard deviations by about 1.6x, 1.13x and
    1.02x. The default 0.001 keeps the bias within a few percent; 0 gives exact MH, which on
    that problem also had the most effective samples per second.

    **Stats** recorded for every draw (in ``sample_stats``):

    accepted : float64
        1.0 if the proposal was accepted, else 0.0 (a float, as in PyMC's ``Metropolis``, so
        that both can share a compound step).
    n_data : int64
        Rows whose log-likelihood ratio was evaluated for this draw (the cost). Rows are
        evaluated in calls of 1, 2, 4, ... stages, so this can exceed the rows the decision
        used by less than a factor 2. On a hierarchy's rows by group (``docs/architecture.md``,
        "Stratified tests") it counts row evaluations: a row can be drawn twice, and an exact
        decision reads every row after its stages.
    n_batches : int64
        Stage of the sequential test at which the decision was made: it used
        ``min(n_batches * batch_size, N)`` rows (1 when exact MH ran directly on all rows);
        by group, each stage doubles the rows of the one before.
    full_data : bool
        The draw read all N rows (``n_data == N``; at least N by group) and made the exact MH
        decision on them.
    nonfinite_proposal : bool
        The proposal was rejected because its prior or some row's log-likelihood was NaN or
        infinite.
    delta_star : float64
        The estimate of the log acceptance ratio the decision was made on: N times the mean
        ``l_i`` of the rows used, over the temperature, plus the log prior and proposal ratio
        (the test accepts when it exceeds ``log u``); -inf after a non-finite proposal.
    n_grad_rows : int64
        Rows whose per-row gradient was evaluated for the proposal: ``2 * batch_size`` for
        Langevin (the same rows at ``q`` and ``q'``), the gradient's rows times the
        trajectory's gradient evaluations for HMC; 0 for the random walk and independent.
    n_steps : int64
        Leapfrog steps of the HMC proposal's trajectory (0 for the other proposals).
    diverging : bool
        The HMC trajectory's position, momentum or gradient became non-finite (a rejection).
    energy_error : float64
        For HMC, PyMC's name for the change in the Hamiltonian from the start of the trajectory
        to its end, ``-delta_star`` (estimated like the test's log ratio; inf after a
        divergence); NaN for the other proposals.
    scaling : float64
        Proposal scale used for this draw (the leapfrog step size for HMC).
    temperature : float64
        The likelihood temperature of this run (constant).
    batch_size : int64
        The test's first batch for this draw (a designed test's after tuning).
    error_tolerance : float64
        The first stage's epsilon (a designed test's bounds change along the stages).
    design_rows, design_error : float64
        A designed test's predicted rows per test and error (the worst case ``E(0)`` or the
        mean ``|Delta|`` over its tuning proposals) by the dynamic programme; NaN without a
        design.
    residual_kurtosis : float64
        With a control variate, the excess kurtosis of the residuals of the test's first batch
        (0 for Gaussian residuals); NaN otherwise. The tests assume the batch mean is Gaussian:
        a mean value above ``batch_size`` after tuning gives a ``SubsampleWarning``.
    reference_distance : float64
        With a control variate, the Mahalanobis distance of the draw from the reference point
        under the Laplace covariance (about the square root of a chi-square with d degrees of
        freedom); NaN otherwise. Beyond the chi-square's 1 - 1e-6 quantile a
        ``SubsampleWarning`` says the proxies are degrading.
    """

    name = "austerity_mh"
    group_test = T_TEST

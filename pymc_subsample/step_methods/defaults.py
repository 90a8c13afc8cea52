"""What the Metropolis-Hastings steps do when given no arguments, and when they cannot.

``control_variate="auto"`` (the default) is a second-order (``"taylor2"``) control variate
around a reference point found automatically, with the Laplace covariance there as the proposal
covariance and a batch of :data:`CONTROLLED_BATCH_SIZE` rows. The choice and its measurements
are in ``docs/control_variates.md`` ("Defaults"). At temperature 1 a test without control
variates reads a fixed share of the N rows per draw (91% of 1e6 rows on a logistic regression
at ``error_tolerance=0.001``); with them a fixed number of rows, whatever N.

The default is dropped, with one ``SubsampleWarning`` that says why, where it cannot hold:
the likelihood reads variables another step samples (the proxies would be expanded at their old
values), or the reference point search fails (no mode, a funnel, a posterior far from
Gaussian). It is not used, without a warning, for tempered posteriors (``temperature != 1``),
which are wider than the posterior by ``sqrt(temperature)``, so that proxies around the
posterior's mode do not hold where the chain goes and the tests are cheap without them, nor
for a step over variables no row of the likelihood reads (hyperparameters), whose test reads
one batch per draw anyway.
"""

from __future__ import annotations

import numpy as np

from pymc_subsample.model.oracles import ModelOracles

__all__ = [
    "AUTO",
    "CONTROLLED_BATCH_SIZE",
    "DEFAULT_CONTROL_VARIATE",
    "INDEPENDENT_SPREAD",
    "TRAJECTORY_GRADIENT_NOISE",
    "TRAJECTORY_GRADIENT_ROWS",
    "TRAJECTORY_MAX_STEPS",
    "TRAJECTORY_MIN_GRADIENT_ROWS",
    "TRAJECTORY_TARGET_ACCEPTANCE",
    "TRAJECTORY_TIME",
    "control_variate_obstacle",
    "dropped_default_message",
    "gradient_obstacle",
]

#: The default value of ``control_variate``.
AUTO = "auto"
#: What ``"auto"`` becomes where it applies.
DEFAULT_CONTROL_VARIATE = "taylor2"
#: Default ``batch_size`` with a control variate (measured in docs/control_variates.md,
#: "Defaults, and when they are dropped").
CONTROLLED_BATCH_SIZE = 100
#: ``proposal="auto"`` draws independently from the Laplace approximation at the automatic
#: reference when the search measured the sd of its log importance weights at most this
#: (docs/control_variates.md, "The default proposal"): lognormal weights of sd 0.5 give an
#: independence sampler about 72% acceptance; above it, or without an automatic reference,
#: the random walk with the Laplace covariance.
INDEPENDENT_SPREAD = 0.5
#: Where the independent proposal does not apply, ``proposal="auto"`` runs Hamiltonian
#: trajectories (``kernels/trajectory.py``) driven by the gradient of all rows when
#: N <= this or without a control variate at temperature 1, else of this many rows drawn per
#: trajectory (estimating only the control variate's Taylor remainders when there is one).
TRAJECTORY_GRADIENT_ROWS = 2_000
#: The trajectories' minibatch is then resized during tuning to the fewest rows (at least this
#: many) whose gradient noise, summed over the coordinates whitened by the mass, has variance
#: at most ``TRAJECTORY_GRADIENT_NOISE`` (``HamiltonianPart``; ``docs/hmc.md``).
TRAJECTORY_MIN_GRADIENT_ROWS = 100
#: In whitened coordinates a noise ``delta`` fixed for a trajectory moves its end by about
#: ``|delta|`` per unit of time and changes its energy by about ``|delta| sqrt(2 d) / sqrt(d)``:
#: a summed variance of 0.1 keeps that error's sd near 0.3, where the acceptance barely drops.
TRAJECTORY_GRADIENT_NOISE = 0.1
#: Integration time in whitened coordinates (jittered by [0.5, 1.5]): a quarter period of the
#: Gaussian the proposal covariance describes, after which the position is independent of the
#: start.
TRAJECTORY_TIME = 0.5 * 3.141592653589793
#: Most leapfrog steps per trajectory, whatever the step size.
TRAJECTORY_MAX_STEPS = 100
#: The acceptance rate the step size's dual averaging aims at during tuning.
TRAJECTORY_TARGET_ACCEPTANCE = 0.8
#: Rows whose summed gradient :func:`gradient_obstacle` checks, at two points.
GRADIENT_CHECK_ROWS = 64


def control_variate_obstacle(oracles: ModelOracles, temperature: float) -> str | None:
    """Why the default control variate cannot apply to a step on ``oracles``; None if it can.

    Parameters
    ----------
    oracles : ModelOracles
        The step's oracles.
    temperature : float
        The step's likelihood temperature.

    Returns
    -------
    str or None
        A reason in the user's words, to be completed by :func:`dropped_default_message`; an
        empty string where no control variate is the documented default rather than a
        fallback (no warning): a tempered posterior, or a step over variables no row reads.
    """
    if temperature != 1.0 or not oracles.rows_depend_on_q:
        # A step over variables no row reads (hyperparameters) reads one batch per draw: its
        # row differences are exactly 0, so there is nothing for a control variate to save.
        return ""
    others = oracles.other_variables_in_rows
    if others:
        return (
            f"the likelihood also reads {', '.join(others)}, which another step samples: "
            "Taylor proxies are expanded at fixed values of them and stop holding once that "
            "step moves them. Give this step those that are continuous too (vars=None samples "
            "every continuous variable; discrete ones keep their own step), or pass "
            "control_variate=None to silence this"
        )
    return None


def dropped_default_message(step_name: str, reason: str) -> str:
    """Say that a step runs without its default control variate, and what that costs."""
    return (
        f"{step_name} runs without its default control variate (control_variate='auto', a "
        f"second-order Taylor control variate around an automatic reference point): {reason}. "
        "Without it each draw's test reads a share of the N rows that does not shrink as N "
        "grows (stat n_data), and there is no Laplace covariance for the proposal: the default "
        "Hamiltonian trajectories adapt a diagonal mass during tuning instead, unless "
        "proposal_cov is given."
    )


def gradient_obstacle(oracles: ModelOracles) -> str | None:
    """Why PyTensor's gradient of the rows cannot drive a proposal; None if it can.

    The rows' summed gradient is evaluated on the first :data:`GRADIENT_CHECK_ROWS` rows at
    the initial point and at a point jittered from it (fixed seed). Where the rows'
    log-likelihood is finite at both and the gradient is not at either, the derivative graph
    is wrong rather than the point far out: every trajectory or Langevin step would be
    rejected as non-finite, the step size would shrink to nothing during tuning and the chain
    would never move. A user's ``pm.CustomDist`` with ``sqrt(maximum(x, 0))`` in its
    log-density is one such model (PyMC's own ``dlogp`` is NaN there too).
    """
    if not oracles.rows_depend_on_q:
        return None
    rows = np.arange(min(oracles.n_rows, GRADIENT_CHECK_ROWS), dtype="int64")
    gradient = oracles.gradient_on_rows(rows)
    q0 = oracles.initial_q
    jittered = q0 + np.random.default_rng(0).normal(scale=0.1, size=q0.size)
    with np.errstate(all="ignore"):
        for q in (q0, jittered):
            if not np.all(np.isfinite(oracles.loglik_rows(q, rows))):
                return None  # the point itself is out of reach, not the derivative
            if np.all(np.isfinite(gradient(q))):
                return None
    return (
        "the gradient of the log-likelihood is not finite (NaN) at the initial point and "
        "near it, where the log-likelihood itself is finite, so gradient-based proposals "
        "would reject every move (PyMC's model.compile_dlogp() shows the same NaN; a term "
        "such as sqrt(maximum(x, 0)) in a CustomDist's logp has no derivative at 0). Write "
        "the log-density with finite derivatives, or use proposal='random_walk'"
    )

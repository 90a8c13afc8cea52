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

from pymc_subsample.model.oracles import ModelOracles

__all__ = [
    "AUTO",
    "CONTROLLED_BATCH_SIZE",
    "DEFAULT_CONTROL_VARIATE",
    "INDEPENDENT_SPREAD",
    "TRAJECTORY_GRADIENT_ROWS",
    "TRAJECTORY_MAX_STEPS",
    "TRAJECTORY_TARGET_ACCEPTANCE",
    "TRAJECTORY_TIME",
    "control_variate_obstacle",
    "dropped_default_message",
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
#: Integration time in whitened coordinates (jittered by [0.5, 1.5]): a quarter period of the
#: Gaussian the proposal covariance describes, after which the position is independent of the
#: start.
TRAJECTORY_TIME = 0.5 * 3.141592653589793
#: Most leapfrog steps per trajectory, whatever the step size.
TRAJECTORY_MAX_STEPS = 100
#: The acceptance rate the step size's dual averaging aims at during tuning.
TRAJECTORY_TARGET_ACCEPTANCE = 0.8


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
            "step moves them. Give this step those variables too (vars=None samples them all), "
            "or pass control_variate=None to silence this"
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

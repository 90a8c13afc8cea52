"""ReversibleJumpMH: variable selection by moves accepted by the sequential t-test.

Birth, death and update moves (Korattikara et al. 2014, section 6.3 and supplementary E).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pymc as pm
import pytensor
from pymc.blocking import RaveledVars
from pymc.vartypes import discrete_types
from pytensor.graph.traversal import graph_inputs
from pytensor.tensor.random.basic import BernoulliRV
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.reversible_jump import (
    BIRTH_SD,
    MOVE_PROBABILITIES,
    UPDATE_SD,
    BirthDeathProposal,
    PseudoPrior,
)
from pymc_subsample.step_methods.acceptance_tests import StatSpec
from pymc_subsample.step_methods.austerity import AusterityMH

__all__ = ["ReversibleJumpMH"]


class ReversibleJumpMH(AusterityMH):
    r"""Variable selection by reversible jump, each move accepted by :class:`AusterityMH`'s test.

    The model has D inclusion indicators ``gamma`` (a ``pm.Bernoulli`` free variable, or
    anything binary with a prior on it) and D coefficients ``beta`` (continuous), and its
    likelihood reads ``gamma * beta``. Each draw proposes one move (section 6.3, supplementary
    E): an update of one included coefficient, the birth of an excluded one (with a new value
    from ``N(0, birth_sd^2)``) or the death of an included one, and accepts it with the
    sequential t-test on subsampled rows; ``mu_0`` holds the move's proposal ratio (eqs.
    36-38). Excluded coefficients stay in the trace, distributed as their prior in the model
    (a pseudo-prior): the posterior of ``gamma`` and of the included coefficients is the
    reversible-jump one. ``docs/discrete.md`` says more.

    Parameters
    ----------
    indicators : variable or str
        The ``pm.Bernoulli`` inclusion indicators, D entries (the variable or its name).
    coefficients : variable or str
        The continuous coefficients, D entries, in the indicators' order.
    birth_sd : float, default 0.1
        Sd of a born coefficient's proposal (the paper's sigma_birth); the scale of the
        coefficients that matter.
    update_sd : float, default 0.01
        Sd of an update move (sigma_update); about the coefficients' posterior sd.
    move_probabilities : tuple of float, default (1/3, 1/3, 1/3)
        Probabilities of update, birth and death moves. The update's may be 0, where another
        step (``pms.AusterityMH([beta])``) updates the coefficients.
    **settings
        :class:`AusterityMH`'s settings (``error_tolerance``, ``batch_size``, ``obs_dim``,
        ``model``, ``rng``, ...); not its proposal or control variate.

    Notes
    -----
    Sample statistics: :class:`AusterityMH`'s (``accepted``, ``n_data``, ...), plus ``move``
    (the move proposed: 0 update, 1 birth, 2 death) and ``n_included`` (the model size ``k``
    after the draw). The moves ignore ``scaling``, which is not tuned.

    Examples
    --------
    >>> import numpy as np, pymc as pm, pymc_subsample as pms
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(4_000, 3))
    >>> y = X[:, 0] + rng.normal(size=4_000)
    >>> with pm.Model():
    ...     gamma = pm.Bernoulli("gamma", p=0.5, shape=3)
    ...     beta = pm.Normal("beta", 0.0, 1.0, shape=3)
    ...     _ = pm.Normal("y", X @ (gamma * beta), 1.0, observed=y)
    ...     step = pms.ReversibleJumpMH(gamma, beta, update_sd=0.02, error_tolerance=0.01)
    ...     idata = pm.sample(draws=2_000, tune=0, chains=1, step=step, progressbar=False,
    ...                       random_seed=1, compute_convergence_checks=False)
    >>> idata.posterior["gamma"].mean(("chain", "draw")).values.round(1).tolist()
    [1.0, 0.0, 0.0]
    """

    name = "reversible_jump_mh"
    stats_dtypes_shapes: ClassVar[dict[str, StatSpec]] = {
        **AusterityMH.stats_dtypes_shapes,
        "move": (np.int64, []),
        "n_included": (np.int64, []),
    }

    def __init__(
        self,
        indicators: TensorVariable,
        coefficients: TensorVariable,
        *,
        birth_sd: float = BIRTH_SD,
        update_sd: float = UPDATE_SD,
        move_probabilities: tuple[float, float, float] = MOVE_PROBABILITIES,
        **settings: Any,
    ) -> None:
        taken = sorted({"proposal", "control_variate", "vars"} & set(settings))
        if taken:
            raise TypeError(
                f"ReversibleJumpMH chooses {taken} itself (its birth, death and update moves, "
                "without a control variate)."
            )
        model = pm.modelcontext(settings.get("model"))
        self._rj_model = model
        gamma, beta, n_features = _check_pair(model, indicators, coefficients)
        pseudo_prior = _pseudo_prior(model, gamma, beta, self._current_value)
        self.moves = BirthDeathProposal(
            n_features, pseudo_prior, birth_sd, update_sd, move_probabilities
        )
        super().__init__(
            [gamma, beta],
            proposal=self.moves,
            control_variate=None,
            **settings,
        )

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """One move; its stats add ``move`` (0 update, 1 birth, 2 death) and ``n_included``."""
        moved, stats = super().astep(q0)
        stats[0]["move"] = self.moves.last_move
        stats[0]["n_included"] = int(np.count_nonzero(moved.data[: self.moves.n_features]))
        return moved, stats

    def _current_value(self, name: str) -> np.ndarray:
        """Return the current value of a variable another step samples (initial at set-up)."""
        shared = getattr(self, "shared", {})
        if name in shared:
            return np.asarray(shared[name].get_value(borrow=True))
        return np.asarray(self._rj_model.initial_point()[name])


def _check_pair(
    model: pm.Model, indicators: Any, coefficients: Any
) -> tuple[TensorVariable, TensorVariable, int]:
    """Check the indicators are Bernoulli, the coefficients continuous, sizes equal.

    Returns the two random variables (given as variables or names) and D.
    """
    rvs = {str(rv.name): rv for rv in model.free_RVs}
    found = []
    for role, variable in (("indicators", indicators), ("coefficients", coefficients)):
        name = str(getattr(variable, "name", variable))
        rv = rvs.get(name)
        if rv is None:
            raise ValueError(f"{role}={name!r} is not a free variable of the model.")
        found.append(rv)
    gamma, beta = found
    if gamma.owner is None or not isinstance(gamma.owner.op, BernoulliRV):
        raise ValueError(
            f"indicators={gamma.name!r} must be a pm.Bernoulli variable (0 excludes a feature, "
            "1 includes it)."
        )
    if beta.dtype in discrete_types:
        raise ValueError(f"coefficients={beta.name!r} must be continuous.")
    point = model.initial_point()
    sizes = [int(np.size(point[str(model.rvs_to_values[rv].name)])) for rv in (gamma, beta)]
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"indicators {gamma.name!r} has {sizes[0]} entries and coefficients {beta.name!r} "
            f"{sizes[1]}: give one indicator per coefficient."
        )
    return gamma, beta, sizes[0]


def _pseudo_prior(
    model: pm.Model,
    gamma: TensorVariable,
    beta: TensorVariable,
    current_value: Callable[[str], np.ndarray],
) -> PseudoPrior:
    """Draws and log-densities of one coefficient from its prior in the model.

    The prior's parameters may read other variables (a shrinkage scale sampled by another
    step): they are evaluated at those variables' current values, read by ``current_value``.
    """
    value = model.rvs_to_values[beta]
    op = beta.owner.op if beta.owner is not None else None
    if model.rvs_to_transforms.get(beta) is not None or not isinstance(op, RandomVariable):
        raise ValueError(
            f"coefficients={beta.name!r} must be a distribution on the real line without a "
            "transform (pm.Normal, pm.Laplace, pm.StudentT, ...): an excluded coefficient is "
            "drawn from its prior."
        )
    params = model.replace_rvs_by_values(op.dist_params(beta.owner))
    log_density = model.logp(vars=[beta], sum=False)[0]
    inputs = [
        v for v in graph_inputs([*params, log_density]) if v in model.value_vars and v is not value
    ]
    if model.rvs_to_values[gamma] in inputs:
        raise ValueError(
            f"The prior of {beta.name!r} reads the indicators {gamma.name!r}: give the "
            "coefficients a prior of their own and let the likelihood read gamma * beta."
        )
    names = [str(v.name) for v in inputs]
    params_fn = pytensor.function(inputs, params, on_unused_input="ignore")
    density_fn = pytensor.function([value, *inputs], log_density, on_unused_input="ignore")
    shape = tuple(np.shape(model.initial_point()[str(value.name)]))

    def others() -> list[np.ndarray]:
        return [current_value(name) for name in names]

    def draw(rng: np.random.Generator, j: int) -> float:
        values = op.rng_fn(rng, *params_fn(*others()), shape)
        return float(np.ravel(values)[j])

    def density(j: int, x: float) -> float:
        point = np.zeros(shape)
        point.flat[j] = x
        return float(np.ravel(density_fn(point, *others()))[j])

    return PseudoPrior(draw, density)

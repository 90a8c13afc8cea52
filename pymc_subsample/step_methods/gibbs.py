"""AusterityGibbs: Gibbs updates of binary variables decided by the sequential test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.step_methods.compound import StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import RandomGenerator, get_value_vars_from_user_vars
from pytensor.tensor.random.basic import BernoulliRV
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.gibbs import GibbsSweepInfo, binary_gibbs_sweep
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.step_methods.acceptance_tests import StatSpec
from pymc_subsample.step_methods.acceptance_tests.sequential_t import _check_error_tolerance
from pymc_subsample.step_methods.arguments import check_choice, check_int
from pymc_subsample.step_methods.step_base import SubsampleStepBase

__all__ = ["AusterityGibbs"]

#: Default epsilon of each update's t-test: the error in the conditional probability of one
#: update stays within about epsilon (Korattikara et al. 2014, supplementary F.1, Fig. 14).
DEFAULT_ERROR_TOLERANCE = 0.01
#: Default rows per stage: the paper's 500 terms per minibatch (supplementary F.1), which keeps
#: the t-statistic close to its CLT limit without a control variate.
DEFAULT_BATCH_SIZE = 500


@dataclass_state
class AusterityGibbsState(StepMethodState):
    """Adaptive state restored before each sequential chain (none is adapted)."""

    tune: bool


class AusterityGibbs(SubsampleStepBase):
    r"""Gibbs sampling of binary variables, each update decided from a subsample of the rows.

    Korattikara, Chen and Welling (2014), supplementary F: a sweep updates every entry
    ``x_j`` of the step's ``pm.Bernoulli`` variables in turn, setting ``x_j = 1`` with the
    conditional probability ``sigmoid(Delta_j)``, ``Delta_j`` the log ratio of the joint
    density at ``x_j = 1`` and ``x_j = 0`` (eq. 39). The likelihood's part of ``Delta_j`` is N
    times the mean over the rows of their log ratios (eq. 42); the sequential t-test of
    :class:`AusterityMH` estimates it from growing batches of rows drawn without replacement
    and decides ``Delta_j > logit(u)`` (eq. 40-41) as soon as it is confident at level
    ``error_tolerance``; with all N rows it decides exactly. The rows are those of the
    model's observed variables, as for the other steps: data points, or the factors of a
    Markov random field written as an observed ``pm.CustomDist`` with one term per row.

    Composes with the continuous steps in one ``pm.sample`` (``step=[pms.AusterityGibbs([z]),
    pms.AusterityMH([beta])]``). Never assigned automatically: pass it as ``step=``.

    Parameters
    ----------
    vars : list of variables, optional
        ``pm.Bernoulli`` free variables to update (default: every one in the model).
    error_tolerance : float, default 0.01
        Probability of a wrong decision allowed in each update's t-test (the paper's
        epsilon), in [0, 0.5); 0 reads every row (exact Gibbs). The error of an update's
        conditional probability stays within about epsilon, and that of the stationary
        distribution within the largest such error over ``1 - eta``, ``eta`` the exact
        sampler's Dobrushin coefficient (Theorem 4).
    batch_size : int, default 500
        Rows added per stage of each test; at least 2. ``batch_size >= N`` reads every row.
    order : {"random", "sequential"}, default "random"
        The order of the updates in a sweep: a new random permutation per sweep, or the
        variables' raveled order.
    obs_dim : str, optional
        Name of the row dimension when it cannot be inferred (see ``docs/guide.md``).
    model : pymc.Model, optional
    rng : int or numpy.random.Generator, optional
        Replaced by the chain's generator inside ``pm.sample``.
    compile_kwargs : dict, optional
        Passed to PyTensor's compiler.

    Notes
    -----
    Sample statistics per draw (one sweep): ``n_data`` (rows read by all the sweep's tests),
    ``n_updates`` (entries updated), ``n_changed`` (entries whose value changed),
    ``n_full_data`` (updates that read all rows), ``n_nonfinite`` (updates whose log ratio
    was not finite: the entry keeps its value), ``error_tolerance`` and ``batch_size``.

    Examples
    --------
    >>> import numpy as np, pymc as pm, pymc_subsample as pms
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(5_000, 3))
    >>> y = X[:, 0] + rng.normal(size=5_000)
    >>> with pm.Model():
    ...     z = pm.Bernoulli("z", p=0.5, shape=3)
    ...     _ = pm.Normal("y", mu=X @ z, sigma=1.0, observed=y)
    ...     idata = pm.sample(draws=100, tune=0, chains=1, step=pms.AusterityGibbs(),
    ...                       progressbar=False, random_seed=1, compute_convergence_checks=False)
    >>> idata.posterior["z"].mean(("chain", "draw")).values.round(2).tolist()
    [1.0, 0.0, 0.0]
    """

    name = "austerity_gibbs"
    _state_class = AusterityGibbsState
    stats_dtypes_shapes: ClassVar[dict[str, StatSpec]] = {
        **{field: (np.int64, []) for field in GibbsSweepInfo._fields},
        "error_tolerance": (np.float64, []),
        "batch_size": (np.int64, []),
    }

    def __init__(
        self,
        vars: Sequence[TensorVariable] | None = None,
        *,
        error_tolerance: float = DEFAULT_ERROR_TOLERANCE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        order: str = "random",
        obs_dim: str | None = None,
        model: pm.Model | None = None,
        rng: RandomGenerator = None,
        compile_kwargs: dict[str, Any] | None = None,
    ) -> None:
        model = pm.modelcontext(model)
        self.error_tolerance = _check_error_tolerance(error_tolerance)
        self.order = check_choice("order", order, ("random", "sequential"))
        batch_size = check_int("batch_size", batch_size, minimum=2)
        super().__init__(
            _binary_value_vars(model, vars),
            batch_size=batch_size,
            obs_dim=obs_dim,
            model=model,
            rng=rng,
            compile_kwargs=compile_kwargs,
            blocked=True,
            discrete=True,
        )
        self.row_sampler = RowSampler(self.oracles.n_rows, self.oracles.row_proposals())
        self.tune = True
        self.oracles.ensure_rows_finite()  # no pass over every row checked the start

    def _rebuild_for_data(self) -> None:
        self.row_sampler = RowSampler(self.oracles.n_rows, self.oracles.row_proposals())

    def reset_tuning(self) -> None:
        """Nothing is tuned."""

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        """One sweep: every binary entry updated once, each by its own sequential test."""
        q = np.asarray(q0.data, dtype=np.float64)
        positions = np.arange(q.size)
        if self.order == "random":
            positions = self.rng.permutation(q.size)
        q_new, info = binary_gibbs_sweep(
            self.rng,
            q,
            positions,
            self.oracles.loglik_ratio_rows,
            self.oracles.log_prior_ratio,
            self.row_sampler,
            self.error_tolerance,
            self.batch_size,
        )
        stats: dict[str, Any] = {
            **info._asdict(),
            "error_tolerance": self.error_tolerance,
            "batch_size": self.batch_size,
        }
        return RaveledVars(q_new, q0.point_map_info), [stats]


def _binary_value_vars(
    model: pm.Model, vars: Sequence[TensorVariable] | None
) -> list[TensorVariable]:
    """Return the value variables of ``vars`` (default: each free ``pm.Bernoulli``), checked."""
    if vars is None:
        values = [
            model.rvs_to_values[rv]
            for rv in model.free_RVs
            if rv.owner is not None and isinstance(rv.owner.op, BernoulliRV)
        ]
        if not values:
            raise ValueError(
                "AusterityGibbs updates pm.Bernoulli free variables, and the model has none. "
                "Use pms.AusterityMH for continuous variables."
            )
        return values
    values = get_value_vars_from_user_vars(vars, model)
    for value in values:
        rv = model.values_to_rvs[value]
        if rv.owner is None or not isinstance(rv.owner.op, BernoulliRV):
            kind = type(rv.owner.op).__name__ if rv.owner is not None else "variable"
            raise ValueError(
                f"AusterityGibbs updates binary pm.Bernoulli variables; {rv.name!r} is a "
                f"{kind}. Sample continuous variables with pms.AusterityMH and other discrete "
                "ones with PyMC's steps (pm.CategoricalGibbsMetropolis, pm.Metropolis) in a "
                "compound step: pm.sample(step=[...])."
            )
    return values

"""How a Metropolis-Hastings step chooses its control variate and reference point.

:class:`ControlVariateChoice` is a piece of ``SubsampleMH`` (a base class it inherits from):
``control_variate="auto"`` becomes the default where it applies (``defaults.py``), a passed
reference point keeps what its search measured, and a mode that fails only the Laplace check
gives the control variate in the likelihood's parameters (``docs/architecture.md``). From the
reference it also says where a chain starts (``_chain_start``) and how far from it a chain
goes before a warning (``_far_limit``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from pymc_subsample.kernels.user_proposal import UserProposal
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.reference import automatic_reference
from pymc_subsample.reference_search import Optimum
from pymc_subsample.step_methods.control import (
    ControlVariate,
    ProxyTermsError,
    reference_vector,
)
from pymc_subsample.step_methods.defaults import (
    AUTO,
    DEFAULT_CONTROL_VARIATE,
    INDEPENDENT_SPREAD,
    control_variate_obstacle,
    dropped_default_message,
)
from pymc_subsample.warnings import warn_user

__all__ = ["USER_PROPOSAL_FAR_FACTOR", "ControlVariateChoice"]

#: With a proposal function, the far-from-reference warning's distance limit is this many times
#: the Gaussian one (``SubsampleMH._far_limit``).
USER_PROPOSAL_FAR_FACTOR = 10.0


class ControlVariateChoice:
    """The control-variate choice of ``SubsampleMH``, as methods of the step.

    Its constructor calls ``_resolve_control_variate``, then ``_make_control_variate``; the
    attributes below are the step's, set there.
    """

    oracles: ModelOracles
    temperature: float
    vars: list[Any]
    control: ControlVariate | None
    control_variate: str | None
    dropped_default: str
    reference_rows: int
    laplace_spread: float
    _automatic: bool
    _own_covariance: bool
    _funnel: str
    _initial_point: dict[str, np.ndarray]
    _user_proposal: UserProposal | None
    _start_near_reference: bool
    rng: np.random.Generator

    @property
    def _laplace_proposal(self) -> bool:
        """Whether the proposal uses the control variate's Laplace covariance.

        Where the step chose the covariance and its control variate is expanded in ``q``; in
        the likelihood's parameters the Laplace covariance at the mode describes the posterior
        badly, and an HMC proposal adapts a diagonal mass instead.
        """
        return (
            self._own_covariance
            and self.control is not None
            and self.oracles.expansion == "unconstrained"
        )

    def _far_limit(self, limit: float) -> float | None:
        """Return the squared distance from the reference beyond which to warn (None: never).

        The Gaussian limit where the Laplace approximation describes the posterior; with a
        proposal function, which may keep the chain on a set (a manifold) that approximation
        does not describe, ``USER_PROPOSAL_FAR_FACTOR`` times farther: a reference point on
        another copy of the mode than the chain's (``examples/ica_stiefel.py``) is hundreds of
        sds away. None where the search measured the posterior skewed.
        """
        if self.laplace_spread > INDEPENDENT_SPREAD:
            return None
        if self._user_proposal is not None:
            return USER_PROPOSAL_FAR_FACTOR**2 * limit
        return limit

    def _resolve_control_variate(self, requested: str | None, reference_point: Any) -> str | None:
        """Choose the control variate: ``requested``, or for "auto" taylor2 where it applies.

        Where the default cannot apply the step runs without and says why, once
        (``step_methods/defaults.py``); a ``reference_point`` given with it is an error then.
        """
        if requested != AUTO:
            return requested
        obstacle = control_variate_obstacle(self.oracles, self.temperature)
        if obstacle is None:
            return DEFAULT_CONTROL_VARIATE
        if reference_point is not None:
            raise ValueError(
                f"reference_point was given but no control variate can be used: {obstacle}."
                if obstacle
                else "reference_point was given for a tempered posterior (temperature != 1), "
                "where control_variate='auto' uses none: pass control_variate='taylor2'."
            )
        self._drop_default(obstacle)
        return None

    def _drop_default(self, reason: str) -> None:
        if reason:
            self.dropped_default = reason
            warn_user(dropped_default_message(type(self).__name__, reason))

    def _make_control_variate(self, reference_point: Any) -> ControlVariate | None:
        """Expand at ``reference_point``, or at the automatic reference when it is None.

        With ``control_variate="auto"`` a failed automatic search drops the control variate
        (returns None, with a warning), or expands it in the likelihood's parameters at a mode
        that fails only the Laplace check; an explicit control variate refuses it. Called
        again after ``pm.set_data``, it decides afresh for the new data.
        """
        self.oracles = self.oracles.in_unconstrained()
        optimum = (
            automatic_reference(self.oracles, self._funnel)
            if reference_point is None
            else self._measured_reference(reference_point)
        )
        if optimum is not None:
            if optimum.failure is not None:
                if self._automatic and optimum.at_mode:
                    control = self._likelihood_control_variate(optimum)
                    if control is not None:
                        return control
                if reference_point is not None:  # the user's point: refused with its failure
                    reference_vector(reference_point, self.vars, self._initial_point)
                if self._automatic:
                    self._drop_default(
                        f"the search for a reference point failed: {optimum.failure}"
                    )
                    return None
                raise ValueError(
                    f"The step's search for a reference point failed: {optimum.failure}. "
                    "pms.find_reference_point() names the cause in hierarchical models."
                )
            self.reference_rows = optimum.n_row_evaluations if reference_point is None else 0
            self.laplace_spread = optimum.laplace_log_weight_sd
            reference, row_sums = optimum.q, optimum.row_sums  # the search's own pass
        else:
            reference = reference_vector(reference_point, self.vars, self._initial_point)
            row_sums = None  # the point may come from other data: one pass here
        try:
            control = ControlVariate(self.oracles, reference, self.temperature, row_sums)
        except ProxyTermsError as error:
            if self._automatic:
                self._drop_default(str(error))
                return None
            raise ValueError(
                f"control_variate={self.control_variate!r} cannot be used on this model: {error}. "
                "Pass control_variate=None."
            ) from error
        if control.n_clipped:
            warn_user(
                f"The log posterior's Hessian at the reference point has {control.n_clipped} "
                "non-negative eigenvalue(s): the point is not near a mode, so the Laplace "
                "proposal covariance was clipped and the Taylor proxies will be poor. Use "
                "pms.find_reference_point or pass proposal_cov.",
            )
        return control

    def _measured_reference(self, reference_point: Any) -> Optimum | None:
        """Return a passed search result as the step's own search would have, or None.

        A :class:`~pymc_subsample.ReferencePoint` over exactly the step's variables carries
        what the search measured there (the Laplace check, whether it is a mode): the step
        then chooses its control variate and proposal as it would from its own search
        (issue 37, item 4). Its row sums are not reused (the point may come from other
        data: one pass here). None for a plain dict, or a result over other variables,
        whose Laplace check described another posterior.
        """
        point = getattr(reference_point, "point", None)
        names = [str(var.name) for var in self.vars]
        if not isinstance(reference_point, Optimum) or point is None or set(point) != set(names):
            return None
        ordered = {name: point[name] for name in names}
        q = reference_vector(ordered, self.vars, self._initial_point)
        return replace(reference_point, q=q, row_sums=None)

    def _likelihood_control_variate(self, optimum: Optimum) -> ControlVariate | None:
        """Expand in the likelihood's parameters at a mode whose Laplace check failed.

        A non-centred hierarchy's posterior in ``q`` is a curved ridge, which a Taylor proxy in
        ``q`` cannot follow; its likelihood reads only the group effects ``a = mu + sd * z``
        (and the other parameters the rows see), on which the data put a close-to-Gaussian
        posterior. Expanded in those (``model/likelihood_parameters.py``), around ``phi`` of
        the mode, the second-order proxies hold where the chain goes. None where the model has
        no such parameters (no more of them than ``q``), or their proxies fail the check of
        :class:`ControlVariate`. The proposal does not use the (poor) Laplace covariance.
        """
        oracles = self.oracles.in_likelihood_parameters()
        if oracles is None:
            return None
        try:
            control = ControlVariate(oracles, optimum.q, self.temperature, optimum.row_sums)
        except ProxyTermsError:
            return None
        self.oracles = oracles
        self.reference_rows = optimum.n_row_evaluations
        self.laplace_spread = optimum.laplace_log_weight_sd
        return control

    def _chain_start(self, q: np.ndarray) -> np.ndarray:
        """Where a chain with a control variate starts: near the reference point.

        A start beyond the reference's chi-square(d) 1 - 1e-6 Mahalanobis limit (the model's
        initial point, typically) makes every draw's test read most rows until the chain
        arrives: Barker with a control variate read ~182,000 of 1e6 rows per draw for its first
        500 draws. Such a start, where the Laplace approximation puts probability below 1e-6,
        is replaced by a draw from the Laplace approximation at the reference (each chain its
        own, from its own generator); a nearer start, such as ``initvals=ref.initvals``, is
        kept. Only at a chain's first draw, with or without tuning (``tune=0`` would otherwise
        keep the whole approach to the posterior among its draws).
        """
        self._start_near_reference = False
        control = self.control
        if control is None or control.distance_sq(q) <= control.limit:
            return q
        start = control.laplace_draw(self.rng)
        return start if np.isfinite(self.oracles.setup_log_prior(start)) else control.reference

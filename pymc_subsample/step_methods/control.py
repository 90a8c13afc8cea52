"""Control variates of the Metropolis-Hastings steps: set-up pass, residual rows, re-centring.

The kernel side is :mod:`pymc_subsample.kernels.control_variates`; this module owns the state a
step needs: the reference point, the proxies' exact sums ``G`` and ``H`` (one chunked O(N) pass
when the reference point is set), the Laplace covariance, and the chain's diagnostics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
from pytensor.tensor.variable import TensorVariable

from pymc_subsample.kernels.control_variates import (
    TaylorProxy,
    laplace_covariance,
    mahalanobis_limit,
)
from pymc_subsample.model.oracles import ModelOracles

__all__ = ["CONTROL_VARIATES", "ControlVariate", "ProxyTermsError", "reference_vector"]

#: Values of ``control_variate`` and the order of their Taylor proxies.
CONTROL_VARIATES: dict[str | None, int] = {None: 0, "taylor1": 1, "taylor2": 2}


#: Rows and Laplace-sd scales of the construction-time check of the per-row Taylor terms.
PROXY_CHECK_ROWS = 50
PROXY_CHECK_SCALES = (2.0, 1.0)


class ProxyTermsError(ValueError):
    """The per-row Taylor terms PyTensor derived for this likelihood do not match its rows."""


class ControlVariate:
    """Taylor proxies around a reference point, and what they cost and show.

    Parameters
    ----------
    oracles : ModelOracles
        Compiled with ``proxy_order`` 1 or 2.
    reference : ndarray
        The reference point ``q*`` (raveled, unconstrained).
    temperature : float
        Likelihood temperature of the step (for the Laplace covariance).
    row_sums : tuple of ndarray, optional
        The rows' summed gradient and Hessian in ``q`` at ``reference`` on the current data,
        with the other variables at their current values (an automatic reference search's
        ``row_sums``); computed by a pass over the rows when not given.

    Attributes
    ----------
    reference : ndarray
        The reference point ``q*``. The proxies' own expansion point, ``proxy.reference``, is
        ``q*`` too, or ``phi(q*)`` where ``oracles.expansion`` is ``"likelihood"``: the proxies
        are then polynomials in the likelihood's parameters (``model/likelihood_parameters.py``)
        and their sums are taken in that space; the Laplace covariance stays in ``q``.
    """

    def __init__(
        self,
        oracles: ModelOracles,
        reference: np.ndarray,
        temperature: float,
        row_sums: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.oracles = oracles
        self.temperature = temperature
        self.limit = mahalanobis_limit(oracles.n_params)
        self.recenter(reference, row_sums)
        self._check_proxy_terms()
        self._initial = self._state()

    def _check_proxy_terms(self) -> None:
        """Check that the residuals shrink as the proxies' order says they must.

        With per-row Taylor terms of order k (Bardenet et al. 2017, section 7.2) the residual of
        a move of size s around the reference is O(s^(k+1)): halving s divides it by 2^(k+1).
        The terms are forward-mode derivatives PyTensor builds from the model graph; where they
        are wrong (seen on ``pm.MvNormal`` with an ``LKJCholeskyCov`` factor: the per-row
        gradients were off while their sum was right) the residuals shrink only as s, the test
        would decide on a biased estimate, and the chain sticks. Checked on the first
        ``PROXY_CHECK_ROWS`` rows, at 2 and 1 Laplace sds along one fixed direction.

        Raises
        ------
        ProxyTermsError
            If the residuals do not shrink at the proxies' order.
        """
        oracles, reference = self.oracles, self.reference
        rows = np.arange(min(PROXY_CHECK_ROWS, oracles.n_rows))
        direction = np.linalg.cholesky(self.covariance) @ np.random.default_rng(0).standard_normal(
            reference.size
        )
        largest = []
        for scale in PROXY_CHECK_SCALES:
            q_new, q_old = reference + scale * direction, reference - 0.5 * scale * direction
            residuals = self.residual_rows(q_new, q_old)(rows)
            changes = oracles.loglik_rows(q_new, rows) - oracles.loglik_rows(q_old, rows)
            largest.append(float(np.max(np.abs(residuals))))
            if scale == PROXY_CHECK_SCALES[0]:
                floor = 1e-8 * (1.0 + float(np.max(np.abs(changes))))
        if not all(np.isfinite(largest)) or largest[0] <= floor:
            return  # exact proxies (a Gaussian likelihood), or a check that cannot be made
        shrink = largest[0] / max(largest[1], 1e-300)
        order = oracles.proxy_order
        if shrink < 0.6 * 2.0 ** (order + 1):
            raise ProxyTermsError(
                f"the per-row Taylor terms PyTensor derives for this likelihood do not match its "
                f"rows: halving a move around the reference divided the residuals by "
                f"{shrink:.2g}, where order-{order} terms must divide them by about "
                f"{2 ** (order + 1)} (a forward-mode derivative of the likelihood's graph is "
                "wrong)"
            )

    def recenter(
        self, reference: np.ndarray, row_sums: tuple[np.ndarray, np.ndarray] | None = None
    ) -> int:
        """Expand around ``reference``: one chunked pass over all rows unless ``row_sums``.

        Returns the rows read.
        """
        oracles = self.oracles
        oracles.freeze_shared()
        self.reference = np.array(reference, dtype="float64")
        rows_read = 0
        if row_sums is None:
            row_sums = oracles.in_unconstrained().gradient_hessian_sums(self.reference)
            rows_read += oracles.n_rows
        if oracles.expansion == "unconstrained":
            point, (gradient_sum, hessian_sum) = self.reference, row_sums
        else:
            # The proxies' sums in the likelihood's parameters: one more pass over the rows.
            point = oracles.expansion_point(self.reference)
            gradient_sum, hessian_sum = oracles.gradient_hessian_sums(point)
            rows_read += oracles.n_rows
        self.proxy = TaylorProxy(point, gradient_sum, hessian_sum, oracles.proxy_order)
        self.covariance, self.precision, self.n_clipped = laplace_covariance(
            row_sums[1], oracles.log_prior_hessian(self.reference), self.temperature
        )
        return rows_read

    def reset(self) -> bool:
        """Return to the expansion made at construction; whether anything changed."""
        if self.proxy is self._initial[0]:
            return False
        (self.proxy, self.reference, self.covariance, self.precision, self.n_clipped, frozen) = (
            self._initial
        )
        self.oracles.set_frozen(frozen)
        return True

    def _state(self) -> tuple[Any, ...]:
        frozen = self.oracles.frozen_values()
        return (
            self.proxy,
            self.reference,
            self.covariance,
            self.precision,
            self.n_clipped,
            frozen,
        )

    def log_threshold_shift(self, q_new: np.ndarray, q_old: np.ndarray) -> float:
        """``R / T``: the proxies' exact contribution to the tempered log acceptance ratio."""
        point = self.oracles.expansion_point
        return self.proxy.difference(point(q_new), point(q_old)) / self.temperature

    def residual_rows(
        self, q_new: np.ndarray, q_old: np.ndarray
    ) -> Callable[[np.ndarray], np.ndarray]:
        """Return the test's row oracle: the residuals ``l_i - r_i`` of the rows asked for."""
        return partial(self.oracles.residual_ratio_rows, q_new, q_old, self.proxy.reference)

    def laplace_draw(self, rng: np.random.Generator) -> np.ndarray:
        """Draw from the Laplace approximation ``N(q*, covariance)``: a start for a chain."""
        return rng.multivariate_normal(self.reference, self.covariance, method="eigh")

    def distance_sq(self, q: np.ndarray) -> float:
        """``(q - q*)^T P (q - q*)``: about chi-square(d) under the Laplace approximation."""
        offset = q - self.reference
        return float(offset @ self.precision @ offset)


def reference_vector(
    reference_point: Any, vars: list[TensorVariable], initial_point: Mapping[str, Any]
) -> np.ndarray:
    """Ravel ``reference_point`` (a dict or a ``ReferencePoint``) in the order of ``vars``.

    A ``ReferencePoint`` whose ``failure`` is set (no mode, a funnel, a singular Hessian, or a
    posterior far from Gaussian there) is refused with that message: the Taylor proxies around
    it would not hold where the chain goes.
    """
    failure = getattr(reference_point, "failure", None)
    if failure is not None:
        raise ValueError(
            f"reference_point is not a usable expansion point for control variates: {failure}."
        )
    point = getattr(reference_point, "point", reference_point)
    if not isinstance(point, Mapping):
        raise TypeError(
            "reference_point must be a dict of unconstrained values keyed by value-variable "
            "names (the .point of pms.find_reference_point, or the output of pm.find_MAP), "
            f"got {type(reference_point).__name__}."
        )
    pieces = []
    for var in vars:
        name = str(var.name)
        if name not in point:
            raise ValueError(
                f"reference_point has no value for {name!r}. Pass the .point of "
                "pms.find_reference_point(...) or pm.find_MAP(), which are keyed by value-variable "
                "names (transformed variables end in '__', e.g. 'sigma_log__')."
            )
        value = np.asarray(point[name], dtype="float64")
        expected = np.shape(initial_point[name])
        if value.shape != expected:
            raise ValueError(
                f"reference_point[{name!r}] has shape {value.shape}, expected {expected}."
            )
        pieces.append(value.ravel())
    vector = np.concatenate(pieces)
    if not np.all(np.isfinite(vector)):
        raise ValueError("reference_point has non-finite values.")
    return vector

"""The sequential t-test's error and rows by dynamic programming (Korattikara et al. 2014).

Under the paper's Assumptions 1 and 2 (supplementary A) the t-statistics ``z_j`` of a
:class:`~pymc_subsample.SequentialDesign`'s stages are a Gaussian random walk (Proposition 2,
eq. 9-11) whose law depends on the proposal only through the standardised mean

    mu_std = (mu - mu_0) sqrt(N - 1) / sigma_l                                    (section 5.1)

so the test's error ``E(mu_std)`` (eq. 18: the probability of the wrong decision) and its
expected fraction of rows ``pi-bar(mu_std)`` (eq. 19) follow by dynamic programming over a grid
of ``z`` (:func:`operating_characteristics`). Over the uniform ``u`` of one MH step (``mu_0``
moves with ``log u``) they give the error in the acceptance probability ``Delta`` (eq. 6,
supplementary eq. 21) and the step's expected rows, by one-dimensional quadrature
(:func:`acceptance_error`).

The grid is uniform in ``z`` with cells of at most a third of the narrowest step's sd; each
step moves a cell's mass to the Gaussian of eq. 9-11 and bins it by exact normal CDFs, so mass
is conserved and the binning adds at most 1/108 of the step's own variance. ``docs/
architecture.md`` ("Designing the test") says where this sits in a draw.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from scipy.special import ndtr

from pymc_subsample.kernels.test_design import ProposalSample, SequentialDesign

__all__ = ["acceptance_error", "operating_characteristics"]

#: Stages the dynamic programme follows at most (its cost grows about as their square: the
#: paper's heuristic m = 600 at N = 1.95 million, 3,250 stages, takes a few seconds); a design
#: stops testing after its ``max_stages`` and reads every row.
MAX_STAGES = 10_000
#: Widest grid cell, in units of z (the first stages' steps have sd near 1).
MAX_CELL = 0.05
#: Grid cells per sd of the narrowest step: the binning adds 1/(12 CELLS_PER_SD^2) of its variance.
CELLS_PER_SD = 2.0
#: A cell whose continuing probability is below this is dropped from the programme.
NEGLIGIBLE = 1e-15
#: Quadrature nodes per side of ``P_a`` for the integral over u of eq. 21.
U_NODES = 24
#: Values of the stage-1 drift ``nu = mu_std sqrt(pi_1 / (1 - pi_1))`` at which the programme
#: tabulates E and pi-bar; beyond the last, the first stage decides (error below 1e-12).
_DRIFT_GRID_SIZE = 20


def operating_characteristics(
    design: SequentialDesign, n_rows: int, mu_std: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray]:
    """Error ``E(mu_std)`` (eq. 18) and expected fraction of rows ``pi-bar`` (eq. 19).

    Parameters
    ----------
    design : SequentialDesign
        The test.
    n_rows : int
        N.
    mu_std : array_like
        Standardised means (section 5.1); the error is symmetric in its sign. At 0 it is the
        worst case ``(1 - P(all rows)) / 2`` (eq. 20).

    Returns
    -------
    error, data_fraction : ndarray
        Of the shape of ``mu_std``.

    Examples
    --------
    A single stage of all rows is the exact test:

    >>> error, used = operating_characteristics(SequentialDesign(10, 0.05), 10, [0.0, 1.0])
    >>> error.tolist(), used.tolist()
    ([0.0, 0.0], [1.0, 1.0])
    """
    mu = np.abs(np.atleast_1d(np.asarray(mu_std, dtype=float)))
    fractions, bounds = _followed_stages(design, n_rows)
    error = np.empty(mu.size)
    used = np.empty(mu.size)
    cell = _cell_width(fractions)
    for k, value in enumerate(mu.ravel()):
        error[k], used[k] = _programme(fractions, bounds, value, cell)
    return error.reshape(mu.shape), used.reshape(mu.shape)


def acceptance_error(
    design: SequentialDesign, n_rows: int, sample: ProposalSample
) -> tuple[np.ndarray, np.ndarray]:
    """Error in the acceptance probability ``Delta`` (eq. 6/21) and expected fraction of rows.

    For each proposal, ``Delta = int_{P_a}^1 E du - int_0^{P_a} E du`` with ``E`` at
    ``mu_std(u)``, by Gauss-Legendre quadrature on each side of ``P_a`` (where ``mu_std`` changes
    sign); the rows are ``int_0^1 pi-bar(mu_std(u)) du``. ``E`` and ``pi-bar`` are tabulated
    once by :func:`operating_characteristics` over the stage-1 drift and interpolated.

    Returns
    -------
    delta, data_fraction : ndarray
        One value per proposal of ``sample``.
    """
    table = _Table.build(design, n_rows)
    offset = np.asarray(sample.offset, dtype=float)
    slope = np.asarray(sample.slope, dtype=float)
    # P_a = P(mu_std(u) > 0) = P(log u < offset / slope) = min(1, exp(offset / slope)).
    with np.errstate(over="ignore", divide="ignore"):
        accept_probability = np.minimum(1.0, np.exp(offset / slope))
    nodes, weights = np.polynomial.legendre.leggauss(U_NODES)
    nodes, weights = (nodes + 1.0) / 2.0, weights / 2.0
    delta = np.zeros(offset.size)
    used = np.zeros(offset.size)
    for low, high, sign in (
        (np.zeros_like(accept_probability), accept_probability, -1.0),
        (accept_probability, np.ones_like(accept_probability), 1.0),
    ):
        width = high - low
        u = low[:, None] + width[:, None] * nodes[None, :]
        with np.errstate(divide="ignore"):
            mu_std = offset[:, None] - slope[:, None] * np.log(u)
        error, fraction = table.lookup(np.abs(mu_std))
        delta += sign * width * (error @ weights)
        used += width * (fraction @ weights)
    return delta, used


class _Table(NamedTuple):
    """E and pi-bar of one design tabulated over the stage-1 drift, for interpolation."""

    drift_scale: float
    drifts: np.ndarray
    errors: np.ndarray
    fractions: np.ndarray
    first_fraction: float
    first_bound: float

    @classmethod
    def build(cls, design: SequentialDesign, n_rows: int) -> _Table:
        first_fraction = min(design.batch_size, n_rows) / n_rows
        first_bound = float(design.bounds(n_rows)[0])
        if first_fraction >= 1.0:
            zeros = np.zeros(2)
            return cls(1.0, np.array([0.0, 1.0]), zeros, np.ones(2), 1.0, math.inf)
        # nu = mu_std sqrt(pi_1 / (1 - pi_1)) is the mean of z_1 (eq. 10 at j = 1).
        drift_scale = math.sqrt(first_fraction / (1.0 - first_fraction))
        top = (first_bound if math.isfinite(first_bound) else 0.0) + 8.0
        drifts = top * np.linspace(0.0, 1.0, _DRIFT_GRID_SIZE) ** 2  # denser near 0
        errors, fractions = operating_characteristics(design, n_rows, drifts / drift_scale)
        return cls(drift_scale, drifts, errors, fractions, first_fraction, first_bound)

    def lookup(self, mu_std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Interpolate E and pi-bar; past the grid the first stage decides."""
        drift = mu_std * self.drift_scale
        error = np.interp(drift, self.drifts, self.errors, right=0.0)
        fraction = np.interp(drift, self.drifts, self.fractions, right=self.first_fraction)
        beyond = drift > self.drifts[-1]
        error[beyond] = ndtr(-self.first_bound - drift[beyond])
        return error, fraction


def _followed_stages(design: SequentialDesign, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the fractions ``pi_j`` and bounds of the stages the programme follows.

    The stages with a finite bound, at most ``MAX_STAGES`` of them (a design that tests longer
    is refused); the step after the last reads all rows and decides exactly.
    """
    bounds = design.bounds(n_rows)
    finite = np.flatnonzero(np.isfinite(bounds))
    n_tested = 0 if finite.size == 0 else int(finite[-1]) + 1
    if n_tested > MAX_STAGES:
        raise ValueError(
            f"the design tests {n_tested} stages; the dynamic programme follows at most "
            f"{MAX_STAGES}: give max_stages <= {MAX_STAGES} or a larger batch_size."
        )
    sizes = np.minimum(np.arange(1, n_tested + 1) * design.batch_size, n_rows)
    return sizes / n_rows, bounds[:n_tested]


def _cell_width(fractions: np.ndarray) -> float:
    if fractions.size == 0:
        return MAX_CELL
    previous = np.concatenate([[0.0], fractions[:-1]])
    step_sd = np.sqrt((fractions - previous) / (fractions * (1.0 - previous)))  # eq. 11
    return min(MAX_CELL, float(step_sd.min()) / CELLS_PER_SD)


def _programme(
    fractions: np.ndarray, bounds: np.ndarray, mu_std: float, cell: float
) -> tuple[float, float]:
    if fractions.size == 0:
        return 0.0, 1.0
    top = float(bounds.max())
    n_cells = max(1, math.ceil(2.0 * top / cell))
    return _programme_kernel(fractions, bounds, mu_std, 2.0 * top / n_cells, n_cells)


@numba.njit(cache=True)
def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@numba.njit(cache=True)
def _programme_kernel(
    fractions: np.ndarray, bounds: np.ndarray, mu_std: float, cell: float, n_cells: int
) -> tuple[float, float]:
    """Follow the continuing mass of z over the stages (eq. 9-11); return E and pi-bar.

    A cell's mass moves to ``N(m_j(z), sigma_j^2)`` (eq. 10, 11); the parts beyond ``+-G_j``
    stop (above: decide ``mu > mu_0``; below: the wrong decision for ``mu_std >= 0``, eq. 18)
    and the rest is binned into the cells inside the bounds by exact CDF differences. After the
    last followed stage the remaining mass reads all rows and decides exactly.
    """
    low_edge = -0.5 * n_cells * cell
    mass = np.zeros(n_cells)
    new_mass = np.zeros(n_cells)
    centres = np.zeros(n_cells)
    centres[:] = low_edge + cell * (np.arange(n_cells) + 0.5)
    sources = np.zeros(1)  # stage 1 starts from z_0 = 0 with all the mass
    source_mass = np.ones(1)
    error = 0.0
    used = 0.0
    previous = 0.0
    edges = np.zeros(n_cells + 1)
    for j in range(fractions.size):
        fraction = fractions[j]
        bound = bounds[j]
        sd = math.sqrt((fraction - previous) / (fraction * (1.0 - previous)))  # eq. 11
        drift = (
            mu_std
            * (fraction - previous)
            / (1.0 - previous)
            / math.sqrt(fraction * (1.0 - fraction))
        )
        ratio = math.sqrt(previous * (1.0 - fraction) / (fraction * (1.0 - previous)))
        new_mass[:] = 0.0
        stopped = 0.0
        for a in range(sources.size):
            p = source_mass[a]
            if p < NEGLIGIBLE:
                continue
            centre = drift + ratio * sources[a]  # eq. 10
            upper = 1.0 - _normal_cdf((bound - centre) / sd)
            lower = _normal_cdf((-bound - centre) / sd)
            error += p * lower
            stopped += p * (upper + lower)
            first = max(0, math.floor((centre - 7.0 * sd - low_edge) / cell))
            last = min(n_cells - 1, math.floor((centre + 7.0 * sd - low_edge) / cell))
            # CDF at each cell edge inside the bounds, once: a cell gets the difference.
            for b in range(first, last + 2):
                edge = min(max(low_edge + b * cell, -bound), bound)
                edges[b] = _normal_cdf((edge - centre) / sd)
            for b in range(first, last + 1):
                new_mass[b] += p * (edges[b + 1] - edges[b])
        used += fraction * stopped
        mass[:] = new_mass
        if j == 0:
            sources = centres
        source_mass = mass
        previous = fraction
        if mass.sum() < NEGLIGIBLE:
            break
    used += mass.sum()  # undecided after the followed stages: all rows, the exact decision
    return error, used

"""Optimal design of the sequential t-test (Korattikara, Chen and Welling 2014, section 5.2, D).

The test of Algorithm 1 looks at ``n_j = j m`` rows at stage j and stops when the t-statistic
``z_j = (l-bar_j - mu_0) / s_j`` leaves ``[-G_j, G_j]``. Under the paper's Assumptions 1 and 2
(supplementary A) the ``z_j`` are a Gaussian random walk (Proposition 2, eq. 9-11) whose law
depends on the proposal only through the standardised mean

    mu_std = (mu - mu_0) sqrt(N - 1) / sigma_l                                    (section 5.1)

so the test's error ``E(mu_std)`` (eq. 18: the probability of the wrong decision) and its
expected fraction of rows ``pi-bar(mu_std)`` (eq. 19) follow by dynamic programming over a grid
of ``z``. Over the uniform ``u`` of one MH step (``mu_0`` moves with ``log u``) they give the
error in the acceptance probability ``Delta`` (eq. 6, supplementary eq. 21) and the step's
expected rows, by one-dimensional quadrature. A design is a first batch ``m``, a per-test
error ``epsilon`` (``G_1 = Phi^-1(1 - epsilon)``), the Wang-Tsiatis shape ``alpha`` of the bound
sequence ``G_j = G_1 j^(0.5 - alpha)`` (supplementary D; 0.5 is Pocock's constant bound, 1
O'Brien-Fleming's) and at most ``max_stages`` stages, after which the test reads every row and
decides exactly. :func:`design_test` searches them for the fewest expected rows with the error
bounded: the worst case ``E(0)`` (eq. 8, no trial run) or the mean ``|Delta|`` over
``(mu, sigma_l)`` pairs seen while tuning (eq. 7).

The grid is uniform in ``z`` with cells of at most a third of the narrowest step's sd; each
step moves a cell's mass to the Gaussian of eq. 9-11 and bins it by exact normal CDFs, so mass
is conserved and the binning adds at most 1/108 of the step's own variance. ``docs/
architecture.md`` ("Designing the sequential test") says where this sits in a draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np
from scipy.special import ndtr, ndtri

__all__ = [
    "DesignChoice",
    "OptimalDesign",
    "ProposalSample",
    "SequentialDesign",
    "acceptance_error",
    "default_batch_sizes",
    "design_test",
    "operating_characteristics",
]

#: Stages the dynamic programme follows at most (its cost grows about as their square: the
#: paper's heuristic m = 600 at N = 1.95 million, 3,250 stages, takes a few seconds); a design
#: stops testing after its ``max_stages`` and reads every row.
MAX_STAGES = 10_000
#: Stages tested by the designs :func:`design_test` proposes (a design's cost grows with them).
DESIGN_STAGES = 50
#: The smallest first batch :func:`design_test` searches by default (Assumption 1, a Gaussian
#: batch mean, wants hundreds of rows) ...
SMALLEST_BATCH = 100
#: ... and the largest, as a share of N: the fraction of rows a test must read scales with the
#: proposal's standardised mean, not with N, so the batches must scale with N too.
LARGEST_BATCH_SHARE = 0.1
#: Widest grid cell, in units of z (the first stages' steps have sd near 1).
MAX_CELL = 0.05
#: Grid cells per sd of the narrowest step: the binning adds 1/(12 CELLS_PER_SD^2) of its variance.
CELLS_PER_SD = 2.0
#: A cell whose continuing probability is below this is dropped from the programme.
NEGLIGIBLE = 1e-15
#: Bisections of log epsilon in [log 1e-6, log 0.45]: epsilon within a factor 1.1.
BISECTIONS = 7
#: Quadrature nodes per side of ``P_a`` for the integral over u of eq. 21.
U_NODES = 24
#: Values of the stage-1 drift ``nu = mu_std sqrt(pi_1 / (1 - pi_1))`` at which the programme
#: tabulates E and pi-bar; beyond the last, the first stage decides (error below 1e-12).
_DRIFT_GRID_SIZE = 20


class SequentialDesign(NamedTuple):
    """A design of the sequential t-test: first batch, error per test, bound shape, stages.

    Parameters
    ----------
    batch_size : int
        The paper's m: rows per stage, ``n_j = j m``.
    error_tolerance : float
        The paper's epsilon at the first stage, in (0, 0.5): ``G_1 = Phi^-1(1 - epsilon)``.
    shape : float, default 0.5
        Wang-Tsiatis ``alpha`` in [0.5, 1]: ``G_j = G_1 j^(0.5 - alpha)`` (0.5: Pocock).
    max_stages : int or None, default None
        After this many stages without a decision the test reads every row and decides
        exactly; None tests at every stage until all rows are read (the paper's Algorithm 1).
    """

    batch_size: int
    error_tolerance: float
    shape: float = 0.5
    max_stages: int | None = None

    def checked(self) -> SequentialDesign:
        """Return the design after checking its settings; raise ValueError on a bad one."""
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int | np.integer):
            raise ValueError(f"batch_size must be an integer >= 2, got {self.batch_size!r}.")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be an integer >= 2, got {self.batch_size!r}.")
        if not 0.0 < self.error_tolerance < 0.5:
            raise ValueError(
                f"error_tolerance must be in (0, 0.5), got {self.error_tolerance!r}: a design's "
                "tolerance is the first stage's error (0 is the exact test: error_tolerance=0)."
            )
        if not 0.5 <= self.shape <= 1.0:
            raise ValueError(
                f"shape must be in [0.5, 1] (Wang-Tsiatis alpha: 0.5 Pocock, 1 O'Brien-Fleming), "
                f"got {self.shape!r}."
            )
        if self.max_stages is not None and (
            isinstance(self.max_stages, bool)
            or not isinstance(self.max_stages, int | np.integer)
            or self.max_stages < 1
        ):
            raise ValueError(
                f"max_stages must be None or an integer >= 1, got {self.max_stages!r}."
            )
        return self

    def n_stages(self, n_rows: int) -> int:
        """Stages of ``batch_size`` rows until all N rows are read (the last may be shorter)."""
        return -(-n_rows // self.batch_size)

    def bounds(self, n_rows: int) -> np.ndarray:
        """``G_j`` for every stage; +inf past ``max_stages`` and at the last (all rows, exact).

        Examples
        --------
        >>> SequentialDesign(100, 0.05, shape=1.0).bounds(400).round(3).tolist()
        [1.645, 1.163, 0.95, inf]
        """
        n_stages = self.n_stages(n_rows)
        stage = np.arange(1, n_stages + 1, dtype=float)
        bounds = ndtri(1.0 - self.error_tolerance) * stage ** (0.5 - self.shape)
        bounds[-1] = np.inf
        if self.max_stages is not None:
            bounds[self.max_stages :] = np.inf
        return bounds

    def stage_tolerances(self, n_rows: int) -> np.ndarray:
        """Per-stage error ``epsilon_j = Phi(-G_j)``: 0 where the test may not stop."""
        return ndtr(-self.bounds(n_rows))


class OptimalDesign(NamedTuple):
    """Ask :class:`~pymc_subsample.AusterityMH` to design its test (section 5.2, supplementary D).

    Parameters
    ----------
    max_error : float, default 0.01
        The bound on the error: the worst case ``E(0)`` (eq. 8) or the mean error in the
        acceptance probability ``|Delta|`` over the tuning proposals (eq. 7).
    kind : {"average", "worst"}, default "average"
        ``"worst"`` designs before sampling without a trial run; ``"average"`` designs at the
        end of tuning from proposals at the last ``n_proposals`` tuning points (tuning itself
        runs the step's batch with ``error_tolerance=0.001``), and each chain designs its own.
    shapes : tuple of float, default (0.5, 0.75, 1.0)
        Wang-Tsiatis shapes searched (0.5 is Pocock's constant bound).
    batch_sizes : tuple of int, optional
        First batches searched (default 100, 200, 500, 1,000, ... up to N / 10).
    n_proposals : int, default 100
        Proposals the average design is computed from (the paper's 100 samples).
    rows_per_proposal : int, default 200,000
        Rows on which each proposal's ``mu`` and ``sigma_l`` are estimated (all N when fewer).
    """

    max_error: float = 0.01
    kind: str = "average"
    shapes: tuple[float, ...] = (0.5, 0.75, 1.0)
    batch_sizes: tuple[int, ...] | None = None
    n_proposals: int = 100
    rows_per_proposal: int = 200_000

    def checked(self) -> OptimalDesign:
        """Return the request after checking it; raise ValueError on a bad one."""
        if not 0.0 < self.max_error < 0.5:
            raise ValueError(f"max_error must be in (0, 0.5), got {self.max_error!r}.")
        if self.kind not in ("average", "worst"):
            raise ValueError(f"kind must be 'average' or 'worst', got {self.kind!r}.")
        if not self.shapes or not all(0.5 <= shape <= 1.0 for shape in self.shapes):
            raise ValueError(f"shapes must be in [0.5, 1], got {self.shapes!r}.")
        for name in ("n_proposals", "rows_per_proposal"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 2:
                raise ValueError(f"{name} must be an integer >= 2, got {value!r}.")
        return self


class ProposalSample(NamedTuple):
    """``(mu, sigma_l)`` of proposals (section 5.2), as eq. 21 needs them.

    For each proposal, ``mu_std(u) = offset - slope log u`` with ``offset = (mu + T psi / N)
    sqrt(N - 1) / sigma_l`` and ``slope = T sqrt(N - 1) / (N sigma_l)``, where ``psi`` is the log
    prior and proposal ratio and T the temperature (``mu_0 = T (log u - psi) / N``, eq. 2).
    """

    offset: np.ndarray
    slope: np.ndarray

    @classmethod
    def from_estimates(
        cls,
        mean: np.ndarray,
        row_sd: np.ndarray,
        log_prior_proposal_ratio: np.ndarray,
        n_rows: int,
        temperature: float = 1.0,
    ) -> ProposalSample:
        """Build from each proposal's mean ``l``, sd of the ``l_i`` and ``psi``."""
        scale = math.sqrt(n_rows - 1) / np.asarray(row_sd, dtype=float)
        offset = np.asarray(mean) + temperature * np.asarray(log_prior_proposal_ratio) / n_rows
        return cls(offset * scale, temperature * scale / n_rows)


class DesignChoice(NamedTuple):
    """The design :func:`design_test` chose, with what the dynamic programme predicts for it."""

    design: SequentialDesign
    #: ``"worst"`` (bounds E(0), eq. 8) or ``"average"`` (bounds the mean ``|Delta|``, eq. 7).
    kind: str
    #: The bounded error: E(0) for the worst case, the mean ``|Delta|`` for the average design.
    predicted_error: float
    #: Expected rows per test: at mu_std = 0 (worst case) or averaged over the sample and u.
    predicted_rows: float
    #: The bound the design was asked to meet.
    max_error: float


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


def design_test(
    n_rows: int,
    max_error: float,
    sample: ProposalSample | None = None,
    batch_sizes: Sequence[int] | None = None,
    shapes: Sequence[float] = (0.5, 0.75, 1.0),
    max_stages: int = DESIGN_STAGES,
) -> DesignChoice:
    """Find the design with the fewest expected rows whose error is at most ``max_error``.

    Without ``sample`` this is the worst-case design of eq. 8: ``E(0) <= max_error``, rows
    ``pi-bar(0)``. With it, the average design of eq. 7/35: the mean ``|Delta|`` over the
    sample at most ``max_error``, rows averaged over the sample and u. For each first batch and
    shape the error grows with epsilon and the rows shrink, so epsilon is found by bisection
    (on its logarithm, from 1e-6 to 0.45) and the batch and shape by grid search.

    Parameters
    ----------
    n_rows : int
        N.
    max_error : float
        The paper's ``Delta*`` (or ``Delta_max``), in (0, 0.5).
    sample : ProposalSample, optional
        ``(mu, sigma_l)`` of proposals seen while tuning, for the average design.
    batch_sizes : sequence of int, optional
        First batches to try (default 100, 200, 500, 1,000, ... up to N / 10, from
        ``default_batch_sizes``).
    shapes : sequence of float, default (0.5, 0.75, 1.0)
        Wang-Tsiatis shapes to try (0.5 is Pocock).
    max_stages : int, default 50
        Stages tested at most before all rows are read.

    Returns
    -------
    DesignChoice
    """
    if not 0.0 < max_error < 0.5:
        raise ValueError(f"max_error must be in (0, 0.5), got {max_error!r}.")
    candidates = [
        m
        for m in (batch_sizes if batch_sizes is not None else default_batch_sizes(n_rows))
        if 2 <= m < n_rows
    ]
    if not candidates:
        raise ValueError(
            f"no first batch in {batch_sizes!r} is between 2 and N - 1 = {n_rows - 1}."
        )
    best: DesignChoice | None = None
    # Middle batches first: a good design found early lets the others stop at their first
    # evaluation (their fewest rows, at the largest epsilon, already lose).
    for batch_size in sorted(candidates, key=lambda m: abs(math.log(m / 500))):
        for shape in shapes:
            beat = math.inf if best is None else best.predicted_rows
            choice = _best_tolerance(n_rows, max_error, sample, batch_size, shape, max_stages, beat)
            if choice is not None and choice.predicted_rows < beat:
                best = choice
    if best is None:
        raise ValueError(
            f"no design keeps the error below {max_error}: use a larger max_error or the exact "
            "test (error_tolerance=0)."
        )
    return best


def default_batch_sizes(n_rows: int) -> tuple[int, ...]:
    """First batches ``design_test`` searches: 100, 200, 500, 1,000, ... up to N / 10.

    Under the paper's Assumptions 1 and 2 a test's error and expected *fraction* of rows
    depend on the proposal through ``mu_std`` and on the design through the stage fractions
    ``pi_j = j m / N`` (eq. 9-11), and a random walk tuned to a fixed acceptance rate has the
    same ``mu_std`` at every N. So the right first batch is a share of N: at N = 50,000 the
    grid is 100 to 5,000; at the paper's N = 1.95 million it reaches 100,000.

    Examples
    --------
    >>> default_batch_sizes(50_000)
    (100, 200, 500, 1000, 2000, 5000)
    >>> default_batch_sizes(500)
    (100,)
    """
    largest = max(SMALLEST_BATCH, LARGEST_BATCH_SHARE * n_rows)
    sizes: list[int] = []
    decade = SMALLEST_BATCH
    while decade <= largest:
        sizes.extend(m for m in (decade, 2 * decade, 5 * decade) if m <= largest)
        decade *= 10
    return tuple(sizes)


def _best_tolerance(
    n_rows: int,
    max_error: float,
    sample: ProposalSample | None,
    batch_size: int,
    shape: float,
    max_stages: int,
    rows_to_beat: float = math.inf,
) -> DesignChoice | None:
    """Bisect log epsilon for the largest epsilon whose error meets ``max_error``.

    Rows fall as epsilon grows, so a design that reads ``rows_to_beat`` or more at the largest
    epsilon cannot win and is dropped after that one evaluation (None).
    """

    def evaluate(log_tolerance: float) -> tuple[SequentialDesign, float, float]:
        design = SequentialDesign(batch_size, math.exp(log_tolerance), shape, max_stages)
        if sample is None:
            error, fraction = operating_characteristics(design, n_rows, 0.0)
            return design, float(error[0]), float(fraction[0]) * n_rows
        delta, fraction = acceptance_error(design, n_rows, sample)
        return design, float(np.mean(np.abs(delta))), float(np.mean(fraction)) * n_rows

    low, high = math.log(1e-6), math.log(0.45)
    kind = "worst" if sample is None else "average"
    top = evaluate(high)
    if top[2] >= rows_to_beat:
        return None
    if top[1] <= max_error:
        return DesignChoice(top[0], kind, top[1], top[2], max_error)
    design, error, rows = evaluate(low)
    if error > max_error:
        return None
    feasible = DesignChoice(design, kind, error, rows, max_error)
    for _ in range(BISECTIONS):
        middle = (low + high) / 2.0
        design, error, rows = evaluate(middle)
        if error <= max_error:
            low, feasible = middle, DesignChoice(design, kind, error, rows, max_error)
        else:
            high = middle
    return feasible


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

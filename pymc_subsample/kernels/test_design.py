"""Designs of the sequential t-test (Korattikara, Chen and Welling 2014, section 5.2, D).

The test of Algorithm 1 looks at ``n_j = j m`` rows at stage j and stops when the t-statistic
``z_j = (l-bar_j - mu_0) / s_j`` leaves ``[-G_j, G_j]``. A design (:class:`SequentialDesign`) is
a first batch ``m``, a per-test error ``epsilon`` (``G_1 = Phi^-1(1 - epsilon)``), the
Wang-Tsiatis shape ``alpha`` of the bound sequence ``G_j = G_1 j^(0.5 - alpha)``
(supplementary D; 0.5 is Pocock's constant bound, 1 O'Brien-Fleming's) and at most
``max_stages`` stages, after which the test reads every row and decides exactly.
:class:`OptimalDesign` asks a step to find the design with the fewest expected rows whose error
is bounded, for the worst case or on average over proposals seen while tuning
(:class:`ProposalSample`); :class:`DesignChoice` is what was found.

A design's error and expected rows are ``kernels/design_programme.py``'s dynamic programme; the
search is ``kernels/design_search.py``. ``docs/architecture.md`` ("Designing the test") says
where this sits in a draw.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import ndtr, ndtri

__all__ = ["DesignChoice", "OptimalDesign", "ProposalSample", "SequentialDesign"]


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
    """The design :func:`~pymc_subsample.design_test` chose, with what the programme predicts."""

    design: SequentialDesign
    #: ``"worst"`` (bounds E(0), eq. 8) or ``"average"`` (bounds the mean ``|Delta|``, eq. 7).
    kind: str
    #: The bounded error: E(0) for the worst case, the mean ``|Delta|`` for the average design.
    predicted_error: float
    #: Expected rows per test: at mu_std = 0 (worst case) or averaged over the sample and u.
    predicted_rows: float
    #: The bound the design was asked to meet.
    max_error: float

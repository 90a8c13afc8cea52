"""The search for the sequential t-test's design (Korattikara et al. 2014, section 5.2, D).

:func:`design_test` finds the :class:`~pymc_subsample.SequentialDesign` with the fewest
expected rows whose error is bounded: the worst case ``E(0)`` (eq. 8, no trial run) or the mean
``|Delta|`` over ``(mu, sigma_l)`` pairs seen while tuning (eq. 7), both predicted by the
dynamic programme of ``kernels/design_programme.py``. ``docs/architecture.md`` ("Designing the
test") says where this sits in a draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pymc_subsample.kernels.design_programme import acceptance_error, operating_characteristics
from pymc_subsample.kernels.test_design import DesignChoice, ProposalSample, SequentialDesign

__all__ = ["default_batch_sizes", "design_test"]

#: Stages tested by the designs :func:`design_test` proposes (a design's cost grows with them).
DESIGN_STAGES = 50
#: The smallest first batch :func:`design_test` searches by default (Assumption 1, a Gaussian
#: batch mean, wants hundreds of rows) ...
SMALLEST_BATCH = 100
#: ... and the largest, as a share of N: the fraction of rows a test must read scales with the
#: proposal's standardised mean, not with N, so the batches must scale with N too.
LARGEST_BATCH_SHARE = 0.1
#: Bisections of log epsilon in [log 1e-6, log 0.45]: epsilon within a factor 1.1.
BISECTIONS = 7


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

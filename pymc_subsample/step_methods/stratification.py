"""Whether a step's test reads the rows by group, and how many rows per stratum.

Where the rows read a table of group parameters (``model/grouped_rows.py``), the sequential
t-test samples the rows by group (``kernels/stratified.py``; ``docs/architecture.md``,
"Stratified tests"): groups of at most :data:`WHOLE_GROUP_ROWS` rows are read whole at every
test, the others are pooled by size class, and each class gets ``rows_per_stratum`` rows at
the first stage. The Hamiltonian trajectories' gradient reads more groups whole (its own
strata, ``StepStrata.gradient``, up to :func:`gradient_whole_size`): its noise, unlike a
test's, is paid at every leapfrog step.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pymc_subsample.kernels.stratified import Strata, build_strata
from pymc_subsample.step_methods.contracts import StepView

__all__ = [
    "GRADIENT_WHOLE_ROWS",
    "MIN_STRATUM_ROWS",
    "WHOLE_GROUP_ROWS",
    "StepStrata",
    "gradient_whole_size",
    "make_strata",
    "rows_per_stratum",
]

#: Groups of at most this many rows are read whole at every test: a small group's effect
#: moves by its prior's scale, so its rows' residuals are large and vary, and reading them
#: costs little. Measured on a 200-group logistic regression with 2e5 rows (Dirichlet(0.7)
#: group shares): 16 to 50 gave standard errors of 0.1 to 0.4 nats from 640 to 1,300 rows.
WHOLE_GROUP_ROWS = 16


#: The trajectories' gradient reads whole the smallest groups whose rows number at most this
#: in all (the default minibatch before tuning sizes it, ``TRAJECTORY_GRADIENT_ROWS``). A
#: sampled group's remainders add noise of about ``N_sampled / (m n_g^2)`` in the mass's
#: coordinates (its rows' remainders are ``O(1 / n_g)`` each, sampled at ``m n_g / N_sampled``
#: rows), so the smallest sampled groups carry it. Measured on a centred 100-group Poisson
#: model with 1e5 rows (``AusterityMH()``, 400 + 400 draws): groups up to 16 rows whole
#: (28 rows), step size 0.027, 60 leapfrog steps, 1.5 million gradient rows per draw; up to
#: 64 (414 rows), 0.17, 9.6 and 104,000; up to 256 (3,076 rows), 0.26, 6.7 and 63,000.
GRADIENT_WHOLE_ROWS = 2_000


class StepStrata(NamedTuple):
    """The rows by group for a step's test and for its trajectories' gradient."""

    #: The test's strata (None: the test samples rows uniformly).
    test: Strata | None
    #: The gradient's strata: the test's small groups and more read whole (None with ``test``).
    gradient: Strata | None


def make_strata(step: StepView) -> StepStrata:
    """Return the strata of ``step``'s rows for its test and its gradient (None: uniformly).

    The test's are None where the test does not read strata
    (``AcceptanceTest.reads_strata``), decides exactly, or the rows read no group table; where
    the groups are so small that reading the small ones whole would cost a quarter of the rows
    at every draw; and where every group is sampled (none of at most ``WHOLE_GROUP_ROWS``
    rows) and the proposal is the independent one: the reference search measured the Laplace
    approximation close, so the residuals are small wherever the chain goes, and the uniform
    test keeps the fused draw (``docs/architecture.md``, "The fused draw"), three times
    cheaper per draw. The gradient's exist with the test's and read whole the groups up to
    :func:`gradient_whole_size`.
    """
    none = StepStrata(None, None)
    if not step.test.reads_strata or step.test.exact(step):
        return none
    groups = step.oracles.row_groups()
    if groups is None:
        return none
    strata = build_strata(groups, WHOLE_GROUP_ROWS)
    first_stage = rows_per_stratum(strata, step.batch_size) * strata.n_sampled
    if strata.whole_rows.size + first_stage > step.n_rows / 4:
        return none
    if strata.whole_rows.size == 0 and step.proposal_kind == "independent":
        return none
    whole_size = gradient_whole_size(np.bincount(groups), GRADIENT_WHOLE_ROWS)
    gradient = strata if whole_size <= WHOLE_GROUP_ROWS else build_strata(groups, whole_size)
    return StepStrata(strata, gradient)


def gradient_whole_size(counts: np.ndarray, budget: int) -> int:
    """Return the largest group size whose groups and all smaller ones have at most ``budget`` rows.

    At least :data:`WHOLE_GROUP_ROWS`, so that the gradient reads whole every group the test
    does.

    Examples
    --------
    >>> gradient_whole_size(np.array([3, 40, 40, 100, 2_000]), budget=200)
    100
    >>> gradient_whole_size(np.array([3, 40, 40, 100, 2_000]), budget=50)
    16
    """
    counts = np.asarray(counts)
    sizes = np.sort(counts[counts > 0])
    rows_up_to = np.cumsum(sizes)
    # The rows of every group of at most sizes[k] rows: the cumulative sum at the last
    # group of that size.
    last_of_size = np.searchsorted(sizes, sizes, side="right") - 1
    affordable = sizes[rows_up_to[last_of_size] <= budget]
    return max(WHOLE_GROUP_ROWS, int(affordable.max()) if affordable.size else 0)


#: The fewest rows a sampled stratum gets at a test's first stage: its sample variance then
#: has 15 degrees of freedom or more (``kernels/stratified.py``).
MIN_STRATUM_ROWS = 16


def rows_per_stratum(strata: Strata, batch_size: int) -> int:
    """Return the first stage's rows per sampled stratum: the batch spread over them."""
    return max(MIN_STRATUM_ROWS, math.ceil(batch_size / max(strata.n_sampled, 1)))

"""Whether a step's test reads the rows by group, and how many rows per stratum.

Where the rows read a table of group parameters (``model/grouped_rows.py``), the sequential
t-test samples the rows by group (``kernels/stratified.py``; ``docs/architecture.md``,
"Stratified tests"): groups of at most :data:`WHOLE_GROUP_ROWS` rows are read whole at every
test, the others are pooled by size class, and each class gets ``rows_per_stratum`` rows at
the first stage.
"""

from __future__ import annotations

import math

from pymc_subsample.kernels.stratified import Strata, build_strata
from pymc_subsample.step_methods.contracts import StepView

__all__ = ["MIN_STRATUM_ROWS", "WHOLE_GROUP_ROWS", "make_strata", "rows_per_stratum"]

#: Groups of at most this many rows are read whole at every test: a small group's effect
#: moves by its prior's scale, so its rows' residuals are large and vary, and reading them
#: costs little. Measured on a 200-group logistic regression with 2e5 rows (Dirichlet(0.7)
#: group shares): 16 to 50 gave standard errors of 0.1 to 0.4 nats from 640 to 1,300 rows.
WHOLE_GROUP_ROWS = 16


def make_strata(step: StepView) -> Strata | None:
    """Return the strata of ``step``'s rows, or None where its test samples rows uniformly.

    None where the test does not read strata (``AcceptanceTest.reads_strata``), decides
    exactly, or the rows read no group table; where the groups are so small that reading
    the small ones whole would cost a quarter of the rows at every draw; and where every group
    is sampled (none of at most ``WHOLE_GROUP_ROWS`` rows) and the proposal is the independent
    one: the reference search measured the Laplace approximation close, so the residuals are
    small wherever the chain goes, and the uniform test keeps the fused draw
    (``docs/architecture.md``, "The fused draw"), three times cheaper per draw.
    """
    if not step.test.reads_strata or step.test.exact(step):
        return None
    groups = step.oracles.row_groups()
    if groups is None:
        return None
    strata = build_strata(groups, WHOLE_GROUP_ROWS)
    first_stage = rows_per_stratum(strata, step.batch_size) * strata.n_sampled
    if strata.whole_rows.size + first_stage > step.n_rows / 4:
        return None
    if strata.whole_rows.size == 0 and step.proposal_kind == "independent":
        return None
    return strata


#: The fewest rows a sampled stratum gets at a test's first stage: its sample variance then
#: has 15 degrees of freedom or more (``kernels/stratified.py``).
MIN_STRATUM_ROWS = 16


def rows_per_stratum(strata: Strata, batch_size: int) -> int:
    """Return the first stage's rows per sampled stratum: the batch spread over them."""
    return max(MIN_STRATUM_ROWS, math.ceil(batch_size / max(strata.n_sampled, 1)))

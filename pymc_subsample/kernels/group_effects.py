"""One Metropolis-Hastings test per group: a sweep over a hierarchy's group effects.

Given every other variable, a hierarchy's group effects ``x_g`` are independent, and group g's
conditional reads only its own rows (``model/group_effects.py``):

    log pi(x_g | rest) = log p(x_g | rest) + L_g(x_g),   L_g = sum_{i in g} F(c_g(x_g), row_i),

with ``c_g`` the group's cells (the likelihood's group parameters). A sweep proposes a new
``x_g`` for every group at once and accepts or rejects each on its own test, which is a
product of independent Metropolis-Hastings kernels, one per conditional: a Gibbs block.

**Proposal.** A Newton step on a quadratic model of the conditional: the prior's own gradient
and Hessian in ``x_g``, and the likelihood's second-order expansion in the cells around the
reference cells ``c_r`` (exact sums over the group's rows: ``s_g``, ``H_g``), taken through the
cells' Jacobian ``J``:

    grad = grad log p + J^T (s_g + H_g (c - c_r)),   P = -(Hess log p + J^T H_g J),
    x' ~ t_nu(x + P^-1 grad, P^-1)

(``P`` with its eigenvalues' magnitudes, floored; a Student-t with :data:`PROPOSAL_DF` degrees
of freedom). Where the conditional is Gaussian the step lands on its mode with its covariance
whatever ``x``: close to an independence sampler from the conditional. The reverse proposal is
built at ``x'`` the same way (Metropolis-Hastings with an asymmetric proposal).

**Test.** A group of at most ``batch_size`` rows is decided exactly on all its rows. A larger
group reads ``batch_size`` rows drawn with replacement and estimates the sum of its rows'
residuals ``d_i = l_i - t_i``, ``l_i = F_i(c') - F_i(c)`` and ``t_i`` the difference of the
rows' second-order Taylor proxies around ``c_r``, whose sum over the group is known exactly
(the difference estimator of Quiroz et al. 2019, eq. 9, per group), and decides by the
sequential t-test of Korattikara et al. (2014) or the minibatch Barker test of Seita et al.
(2018) with the group as the population (``kernels/group_tests.py``); a group the test is not
sure of reads all its rows and is decided exactly. ``docs/architecture.md``, "Group effects".
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from pymc_subsample.kernels.group_newton import (
    PRECISION_FLOOR,
    PROPOSAL_DF,
    cell_model_derivatives,
    newton_gaussian,
    proposal_log_density,
    symmetric_eigen,
)
from pymc_subsample.kernels.group_tests import GroupTest, exact_decisions, staged_decisions

__all__ = [
    "PRECISION_FLOOR",
    "PROPOSAL_DF",
    "DecisionCounts",
    "GroupDecisions",
    "GroupParts",
    "GroupQuadratic",
    "GroupRows",
    "GroupSweepInfo",
    "SharedMoveInfo",
    "decide_on_rows",
    "group_effects_sweep",
    "group_rows",
    "model_derivatives",
    "draw_proposal",
    "newton_gaussian",
    "proposal_log_density",
    "symmetric_eigen",
]


class GroupParts(NamedTuple):
    """The data-free parts of a factor at one point (``model/group_effects.py``, ``parts``)."""

    prior: np.ndarray  # (G,)
    gradient: np.ndarray  # (G, k)
    hessian: np.ndarray  # (G, k, k)
    cells: np.ndarray  # (G, c)
    jacobian: np.ndarray  # (G, c, k)
    tables: tuple[np.ndarray, ...]  # every gather's (G_k, c_k)


class GroupQuadratic(NamedTuple):
    """The likelihood's second-order expansion in each group's cells, summed over its rows."""

    reference_cells: np.ndarray  # (G, c)
    gradient: np.ndarray  # (G, c)
    hessian: np.ndarray  # (G, c, c)

    def change(self, groups: np.ndarray, old: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Return the expansion's difference between cells ``new`` and ``old`` of ``groups``."""
        reference, hessian = self.reference_cells[groups], self.hessian[groups]
        a, b = old - reference, new - reference
        # b'Hb - a'Ha = (b - a)' H (b + a), H symmetric.
        moved = np.matmul(hessian, (b + a)[:, :, None])[:, :, 0]
        return ((new - old) * (self.gradient[groups] + 0.5 * moved)).sum(axis=1)


class GroupRows(NamedTuple):
    """A factor's rows by group: ``order[starts[g]:starts[g + 1]]`` are group g's rows."""

    order: np.ndarray
    starts: np.ndarray
    whole: np.ndarray  # (G,) bool: groups decided on all their rows
    whole_rows: np.ndarray  # their rows, concatenated
    whole_groups: np.ndarray  # the group of each of those rows

    @property
    def sizes(self) -> np.ndarray:
        """Rows per group."""
        return np.diff(self.starts)

    def rows_of(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All rows of ``groups``, concatenated, and the group of each."""
        sizes = self.sizes[groups]
        total = int(sizes.sum())
        if total == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        owner = np.repeat(np.arange(groups.size), sizes)
        offset = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.order[self.starts[groups][owner] + offset], groups[owner]


def group_rows(row_groups: np.ndarray, n_groups: int, batch_size: int) -> GroupRows:
    """Sort the rows by group (once per data) and list the groups read whole."""
    order = np.argsort(row_groups, kind="stable").astype(np.int64)
    counts = np.bincount(row_groups, minlength=n_groups)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    whole = counts <= batch_size
    layout = GroupRows(order, starts, whole, np.zeros(0, np.int64), np.zeros(0, np.int64))
    rows, groups = layout.rows_of(np.flatnonzero(whole))
    return layout._replace(whole_rows=rows, whole_groups=groups)


class GroupSweepInfo(NamedTuple):
    """What one sweep did; the field names are the step's stat names."""

    #: Rows read by all the sweep's tests.
    n_data: int
    #: Groups whose proposal was accepted.
    n_accepted: int
    #: Groups decided on all their rows: the small ones, and those whose test was not confident.
    n_full_groups: int
    #: Groups whose proposal or rows gave a non-finite value (rejected).
    n_nonfinite: int


def draw_proposal(
    rng: np.random.Generator, mean: np.ndarray, vectors: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """Draw each group's Student-t proposal (a Gaussian draw scaled by sqrt(nu / chi2_nu))."""
    n_groups = mean.shape[0]
    noise = rng.standard_normal(mean.shape) * np.sqrt(
        PROPOSAL_DF / rng.chisquare(PROPOSAL_DF, size=(n_groups, 1))
    )
    return mean + np.matmul(vectors, (noise / np.sqrt(values))[:, :, None])[:, :, 0]


def model_derivatives(parts: GroupParts, quadratic: GroupQuadratic) -> tuple[Any, Any]:
    """Return the quadratic model's gradient and Hessian in each group's effects (module doc)."""
    contiguous = np.ascontiguousarray
    return cell_model_derivatives(
        contiguous(parts.gradient, dtype=np.float64),
        contiguous(parts.hessian, dtype=np.float64),
        contiguous(parts.cells, dtype=np.float64),
        contiguous(parts.jacobian, dtype=np.float64),
        contiguous(quadratic.reference_cells, dtype=np.float64),
        contiguous(quadratic.gradient, dtype=np.float64),
        contiguous(quadratic.hessian, dtype=np.float64),
    )


#: ``(old, new, rows, groups, residual) -> values``: the rows' log-likelihood differences
#: ``l_i`` between the parts' cells, or with ``residual`` the residuals ``l_i - t_i``.
RowTerms = Callable[[GroupParts, GroupParts, np.ndarray, np.ndarray, bool], np.ndarray]


class SharedMoveInfo(NamedTuple):
    """What one move of the shared coefficients did; the field names are the step's stats."""

    #: Rows read by the move's test.
    shared_n_data: int
    #: Whether the move was accepted.
    shared_accepted: bool
    #: Whether the test read every row (it was not confident on its stratified sample).
    shared_full_data: bool


class DecisionCounts(NamedTuple):
    """What a sweep's decisions read and found (``GroupSweepInfo``'s fields but the accepted)."""

    n_data: int
    n_full_groups: int
    n_nonfinite: int


#: ``(old, new, rest, known, log_u) -> (accept, counts)``: every group's decision, from its
#: parts at the current and proposed effects, ``rest_g`` (the prior and proposal ratio, NaN
#: where the proposal is not finite), ``known_g`` (``rest_g`` plus the control variate's exact
#: part) and the t-test's ``log u`` per group.
GroupDecisions = Callable[
    [GroupParts, GroupParts, np.ndarray, np.ndarray, np.ndarray],
    tuple[np.ndarray, DecisionCounts],
]


def decide_on_rows(
    rng: np.random.Generator,
    rows: GroupRows,
    row_terms: RowTerms,
    batch_size: int,
    test: GroupTest,
    parts: GroupParts,
    parts_new: GroupParts,
    rest: np.ndarray,
    known: np.ndarray,
    log_u: np.ndarray,
) -> tuple[np.ndarray, DecisionCounts]:
    """Decide every group on its own rows (module doc, "Test"); see :data:`GroupDecisions`."""
    n_groups = rest.size
    likelihood = np.full(n_groups, np.nan)  # L_g(x') - L_g(x) where decided exactly
    accept = np.zeros(n_groups, bool)
    n_data = 0
    live = np.isfinite(rest)

    whole = rows.whole & live
    if rows.whole_rows.size:
        keep = whole[rows.whole_groups]
        change = row_terms(parts, parts_new, rows.whole_rows[keep], rows.whole_groups[keep], False)
        n_data += int(keep.sum())
        likelihood[whole] = np.bincount(rows.whole_groups[keep], change, minlength=n_groups)[whole]
    else:
        likelihood[whole] = 0.0

    sampled = np.flatnonzero(live & ~rows.whole)
    unsure = np.zeros(0, np.int64)
    if sampled.size:

        def draw_rows(groups: np.ndarray, k: int) -> np.ndarray:
            offsets = np.floor(rng.random((groups.size, k)) * rows.sizes[groups][:, None])
            return rows.order[rows.starts[groups][:, None] + offsets.astype(np.int64)]

        accept_sampled, unsure, read = staged_decisions(
            rng,
            test,
            sampled,
            rows.sizes,
            draw_rows,
            partial(row_terms, parts, parts_new),
            known,
            log_u,
            batch_size,
        )
        accept[sampled] = accept_sampled[sampled]
        n_data += read
    if unsure.size:
        unsure_rows, unsure_groups = rows.rows_of(unsure)
        change = row_terms(parts, parts_new, unsure_rows, unsure_groups, False)
        n_data += unsure_rows.size
        likelihood[unsure] = np.bincount(unsure_groups, change, minlength=n_groups)[unsure]
    on_all_rows = whole.copy()
    on_all_rows[unsure] = True
    finite = np.isfinite(likelihood)
    exact = on_all_rows & finite
    accept[exact] = exact_decisions(rng, test, likelihood[exact] + rest[exact], log_u[exact])
    nonfinite = ~live | (on_all_rows & ~finite)
    accept &= live
    return accept, DecisionCounts(n_data, int(whole.sum() + unsure.size), int(nonfinite.sum()))


def group_effects_sweep(
    rng: np.random.Generator,
    q: np.ndarray,
    coordinates: np.ndarray,
    parts_at: Callable[[np.ndarray], GroupParts],
    quadratic: GroupQuadratic,
    rows: GroupRows,
    row_terms: RowTerms,
    batch_size: int,
    test: GroupTest,
    decide: GroupDecisions | None = None,
) -> tuple[np.ndarray, GroupSweepInfo]:
    """Propose new effects for every group of a factor and decide each on its own rows.

    Parameters
    ----------
    rng : numpy.random.Generator
        Draws the proposals, the uniforms and the rows.
    q : ndarray
        The step's point.
    coordinates : ndarray
        ``(G, k)``: group g's effects are ``q[coordinates[g]]``.
    parts_at : callable
        ``q -> GroupParts`` of the factor.
    quadratic : GroupQuadratic
        The likelihood's expansion around the reference cells.
    rows : GroupRows
        The factor's rows by group.
    row_terms : callable
        See :data:`RowTerms`.
    batch_size : int
        Rows read per sampled group (groups of at most this many rows are read whole).
    test : GroupTest
        How each group is decided (``kernels/group_tests.py``).
    decide : callable, optional
        See :data:`GroupDecisions`; by default :func:`decide_on_rows` with the arguments
        above (a fused one runs the same decisions as one compiled call).

    Returns
    -------
    ndarray, GroupSweepInfo
        The new point (a new array) and what the sweep did.
    """
    n_groups = coordinates.shape[0]
    parts = parts_at(q)
    x = q[coordinates]
    mean, vectors, values = newton_gaussian(x, *model_derivatives(parts, quadratic))
    x_new = draw_proposal(rng, mean, vectors, values)
    log_u = np.log(rng.uniform(size=n_groups))
    q_new = q.copy()
    q_new[coordinates] = np.where(np.isfinite(x_new), x_new, x)
    parts_new = parts_at(q_new)
    mean_back, vectors_back, values_back = newton_gaussian(
        x_new, *model_derivatives(parts_new, quadratic)
    )
    with np.errstate(invalid="ignore"):
        rest = (
            parts_new.prior
            - parts.prior
            + proposal_log_density(x, mean_back, vectors_back, values_back)
            - proposal_log_density(x_new, mean, vectors, values)
        )
    rest = np.where(np.isfinite(rest) & np.isfinite(x_new).all(axis=1), rest, np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        # Delta_g = known_g + sum_{i in g} d_i for a sampled group (``kernels/group_tests.py``).
        known = rest + quadratic.change(np.arange(n_groups), parts.cells, parts_new.cells)
    if decide is None:
        decide = partial(decide_on_rows, rng, rows, row_terms, batch_size, test)
    accept, counts = decide(parts, parts_new, rest, known, log_u)
    result = q.copy()
    result[coordinates[accept]] = x_new[accept]
    return result, GroupSweepInfo(
        n_data=counts.n_data,
        n_accepted=int(accept.sum()),
        n_full_groups=counts.n_full_groups,
        n_nonfinite=counts.n_nonfinite,
    )

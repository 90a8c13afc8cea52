"""The search for a point near the posterior mode with minibatches (``find_reference_point``).

:func:`optimise_reference` runs Newton (or Fisher-scoring) iterations whose minibatch grows only
as much as the sequential test of Korattikara, Chen and Welling (2016, section 2, Algorithm 1)
requires for the update to point the right way (:mod:`pymc_subsample.kernels.optimizer`). Far
from the mode a few hundred rows give a good direction; near it the test asks for more, and the
last iterations use all rows, where Newton converges quadratically. The minibatch doubles
between tests ("testing at increasingly larger intervals", as the paper suggests), so an
iteration makes O(log N) calls. Each accepted update takes a backtracking (Armijo) step on the
minibatch's own objective, which guards Newton against overshooting far from the mode
(``reference_objective.py``). Unlike
the paper, which restarts every iteration at N_0 rows, the next iteration starts at the rows the
last one needed, so the minibatch never shrinks: near the mode a chance pass of the test on
fewer rows otherwise moves the iterate away again by the noise of those rows (restarting at
N_0 never converged on logistic regression with d = 10; restarting at half the last batch
still failed within 100 iterations at d = 50, N = 10^4).

At set-up only, a few full-data passes guard the result: it is a mode found on all rows or no
worse than the start, and a point with no mode there (a singular Hessian) or far from Gaussian
around it (``laplace_check.py``) carries a ``failure`` that steps with control variates refuse
(docs/control_variates.md). ``reference.py`` holds the public ``find_reference_point`` and the
steps' automatic search, which call this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy.special import ndtri
from threadpoolctl import threadpool_limits

from pymc_subsample.kernels.optimizer import (
    Curvature,
    DirectionTest,
    direction_test,
    newton_curvature,
)
from pymc_subsample.kernels.row_sampler import SparseRowSampler
from pymc_subsample.laplace_check import LAPLACE_SPREAD, laplace_log_weight_sd, not_gaussian
from pymc_subsample.model.oracle_sums import SearchSums
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.model.parallel_pass import PARALLEL_ROWS
from pymc_subsample.model.row_data import Rows, row_chunks, row_count
from pymc_subsample.reference_objective import CHUNK, line_search, log_posterior

__all__ = ["Optimum", "optimise_reference", "search_tol"]

#: From ``PARALLEL_ROWS`` rows, the largest minibatch before the search reads every row.
_LARGEST_BATCH = 1 << 20
#: The same for memory-mapped rows, whose scattered reads may each wait on the disk.
_LARGEST_MAPPED_BATCH = 1 << 16
#: Smallest over largest eigenvalue of the negative Hessian in correlation form (units removed,
#: ``newton_curvature``) below which it counts as singular: rounding leaves about 1e-15 on
#: exactly flat directions, and a well-identified but ill-conditioned posterior stays well above
#: it (kilpisjarvi's uncentred years: condition number 1e12, correlation-form ratio 1e-5).
_SINGULAR = 1e-10


@dataclass(frozen=True)
class Optimum:
    """Where :func:`optimise_reference` stopped, and the rows it read.

    ``ReferencePoint`` (``reference.py``) documents the fields.
    """

    q: np.ndarray
    converged: bool
    n_iterations: int
    n_gradient_rows: int
    n_loglik_rows: int
    newton_decrement_sq: float
    batch_sizes: list[int]
    laplace_log_weight_sd: float = float("nan")
    failure: str | None = None
    row_sums: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)
    at_mode: bool = False

    @property
    def n_row_evaluations(self) -> int:
        """Rows touched in all: gradient rows plus log-likelihood rows."""
        return self.n_gradient_rows + self.n_loglik_rows


def optimise_reference(
    oracles: ModelOracles,
    q0: np.ndarray,
    *,
    rng: np.random.Generator,
    method: str = "newton",
    error_tolerance: float = 0.01,
    batch_size: int | None = None,
    tol: float | None = None,
    max_iter: int = 100,
) -> Optimum:
    """Run the iterations of :func:`find_reference_point` on compiled oracles.

    Returns a mode found on all rows (a converged Newton iteration with a negative definite
    Hessian), or else a point whose full-data log posterior is finite and no lower than the
    start's (one chunked pass over the rows at each end, at set-up only; the end's is the last
    full-data line search's value where that is the point returned); :attr:`Optimum.failure`
    says why a point is not a usable reference. Full-data passes read ranges of rows in place.

    BLAS runs one thread throughout: the passes' products are of a chunk's rows (8,192 x d),
    where OpenBLAS's threads gain little alone and, beside any other busy process, made the
    passes 5-10x slower (they wait for a core each); the passes share the cores themselves
    (``model/parallel_pass.py``).
    """
    _check_arguments(method, error_tolerance, tol)
    tol = search_tol(tol, oracles.n_rows)
    with threadpool_limits(limits=1, user_api="blas"):
        return _optimise(oracles, q0, rng, method, error_tolerance, batch_size, tol, max_iter)


def search_tol(tol: float | None, n_rows: int) -> float:
    """Return the squared Newton decrement the search stops below: ``tol`` or its default.

    The default is 1e-4 (0.01 posterior sd from the mode), and 1e-2 (0.1 sd) from
    ``PARALLEL_ROWS`` rows: there each pass over every row costs seconds (4-16 s at N = 1e8
    on 2 cores), and the pass that took a logistic regression from 1.4e-3 to 3e-14 moved the
    point by 0.04 sd, which changes neither the control variates' cost nor the Laplace
    proposal's acceptance measurably.
    """
    if tol is not None:
        return float(tol)
    return 1e-2 if n_rows >= PARALLEL_ROWS else 1e-4


def _optimise(
    oracles: ModelOracles,
    q0: np.ndarray,
    rng: np.random.Generator,
    method: str,
    error_tolerance: float,
    batch_size: int | None,
    tol: float,
    max_iter: int,
) -> Optimum:
    """Run :func:`optimise_reference` (its arguments checked)."""
    oracles = oracles.in_unconstrained()  # the Laplace check's residuals are in q
    n_rows, d = oracles.n_rows, oracles.n_params
    first = max(200, 20 * d) if batch_size is None else int(batch_size)
    if batch_size is None and oracles.reads_groups:
        # A hierarchy's group effects: a minibatch leaves a small group without rows, where
        # the direction test's score covariance sees no noise, and the iterates drifted along
        # the hierarchy's ridge (1,000 groups, 3e5 rows: mu at -300 after 100 iterations).
        # Every row from the start converged in 25 (the grouped sums cost O(N) a pass).
        first = n_rows
    if first < 2:
        raise ValueError(f"batch_size must be an integer >= 2, got {batch_size!r}.")
    z = float(ndtri(1.0 - float(error_tolerance)))
    sampler = SparseRowSampler(n_rows, oracles.row_proposals())
    q0 = np.array(q0, dtype="float64")
    q = q0.copy()
    # The search reads the variables outside q at their current values, the control variate's
    # proxies (which take the search's last sums) at their frozen copies: make them the same.
    oracles.freeze_shared()
    counts = {"gradient": 0, "loglik": 0}
    # The full-data log posterior at the last point where it was computed on all rows.
    known: tuple[np.ndarray, float] | None = None
    batch_sizes: list[int] = []
    converged, decrement, last = False, float("inf"), None
    final_sums: tuple[np.ndarray, np.ndarray] | None = None
    nonfinite: _NonFiniteDerivatives | None = None
    size = first
    # A full Newton step taken without a line search (the quadratic regime below): where it
    # started, and what backtracking from there needs if the next pass finds it lost ground.
    unchecked: _UncheckedStep | None = None
    for _ in range(max_iter):
        try:
            rows, test, curvature, sums = _tested_update(
                oracles, q, sampler, rng, size, z, method, counts
            )
        except _NonFiniteDerivatives as error:
            if unchecked is not None:  # the unchecked step overflowed: back to its start
                q, known = unchecked.start, (unchecked.start, unchecked.value)
            last = None  # the gradient or curvature overflowed here: not a usable point
            nonfinite = error
            break
        n_used = row_count(rows, n_rows)
        batch_sizes.append(n_used)
        # Start the next test at this batch size: the precision needed grows near the mode,
        # and starting smaller lets a chance pass on few rows throw the iterate away again.
        grown = max(size, n_used)
        size = n_rows if _all_rows_pay(grown, n_rows, oracles) else grown
        decrement = test.newton_decrement_sq
        last = curvature if n_used == n_rows else None
        if n_used == n_rows:
            # The pass just read every row at q: its full-data log posterior comes with it.
            at_q = oracles.setup_log_prior(q) + sums.loglik
            known = (q, at_q) if np.isfinite(at_q) else None
            if unchecked is not None and not at_q >= unchecked.value:
                # The quadratic model behind the unchecked step failed (on a non-centred
                # hierarchy's curved ridge a decrement of 0.57 sent the log posterior from
                # -2.8e4 to -6.8e10): backtrack from its start, halving from 1/2.
                q, value = line_search(
                    oracles, unchecked.start, unchecked.step, slice(0, n_rows),
                    unchecked.loglik, unchecked.decrement, counts, alpha=0.5,
                )  # fmt: skip
                known = None if value is None else (q, value)
                decrement, last, unchecked = unchecked.decrement, None, None
                continue
        unchecked = None
        if n_used == n_rows and decrement < tol:
            # Converged on all rows: the remaining step is below tol in squared posterior sds.
            # Stay at this point, where the rows' summed gradient and Hessian were just computed:
            # the control variate takes them instead of another full pass.
            converged = curvature.n_modified == 0
            if sums.hessian is not None:
                final_sums = (sums.gradient, sums.hessian)
            break
        if (
            n_used == n_rows
            and decrement <= _quadratic_decrement(d, n_rows)
            and curvature.n_modified == 0
        ):
            # Within about one posterior sd of a mode on all rows, where the curvature is
            # negative definite: the quadratic regime, where the full Newton step needs no
            # check (and a check would cost a data pass). The next pass, on all rows, checks it.
            assert known is not None and np.array_equal(known[0], q)
            unchecked = _UncheckedStep(q, known[1], test.step, sums.loglik, decrement)
            q = q + test.step
        else:
            q, value = line_search(oracles, q, test.step, rows, sums.loglik, decrement, counts)
            known = None if value is None else (q, value)
    if known is not None and np.array_equal(known[0], q):
        end_value = known[1]
    else:
        end_value = log_posterior(oracles, q, counts)
    start_value = end_value
    if not (converged and np.isfinite(end_value)):
        # Never hand back a point worse than the start (or with a non-finite log density). A
        # mode found on all rows (converged, negative definite Hessian) is kept without this
        # comparison, which would cost a pass over the data.
        start_value = log_posterior(oracles, q0, counts)
        if not end_value >= start_value:
            q, end_value, converged, last = q0, start_value, False, None
    failure = _failure(
        converged, decrement, last, (len(batch_sizes), max_iter), tol, start_value, end_value
    )
    if failure is not None and nonfinite is not None:
        failure = nonfinite.reason(len(batch_sizes), max_iter)
    spread, row_sums = float("nan"), None
    at_mode = failure is None and last is not None
    if failure is None and last is not None:
        row_sums = final_sums
        if row_sums is None:
            row_sums = oracles.gradient_hessian_sums(q)
            counts["gradient"] += n_rows
        spread = laplace_log_weight_sd(oracles, q, last.precision, row_sums, rng, counts)
        if not spread <= LAPLACE_SPREAD:
            failure = not_gaussian(spread)
    return Optimum(
        q=q,
        converged=converged,
        n_iterations=len(batch_sizes),
        n_gradient_rows=counts["gradient"],
        n_loglik_rows=counts["loglik"],
        newton_decrement_sq=decrement,
        batch_sizes=batch_sizes,
        laplace_log_weight_sd=spread,
        failure=failure,
        row_sums=row_sums,
        at_mode=at_mode,
    )


class _UncheckedStep(NamedTuple):
    """A full Newton step taken without a line search, and its start on all rows."""

    start: np.ndarray
    value: float  # the full-data log posterior at ``start``
    step: np.ndarray
    loglik: float  # the rows' summed log-likelihood at ``start``
    decrement: float


def _check_arguments(method: str, error_tolerance: float, tol: float | None) -> None:
    if method not in ("newton", "fisher"):
        raise ValueError(f"method must be 'newton' or 'fisher', got {method!r}.")
    if not 0.0 < float(error_tolerance) < 0.5:
        raise ValueError(
            f"error_tolerance must be in (0, 0.5), got {error_tolerance!r}: it is the allowed "
            "probability that an update points more than 90 degrees the wrong way."
        )
    if tol is not None and not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}.")


def _failure(
    converged: bool,
    decrement: float,
    last: Curvature | None,
    iterations: tuple[int, int],
    tol: float,
    start_value: float,
    end_value: float,
) -> str | None:
    """Why the point is not a usable reference (None when it is), for the warning and the step.

    ``iterations`` is (made, max_iter); ``last`` the curvature of the last iteration if it used
    all rows.
    """
    d = 0 if last is None else last.precision.shape[0]
    if last is not None and abs(last.smallest_ratio) <= _SINGULAR and decrement <= d:
        return (
            "the log posterior's Hessian at the point found is singular (smallest eigenvalue "
            f"{last.smallest_ratio:.2g} of the largest, units removed): the data do not "
            "identify some parameters and, with flat priors, the posterior is improper (no "
            "mode, and chains drift without bound). Give every parameter a proper prior"
        )
    if converged:
        return None
    if last is not None and last.n_modified == 0 and decrement <= d:
        return None  # within about one posterior sd of a mode: close enough for the proxies
    where = (
        "at its start (every other point it reached had a lower or non-finite log posterior)"
        if end_value == start_value
        else f"after raising the log posterior by {end_value - start_value:.3g}"
    )
    shape = (
        ""
        if last is None or last.n_modified == 0
        else " where the log posterior's Hessian is not negative definite (not a mode)"
    )
    return (
        f"it stopped after {iterations[0]} of max_iter={iterations[1]} iterations {where}{shape}, "
        "with squared Newton "
        f"decrement {decrement:.3g} (tol={tol}). Raise max_iter, pass a better start=, or "
        "check that the posterior has a mode (flat priors on parameters the data do not "
        "identify, or on separable data, give none)"
    )


def _tested_update(
    oracles: ModelOracles,
    q: np.ndarray,
    sampler: SparseRowSampler,
    rng: np.random.Generator,
    first: int,
    z: float,
    method: str,
    counts: dict[str, int],
) -> tuple[Rows, DirectionTest, Curvature, SearchSums]:
    """Grow a minibatch (doubling) until the update passes the direction test; all rows at most.

    Returns the rows used (a slice when a test read every row at once), the test, the
    curvature and the sums over the rows used at ``q`` (with the Hessian's for
    ``method="newton"``): each row is read once, by one compiled call per chunk
    (:meth:`ModelOracles.search_sums`).
    """
    n_rows = oracles.n_rows
    newton = method == "newton"
    sampler.start_test()
    prior_gradient, prior_hessian = oracles.log_prior_derivatives(q)
    chunks: list[np.ndarray] = []
    sums: SearchSums | None = None
    size = min(first, n_rows)
    while True:
        if size == n_rows or (
            chunks and size == n_rows - sampler.n_taken and oracles.passes_shared
        ):
            # Every row: read in place, range by range (no draw, no gather, no copy). From
            # PARALLEL_ROWS on, every row again rather than the rest of them: in place,
            # threaded and without scores, all of them cost less than the rest listed.
            batch = oracles.search_sums(q, slice(0, n_rows), with_hessian=newton, chunk_size=CHUNK)
            n_used, size, chunks, sums = n_rows, n_rows, [], None
        elif chunks and size == n_rows - sampler.n_taken:
            # The rest of the rows: range by range, less the rows drawn (no list of N rows).
            batch = _rest_sums(oracles, q, sampler.taken, newton)
            chunks, n_used = [], n_rows
        else:
            # Sorted, the rows are gathered from the data in memory order (4x faster at
            # N = 1e6), chunk by chunk: O(chunk) memory for the gathered rows.
            rows = np.sort(sampler.draw(rng, size))
            chunks.append(rows)
            batch = oracles.search_sums(q, rows, with_hessian=newton, chunk_size=CHUNK)
            n_used = sampler.n_taken
        counts["gradient"] += size
        sums = batch if sums is None else _added(sums, batch)
        scale = n_rows / n_used
        curvature_sum = -sums.hessian if sums.hessian is not None else sums.outer
        matrix = scale * curvature_sum - prior_hessian
        if not (np.all(np.isfinite(matrix)) and np.all(np.isfinite(sums.gradient))):
            hessian_only = newton and bool(np.all(np.isfinite(sums.gradient)))
            raise _NonFiniteDerivatives(
                "the rows' summed "
                + ("Hessian" if hessian_only else "gradient")
                + " is not finite at the current point (NaN or inf from PyTensor's derivatives "
                "of this likelihood, or an overflow far from the mode)",
                hessian_only,
            )
        curvature = newton_curvature(matrix)
        mean = sums.gradient / n_used
        with np.errstate(over="ignore", invalid="ignore"):  # huge scores far from the mode
            covariance = (sums.outer - n_used * np.outer(mean, mean)) / max(n_used - 1, 1)
            test = direction_test(
                prior_gradient + scale * sums.gradient,
                curvature.precision,
                covariance,
                n_used,
                n_rows,
            )
        if n_used == n_rows or test.passes(z):
            used: Rows = slice(0, n_rows) if not chunks else np.concatenate(chunks)
            return used, test, curvature, sums
        # Double the batch, or take all rows once they pay.
        size = n_rows - n_used if _all_rows_pay(n_used, n_rows, oracles) else n_used


class _NonFiniteDerivatives(FloatingPointError):
    """The rows' summed gradient or Hessian overflowed or is NaN at the search's point."""

    def __init__(self, message: str, hessian_only: bool) -> None:
        super().__init__(message)
        self.hessian_only = hessian_only

    def reason(self, n_iterations: int, max_iter: int) -> str:
        """Return the failure as the search's warning states it, with what to try."""
        hint = (
            ". pms.find_reference_point(method='fisher') inside the model needs gradients "
            "only, and what it returns can be passed to the step as reference_point="
            if self.hessian_only
            else ""
        )
        return f"{self} after {n_iterations} of max_iter={max_iter} iterations{hint}"


def _rest_sums(oracles: ModelOracles, q: np.ndarray, taken: np.ndarray, newton: bool) -> SearchSums:
    """Sum what the search reads over every row not in ``taken`` (sorted), range by range.

    Each range of ``CHUNK`` rows is read less its taken rows: O(CHUNK) indices at a time,
    where drawing the rest of the rows listed them all (8 bytes per row, twice).
    """
    total: SearchSums | None = None
    for piece in row_chunks(oracles.n_rows, CHUNK):
        begin, end = np.searchsorted(taken, (piece.start, piece.stop))
        keep = np.ones(piece.stop - piece.start, dtype=bool)
        keep[taken[begin:end] - piece.start] = False
        rows = piece.start + np.flatnonzero(keep)
        if rows.size:
            sums = oracles.search_sums(q, rows, with_hessian=newton, chunk_size=CHUNK)
            total = sums if total is None else _added(total, sums)
    assert total is not None  # the caller reads the rest only where rows remain
    return total


def _added(first: SearchSums, second: SearchSums) -> SearchSums:
    hessian = None
    if first.hessian is not None and second.hessian is not None:
        hessian = first.hessian + second.hessian
    return SearchSums(
        first.loglik + second.loglik,
        first.gradient + second.gradient,
        first.outer + second.outer,
        hessian,
    )


def _quadratic_decrement(d: int, n_rows: int) -> float:
    """Return the largest squared Newton decrement on all rows whose step goes unchecked.

    ``d``: within about one posterior sd of a mode per coordinate, where the log posterior
    is close to its quadratic model. From ``PARALLEL_ROWS`` rows, ``max(d, sqrt(N))``: the
    log-likelihood's third derivatives are O(N) where its curvature is, so over r posterior
    sds the cubic term is about ``r / sqrt(N)`` of the quadratic one and the model holds much
    further out (logistic regression, N = 1e8: from a decrement of 689, 26 sds, the full step
    left 1.4e-3). The check it skips is a full pass (9 s at N = 1e8); the next pass on all
    rows still checks the step and backtracks from its start if it lost ground.
    """
    return float(d) if n_rows < PARALLEL_ROWS else max(float(d), float(np.sqrt(n_rows)))


def _all_rows_pay(n_used: int, n_rows: int, oracles: ModelOracles) -> bool:
    """Whether a batch that needs ``n_used`` rows or more should use all of them.

    From a quarter of the rows on, Newton on all of them costs at most 4x as much, converges
    quadratically and has no subsampling noise, where a minibatch that large passed its test
    again and again with noisy steps (8 iterations at 409,600 of 1e6 rows on a logistic model).
    From ``PARALLEL_ROWS`` rows on, a pass over all rows reads them in place, without per-row
    scores, on every core (``ModelOracles.search_sums``), where a drawn row is drawn, sorted,
    gathered and scored: about 20x the cost of a row of a full pass on 2 cores (logistic,
    d = 10, N = 1e7). A sixteenth of the rows then costs about as much as all of them, and
    so does a minibatch of ``_LARGEST_BATCH`` rows with its line search: at N = 1e8 the
    minibatch iterations up to N / 16 rows took 20 s (sampled, gathered, scored, and read again
    by each halving of the line search), where from their ``_LARGEST_BATCH`` rows' point, a
    few sds from the mode, Newton on all rows converges in two or three passes of 4-5 s.
    On rows far from the process (``oracles.rows_far``: memory-mapped rows,
    ``model/mapped_pages.py``, or rows on Dask, ``model/dask_rows.py``) a drawn row not in the
    page cache is a read from the disk (50 us on this project's machine), where a streamed
    pass reads a row in 60-80 ns: minibatches stop at ``_LARGEST_MAPPED_BATCH`` rows. At
    N = 1e9 the minibatch iterations up to ``_LARGEST_BATCH`` rows took over 3 minutes. Rows
    on Dask follow that rule at every N (``oracles.passes_shared``): a pass over all of them
    runs on the cluster, and a minibatch's rows are kept in this process
    (``dask_rows.KEPT_ROWS``) only up to about twice ``_LARGEST_MAPPED_BATCH`` rows.
    """
    if not oracles.passes_shared:
        return 4 * n_used >= n_rows
    largest = _LARGEST_MAPPED_BATCH if oracles.rows_far else _LARGEST_BATCH
    return 16 * n_used >= n_rows or n_used >= largest

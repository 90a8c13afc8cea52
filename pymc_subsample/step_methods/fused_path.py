"""The fused draw: one compiled call per Metropolis-Hastings draw (``docs/architecture.md``).

For the common case (a random-walk or independent proposal, the sequential t-test or the
Barker test without its CLT bound, per-row terms that PyTensor's Numba backend compiles) a
draw of :class:`~pymc_subsample.AusterityMH` or :class:`~pymc_subsample.MinibatchBarkerMH`
runs as one Numba function: the proposal, the prior ratio, the control variate's exact sum,
the stages (rows drawn, gathered from the user's arrays, their per-row terms from the model's
own graph, running statistics, the rule) and the decision. Only the driver that calls the
model's compiled functions is generated per model: its source names the data arrays and the
shared variables those functions read, and it is cached on disk with PyTensor's Numba cache
under a key made of theirs and this package's kernel source. The numeric parts are in
``kernels/fused.py``.

Where a draw cannot be fused, :func:`fused_obstacle` says why and the step runs its Python
path (``SubsampleMH.astep``); the step's ``draw_path`` attribute says which.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from scipy.special import stdtrit

from pymc_subsample.kernels import fused
from pymc_subsample.kernels.proposals import IndependentProposal, RandomWalkProposal
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.model.compiled import NumbaKernel, compile_driver
from pymc_subsample.step_methods.proposal_parts.independent import IndependentPart
from pymc_subsample.step_methods.proposal_parts.random_walk import RandomWalkPart

if TYPE_CHECKING:
    from pymc_subsample.step_methods.contracts import StepView

__all__ = ["FUSED_PROPOSALS", "FusedDraw", "fused_obstacle", "seed_fused_draws"]

#: Bump when the generated driver's source changes (the key of its disk cache includes it).
DRIVER_VERSION = 5


#: The proposal parts the fused draw compiles (``kernels/fused.propose``), by their exact class:
#: a part derived from one of them may propose its own way, and runs in Python.
FUSED_PROPOSALS: dict[type, int] = {
    RandomWalkPart: fused.RANDOM_WALK,
    IndependentPart: fused.INDEPENDENT,
}


def fused_obstacle(step: StepView) -> str | None:
    """Why ``step``'s draws cannot run as one compiled call; None if they can."""
    if type(step.proposal_part) not in FUSED_PROPOSALS:
        return f"the {step.proposal_kind} proposal runs in Python"
    if not step.oracles.rows_depend_on_q:
        return "no row of the likelihood depends on the step's variables"
    if step.oracles.rows_on_dask:
        return "the rows are read from Dask, fetched ahead of the draws in Python"
    if step.control is not None and step.oracles.expansion != "unconstrained":
        return "the control variate is expanded in the likelihood's parameters"
    if step.strata is not None:
        return "the stratified test runs in Python"
    test = step.test.fused(step)
    if test is None:
        return f"the {type(step.test).__name__} test has no fused kernel with these settings"
    return None


class FusedDraw:
    """One step's compiled draw: ``draw(q_old, scaling) -> (q, stats)``.

    Parameters
    ----------
    step : StepView
        The step whose proposal, control variate, test and rows the draw uses; it must have
        no :func:`fused_obstacle`. What the step changes between draws (the proposal after
        re-centring, the control variate and the row sampler after ``pm.set_data``) is read
        again when it changes; the scale is an argument of every draw.

    Raises
    ------
    RuntimeError
        If PyTensor's Numba backend cannot compile the model's functions.
    """

    def __init__(self, step: StepView) -> None:
        self._step = step
        self._key: tuple[Any, ...] = ()
        self._driver: Callable[..., Any] | None = None
        self._driver_key: tuple[Any, ...] = ()
        #: The draw's result vector (``kernels/fused.RESULT_FIELDS``) and a NaN after it.
        self.result = np.zeros(len(fused.RESULT_FIELDS) + 1)
        self.result[-1] = math.nan
        #: Where each of the test's stats is in the result (``step.test.fields``).
        self._layout = _StatsLayout(step.test.fields)
        self._arguments: tuple[Any, ...] = ()
        self._implicit = False
        #: The sampler of blocks where the test reads rows in blocks (``block_units``).
        self._units: RowSampler | None = None
        self._refresh()

    def draw(self, q_old: np.ndarray, scaling: float) -> tuple[np.ndarray, dict[str, Any]]:
        """Make one draw from ``q_old``; return the chain's next point and the test's stats.

        The stats are named by the step's test's fields; one the fused draw does not compute
        (Barker's ``clt_error``, which needs ``error_bound``) is NaN.
        """
        if not all(map(operator.is_, self._key, self._current_key())):
            self._refresh()
        assert self._driver is not None
        if self._implicit:  # shared values the model's functions read (a compound step's)
            implicit = (*self._prior.implicit_values(), *self._rows.implicit_values())
            q = self._driver(q_old, float(scaling), *self._arguments, *implicit)
        else:
            q = self._driver(q_old, float(scaling), *self._arguments)
        return q, self._layout.read(self.result)

    def _unit_sampler(self, n_units: int) -> RowSampler:
        """Return the sampler of blocks, kept while the data keep their number of blocks."""
        if self._units is None or self._units.n_rows != n_units:
            self._units = RowSampler(n_units)
        return self._units

    def _current_key(self) -> tuple[Any, ...]:
        # Compared by identity: a new proposal, proxy, row sampler or test design (which comes
        # with its batch size, kernels/test_design.py) is new state to read.
        step = self._step
        control = step.control
        proxy = None if control is None else control.proxy
        design = getattr(step.test, "design", None)
        return (step.proposal, proxy, step.row_sampler, step.oracles.proxy_order, design)

    def _refresh(self) -> None:
        """Read the step's proposal, control variate and rows (again)."""
        step = self._step
        oracles = step.oracles
        control = step.control
        self._key = self._current_key()
        test = step.test.fused(step)
        assert test is not None
        test_kind, error_tolerance, correction = test
        n_rows = oracles.n_rows
        # A designed test's tolerances are per stage of batch_size rows: rows stay its units.
        designed = isinstance(error_tolerance, np.ndarray)
        block = 1 if designed else min(oracles.pages.draw_block_rows(), n_rows)
        data = oracles.row_arrays()
        dimensions = tuple(array.ndim for array in data)
        driver_key = (control is None, oracles.proxy_order, block > 1, dimensions)
        if self._driver is None or driver_key != self._driver_key:
            self._prior, self._rows = oracles.numba_kernels()
            self._driver = _driver(
                data_dimensions=dimensions,
                n_prior_shared=len(self._prior.implicit),
                n_row_shared=len(self._rows.implicit),
                with_reference=control is not None,
                in_blocks=block > 1,
                prior=self._prior,
                rows=self._rows,
            )
            self._driver_key = driver_key
        n_params = oracles.n_params
        kind = FUSED_PROPOSALS[type(step.proposal_part)]
        # The kernels those parts build (kernels/proposals.py).
        proposal = cast(RandomWalkProposal | IndependentProposal, step.proposal)
        factor = _as_matrix(proposal.chol_factor)
        if isinstance(proposal, IndependentProposal):
            mean, inverse = proposal.mean, _as_matrix(proposal.inverse_factor)
        else:
            mean, inverse = np.zeros(n_params), np.eye(n_params)
        if control is None:
            order, reference = 0, np.zeros(n_params)
            gradient_sum, hessian_sum = np.zeros(n_params), np.zeros((n_params, n_params))
            precision = np.zeros((n_params, n_params))
        else:
            proxy = control.proxy
            order, reference = proxy.order, proxy.reference
            gradient_sum, hessian_sum = proxy.gradient_sum, proxy.hessian_sum
            precision = control.precision
        n_units, batch_size = block_units(n_rows, block, step.batch_size)
        sampler = step.row_sampler if block == 1 else self._unit_sampler(n_units)
        critical = (
            _critical_values(n_units, batch_size, error_tolerance)
            if test_kind == fused.AUSTERITY
            else np.zeros(1)
        )
        support, cumulative, correction_sd = (
            (np.zeros(1), np.ones(1), 1.0)
            if correction is None
            else (correction.support, correction.cumulative, correction.sigma)
        )
        fixed = (
            kind,
            factor,
            inverse,
            np.asarray(mean, dtype=np.float64),
            float(step.temperature),
            order,
            np.asarray(reference, dtype=np.float64),
            np.asarray(gradient_sum, dtype=np.float64),
            np.ascontiguousarray(hessian_sum, dtype=np.float64),
            np.ascontiguousarray(precision, dtype=np.float64),
            n_rows,
            block,
            n_units,
            batch_size,
            test_kind,
            critical,
            np.asarray(support, dtype=np.float64),
            np.asarray(cumulative, dtype=np.float64),
            float(correction_sd),
            sampler.stamps,
            sampler.counters,
            np.zeros(fused.ACCUMULATOR_SIZE),
        )
        # The data arrays are read once here: new data (pm.set_data) makes a new row sampler,
        # which a draw notices by its key.
        self._arguments = (*fixed, self.result, *data)
        self._implicit = bool(self._prior.implicit or self._rows.implicit)


#: The fewest blocks a stage of a test reads where it reads rows in blocks (``block_units``).
MIN_BLOCK_UNITS = 16

_BOOLEAN = frozenset({"full_data", "nonfinite_proposal"})
_INTEGER = frozenset({"n_data", "n_batches"})
#: Where the result vector has no entry for a stat (Barker's ``clt_error``): NaN.
_MISSING = len(fused.RESULT_FIELDS)


class _StatsLayout:
    """Where each stat of a step's test sits in the result vector, and its type.

    ``fields`` are the test's stat names and ``distance_sq``; a name the fused draw does not
    compute (Barker's ``clt_error``) reads the NaN after the result fields.
    """

    def __init__(self, fields: tuple[str, ...]) -> None:
        names = (*fields, "distance_sq")
        self._names = names
        self._indices = [
            fused.RESULT_FIELDS.index(name) if name in fused.RESULT_FIELDS else _MISSING
            for name in names
        ]
        self._booleans = [name for name in names if name in _BOOLEAN]
        self._integers = [name for name in names if name in _INTEGER]

    def read(self, result: np.ndarray) -> dict[str, Any]:
        """Return the stats of the result vector as Python scalars of their types."""
        values = result.tolist()
        stats = dict(zip(self._names, [values[index] for index in self._indices], strict=True))
        for name in self._booleans:
            stats[name] = bool(stats[name])
        for name in self._integers:
            stats[name] = int(stats[name])
        return stats


def seed_fused_draws(rng: np.random.Generator) -> None:
    """Seed Numba's generator, which fused draws use, from a chain's generator."""
    fused.seed_generator(int(rng.integers(2**32)))


def _as_matrix(factor: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.diag(factor) if factor.ndim == 1 else factor, dtype=np.float64)


def block_units(n_rows: int, block: int, batch_size: int) -> tuple[int, int]:
    """Return the test's units and units per stage, where it reads rows in blocks of ``block``.

    The population is the ``ceil(N / block)`` blocks, each valued by its rows' sum (the last
    may be shorter): Algorithm 1 of Korattikara et al. (2014) on them is the same test of the
    same sum (eq. 2 with ``N`` the number of blocks), and Seita et al.'s of the same estimate.
    A stage reads as many blocks as hold ``batch_size`` rows, and at least
    :data:`MIN_BLOCK_UNITS`, whose sample variance then has 15 degrees of freedom or more.
    At ``block`` 1 these are the rows and ``batch_size``.
    """
    if block == 1:
        return n_rows, batch_size
    n_units = -(-n_rows // block)
    return n_units, min(n_units, max(MIN_BLOCK_UNITS, -(-batch_size // block)))


def _critical_values(
    n_rows: int, batch_size: int, error_tolerance: float | np.ndarray
) -> np.ndarray:
    """``t_{n-1}`` quantiles ``1 - epsilon`` at every stage boundary (Algorithm 1, line 8).

    ``stdtr(n - 1, -|t|) < epsilon`` holds exactly when ``|t|`` exceeds this quantile; one
    value per stage of ``batch_size`` rows, O(N / batch_size) once per step. An array of
    tolerances gives each stage its own (a designed test, ``kernels/test_design.py``); a
    tolerance of 0 gives an infinite quantile: the test does not stop there.
    """
    n_stages = -(-n_rows // batch_size)
    n_values = np.minimum(np.arange(1, n_stages + 1) * batch_size, n_rows)
    with np.errstate(all="ignore"):
        values = stdtrit(np.maximum(n_values - 1, 1).astype(float), 1.0 - error_tolerance)
    return np.asarray(values, dtype=np.float64)


_DRIVER_TEMPLATE = """
def fused_draw(
    q_old, scaling, kind, factor, inverse_factor, mean, temperature, order, reference,
    gradient_sum, hessian_sum, precision, n_rows, block, n_units, batch_size, test, critical,
    correction_support, correction_cumulative, correction_sd, stamps, counters, accumulator,
    result{data_args}{prior_args}{row_args}
):
    q_new, log_ratio = propose(kind, q_old, scaling, factor, inverse_factor, mean)
    log_ratio += prior_ratio(q_new, q_old{prior_args})[0].item()
    if order > 0:
        log_ratio += proxy_difference(
            q_new, q_old, reference, gradient_sum, hessian_sum, order
        ) / temperature
    log_u = log_uniform_for(test)
    start_test(counters, accumulator)
    nonfinite = not np.isfinite(log_ratio)
    rows_read = 0
    if not nonfinite:
        # The test's population: n_units blocks of `block` rows (rows themselves unblocked),
        # each valued by its rows' sum (docs/architecture.md, "Rows read in blocks").
        threshold = temperature * (log_u - log_ratio) / n_units
        scale = n_units / (temperature * correction_sd)  # Barker: stop once s^2 < sigma^2
        first = no_rows()
        remaining = no_rows()
        while True:  # one stage per call: the rows evaluated are the rows the test used
            units, first, remaining = draw_rows(
                n_units, batch_size, stamps, counters, first, remaining
            )
            rows = {rows_of_units}
            rows_read += rows.size
            terms = row_terms(q_new, q_old{reference_arg}{gathered}{row_args})[0]
            values = {values_of_units}
            if not finite_total(values):
                nonfinite = True
                accumulator[8] += 1
                break
            all_read = counters[2] == n_units
            if consume_stages(
                values, batch_size, n_units, all_read, test, threshold, scale, critical,
                accumulator,
            ):
                break
    accepted = finish_decision(
        test, nonfinite, log_ratio, log_u, n_units, temperature, accumulator, counters,
        correction_support, correction_cumulative, correction_sd, result,
    )
    result[1] = rows_read
    q_next = q_new if accepted else q_old
    result[8] = distance_sq(q_next, reference, precision) if order > 0 else np.nan
    return q_next
"""


def _driver(
    *,
    data_dimensions: tuple[int, ...],
    n_prior_shared: int,
    n_row_shared: int,
    with_reference: bool,
    in_blocks: bool,
    prior: NumbaKernel,
    rows: NumbaKernel,
) -> Callable[..., Any]:
    """Generate, compile (or load from PyTensor's Numba cache) the model's draw driver.

    ``data_dimensions`` are those of the row-aligned data arrays, in order: a stage's rows of
    a 1-D or 2-D array are gathered by a package kernel, of any other by NumPy's indexing.
    ``in_blocks``: the test's units are blocks of rows (``block_units``); else rows, and the
    driver has no block code (nor compiles its kernels, ``kernels/warm_up.py``).
    """
    data_names = [f"data_{k}" for k in range(len(data_dimensions))]
    prior_names = [f"prior_shared_{k}" for k in range(n_prior_shared)]
    row_names = [f"row_shared_{k}" for k in range(n_row_shared)]

    def arguments(names: list[str]) -> str:
        return "".join(f", {name}" for name in names)

    source = _DRIVER_TEMPLATE.format(
        data_args=arguments(data_names),
        prior_args=arguments(prior_names),
        row_args=arguments(row_names),
        reference_arg=", reference" if with_reference else "",
        gathered="".join(
            f", {_gather(name, ndim)}"
            for name, ndim in zip(data_names, data_dimensions, strict=True)
        ),
        rows_of_units="block_rows(units, block, n_rows)" if in_blocks else "units",
        values_of_units="block_sums(terms, units, block, n_rows)" if in_blocks else "terms",
    )
    # The driver calls the package's kernels: its compile (at its first call) loads those the
    # warm-up's helper has cached and compiles the others (kernels/warm_up.py,
    # stop_kernel_warm_up).
    environment = {
        # Numba's cache rebuilds a function's environment by importing its module by name.
        "__name__": __name__,
        "np": np,
        "prior_ratio": prior.function,
        "row_terms": rows.function,
        **{name: getattr(fused, name) for name in fused.__all__},
    }
    return compile_driver(
        source,
        "fused_draw",
        environment,
        f"fused_draw_{DRIVER_VERSION}",
        [_kernel_source(), prior.cache_key, rows.cache_key],
    )


def _gather(name: str, ndim: int) -> str:
    """Return the source that reads a stage's ``rows`` of the data array ``name``."""
    if ndim == 1:
        return f"take_values({name}, rows)"
    if ndim == 2:
        return f"take_matrix_rows({name}, rows)"
    return f"{name}[rows]"


@cache
def _kernel_source() -> str:
    """Return the source of ``kernels/fused.py``, part of the driver's cache key."""
    return inspect.getsource(fused)

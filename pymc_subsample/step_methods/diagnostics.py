"""Per-chain checks of the subsampled MH steps, reported as ``SubsampleWarning``.

After tuning, each chain tracks the share of draws whose test fell back to all N rows, the mean
number of rows a draw read and, with control variates, the excess kurtosis of the residuals of
each test's first batch. They are
checked at the end of the chain when PyMC says how many draws it will make (PyMC 6's
``setup_chain``), and otherwise (PyMC 5) after every ``CHECK_EVERY`` draws; each warning is given
at most once per chain, at the user's ``pm.sample`` line (from a worker process through the
``warning`` stat: ``warning_relay``).
"""

from __future__ import annotations

import math

from pymc_subsample.warnings import warn_user

__all__ = [
    "CHECK_EVERY",
    "COST_LIMIT",
    "FALLBACK_LIMIT",
    "KURTOSIS_LIMIT",
    "ChainDiagnostics",
    "RowCost",
]

#: Warn when more than this share of the draws after tuning used all rows.
FALLBACK_LIMIT = 0.1
#: Warn when the draws after tuning read more than this share of the N rows on average: the run
#: then costs more than half of what exact Metropolis-Hastings on all rows would.
COST_LIMIT = 0.5
#: Warn when the residuals' mean excess kurtosis divided by ``batch_size`` (the excess kurtosis
#: of a batch mean) exceeds this: the t-test and the Barker CLT assume that mean is Gaussian.
#: Logistic-regression residuals measured 5 to 17 (batch 100: 0.05 to 0.17), where the
#: Edgeworth correction to a 3-sigma tail is below 1e-3; outliers give thousands.
KURTOSIS_LIMIT = 1.0
#: Without a known number of draws, check after this many draws past tuning.
CHECK_EVERY = 1000


class ChainDiagnostics:
    """Counts one chain's draws after tuning and warns once per problem."""

    def __init__(
        self,
        batch_size: int,
        n_rows: int,
        *,
        warn_fallback: bool = True,
        control_variate: bool = False,
        can_control: bool = True,
        skewed_posterior: bool = False,
    ) -> None:
        self.batch_size = batch_size
        self.n_rows = n_rows
        #: False where full-data decisions are what the user asked for (an exact test).
        self.warn_fallback = warn_fallback
        #: Whether the step already uses a control variate (the fallback advice depends on it).
        self.control_variate = control_variate
        #: Whether a control variate could be turned on: not for discrete variables, nor where
        #: the rows read variables another step samples (``defaults.control_variate_obstacle``).
        self.can_control = can_control
        #: Whether the reference search measured the posterior far from Gaussian around its
        #: reference (the Laplace check, ``laplace_check.py``): the control variate's proxies
        #: then miss over the posterior's spread wherever the chain starts, as in a hierarchy's
        #: groups with few rows (``docs/control_variates.md``).
        self.skewed_posterior = skewed_posterior
        self.reset(None)

    def reset(self, draws: int | None) -> None:
        """Start a chain that will make ``draws`` draws after tuning (None: unknown)."""
        self.draws = draws
        self.n_draws = 0
        self.n_full = 0
        self.rows_read = 0
        self.kurtosis_sum = 0.0
        self.n_kurtosis = 0
        self.warned: set[str] = set()

    def record(self, full_data: bool, kurtosis: float, n_data: int) -> None:
        """Count a draw after tuning and check when the chain ends (or every CHECK_EVERY draws).

        ``n_data`` is the draw's ``n_data`` stat: the rows it read.
        """
        self.n_draws += 1
        self.n_full += int(full_data)
        self.rows_read += n_data
        if math.isfinite(kurtosis):
            self.kurtosis_sum += kurtosis
            self.n_kurtosis += 1
        final = self.draws is not None and self.n_draws == self.draws
        if final or (self.draws is None and self.n_draws % CHECK_EVERY == 0):
            self.check()

    def warn_far(self, distance_sq: float, limit: float) -> None:
        """Warn (once) that the chain is far from the control variates' reference point."""
        self._warn(
            "far",
            f"The chain reached squared Mahalanobis distance {distance_sq:.3g} from the "
            f"reference point of the control variate (a Gaussian posterior exceeds {limit:.3g} "
            "with probability 1e-6). The Taylor proxies degrade away from it and the tests "
            "need more rows. Pass a reference point nearer the mode "
            "(pms.find_reference_point), start the chains there with "
            "pm.sample(initvals=ref.initvals), or re-centre with recenter='tune'.",
        )

    def check(self) -> None:
        """Warn about a high cost (full-data share, rows per draw) or heavy-tailed residuals."""
        if self.n_draws == 0:
            return
        share = self.n_full / self.n_draws
        mean_rows = self.rows_read / self.n_draws
        costly = share > FALLBACK_LIMIT or mean_rows > COST_LIMIT * self.n_rows
        if self.warn_fallback and costly:
            self._warn(
                "fallback",
                f"Draws after tuning read {mean_rows:.0f} of the N={self.n_rows} rows on average "
                f"({mean_rows / self.n_rows:.0%}, stat 'n_data'), and {share:.0%} of "
                f"{self.n_draws} draws used all N={self.n_rows} rows (stat 'full_data'): the "
                "subsampled test gained little. " + self._fallback_advice(),
            )
        if self.n_kurtosis:
            kurtosis = self.kurtosis_sum / self.n_kurtosis
            if kurtosis / self.batch_size > KURTOSIS_LIMIT:
                self._warn(
                    "kurtosis",
                    f"The control-variate residuals are heavy-tailed: mean excess kurtosis "
                    f"{kurtosis:.3g} over batches of {self.batch_size} rows (stat "
                    "'residual_kurtosis'). The tests assume a Gaussian batch mean (CLT); raise "
                    f"batch_size above {kurtosis / KURTOSIS_LIMIT:.0f}, use "
                    "control_variate='taylor2', or check the data for outliers.",
                )

    def _fallback_advice(self) -> str:
        if 2 * self.batch_size >= self.n_rows:
            # One batch is already half of the data: no test can read much less.
            return (
                f"With N={self.n_rows} rows a first batch of {self.batch_size} is already "
                f"{self.batch_size / self.n_rows:.0%} of them, so subsampling cannot save much "
                "on data this small; the draws are not affected. pm.sample() with NUTS on all "
                "rows is usually the faster sampler here."
            )
        if self.control_variate and self.skewed_posterior and "far" not in self.warned:
            # Not the start nor a drift: the proxies miss over the posterior's own spread.
            return (
                "The control variate is on, but the search for its reference point measured "
                "the posterior far from Gaussian there (a hierarchy whose groups have few rows, "
                "a funnel, a skewed or heavy-tailed posterior), so its Taylor proxies miss "
                "where the chain goes and most tests read on towards all rows. The draws are "
                "still right, but each costs about as much as a full-data evaluation: on this "
                "model full-data NUTS (pm.sample() without step=, or nutpie) is the faster "
                "sampler today. A larger error_tolerance reads fewer rows but lets more wrong "
                "decisions through."
            )
        if self.control_variate:
            return (
                "The control variate is on, so the chain is probably far from its reference "
                "point (stat 'reference_distance'): start the chains at the reference "
                "(pm.sample(initvals=ref.initvals)), pass recenter='tune', or use "
                "control_variate='taylor2' if it is 'taylor1'."
            )
        if not self.can_control:
            return (
                "No control variate applies to this step. Shrinking the proposal's moves or "
                "raising batch_size can help; a larger error_tolerance reads fewer rows but "
                "lets more wrong decisions through (check against error_tolerance=0)."
            )
        return (
            "At temperature 1 turn on control_variate='taylor2' (or 'taylor1'); otherwise "
            "raise the error_tolerance or batch_size, or shrink the proposal."
        )

    def _warn(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            warn_user(message, topic=f"ChainDiagnostics.{key}")


class RowCost:
    """One chain's rows per draw after tuning, judged as :meth:`ChainDiagnostics.check` does.

    For a step without full-data fallbacks (``GroupEffectsMH``): :meth:`record` returns the
    mean rows per draw once, at the chain's end (or every :data:`CHECK_EVERY` draws where the
    number of draws is unknown), if it exceeds :data:`COST_LIMIT` of the N rows.
    """

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows
        self.reset(None)

    def reset(self, draws: int | None) -> None:
        """Start a chain that will make ``draws`` draws after tuning (None: unknown)."""
        self.draws = draws
        self.n_draws = 0
        self.rows_read = 0
        self.reported = False

    def record(self, n_data: int) -> float | None:
        """Count a draw after tuning; the mean rows per draw where they cost too much, once."""
        self.n_draws += 1
        self.rows_read += n_data
        final = self.draws is not None and self.n_draws == self.draws
        if self.reported or not (final or (self.draws is None and self.n_draws % CHECK_EVERY == 0)):
            return None
        mean_rows = self.rows_read / self.n_draws
        if mean_rows <= COST_LIMIT * self.n_rows:
            return None
        self.reported = True
        return mean_rows

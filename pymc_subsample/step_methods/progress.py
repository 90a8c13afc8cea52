"""Progress-bar columns of the subsampling steps: rows per draw, full-data share, acceptance.

PyMC's bar puts a step's columns between its own "Draw" and "Speed" columns, and PyMC's own
columns already take most of an 80-column terminal (PyMC 6 shares the width out by ratios,
and at 80 columns cuts its own "Remaining" header even with no step columns). So a terminal
narrower than :data:`WIDE_TERMINAL` shows one column, the running mean of rows per draw
(the package's key number), eight characters wide under a two-line header; a wider one (and
Jupyter, which rich gives 115 columns) also shows the full-data share and the acceptance
rate. ``tests/test_progress_columns.py`` renders PyMC's bar with these columns at both widths.
On PyMC 6 the one column still costs PyMC's "Remaining" header its last letters from 83 to 93
columns, where PyMC's bar alone just fits (its cells stay whole).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

__all__ = [
    "WIDE_TERMINAL",
    "RowsPerDrawColumn",
    "compact_count",
    "make_progressbar_updaters",
    "progressbar_config",
]

#: Terminal width (characters) from which the bar also shows "Full data" and "Accept": the
#: narrowest at which PyMC's bar with all three columns cuts nothing, on PyMC 5 and 6.
WIDE_TERMINAL = 112

#: Width of the rows-per-draw column: its header's longer line, "per draw".
_ROWS_WIDTH = 8


class RowsPerDrawColumn(ProgressColumn):
    """The running mean of rows per draw, at most eight characters ("999,999", "12.3M")."""

    def __init__(self) -> None:
        super().__init__(table_column=Column("Rows\nper draw", no_wrap=True, width=_ROWS_WIDTH))

    def render(self, task: Task) -> Text:
        """Return the task's ``rows_per_draw`` field, compacted to the column's width."""
        return Text(compact_count(float(task.fields["rows_per_draw"])))


def compact_count(value: float) -> str:
    """Format a count in at most eight characters: digits with commas up to 999,999, then M/G.

    Examples
    --------
    >>> compact_count(140.4), compact_count(50_000), compact_count(12_345_678)
    ('140', '50,000', '12.3M')
    """
    if value < 999_999.5:
        return f"{value:,.0f}"
    if value < 999_950_000:
        return f"{value / 1e6:.1f}M"
    return f"{value / 1e9:.1f}G"


def progressbar_config(
    n_chains: int = 1, width: int | None = None
) -> tuple[list[ProgressColumn], dict[str, list[float]]]:
    """Return the step's progress-bar columns and their initial values, one per chain.

    Parameters
    ----------
    n_chains : int
        Number of chains (one bar each).
    width : int, optional
        Terminal width in characters; by default the width rich measures, as PyMC's bar does.
        Below :data:`WIDE_TERMINAL` the bar shows rows per draw only, from it also "Full data"
        (share of full-data decisions) and "Accept"; all are running means, pooled over chains.

    Returns
    -------
    columns : list of rich ProgressColumn
        The columns PyMC places between its "Draw" and "Speed" columns.
    stats : dict
        Each field's initial value per chain.
    """
    if width is None:
        width = Console().width
    columns: list[ProgressColumn] = [RowsPerDrawColumn()]
    if width >= WIDE_TERMINAL:
        columns += [
            TextColumn(
                "{task.fields[full_data_share]:.1%}",
                table_column=Column("Full\ndata", no_wrap=True),
            ),
            TextColumn(
                "{task.fields[accept_rate]:0.2f}", table_column=Column("Accept", no_wrap=True)
            ),
        ]
    stats: dict[str, list[float]] = {
        "rows_per_draw": [0.0] * n_chains,
        "full_data_share": [0.0] * n_chains,
        "accept_rate": [0.0] * n_chains,
    }
    return columns, stats


def make_progressbar_updaters() -> tuple[Callable[[dict[str, Any]], dict[str, float]]]:
    """One updater that keeps running totals of ``n_data``, ``full_data`` and ``accepted``."""
    totals = {"draws": 0, "rows": 0, "full_data": 0, "accepted": 0}

    def update(step_stats: dict[str, Any]) -> dict[str, float]:
        totals["draws"] += 1
        totals["rows"] += int(step_stats["n_data"])
        totals["full_data"] += int(step_stats["full_data"])
        totals["accepted"] += int(step_stats["accepted"])
        return {
            "rows_per_draw": totals["rows"] / totals["draws"],
            "full_data_share": totals["full_data"] / totals["draws"],
            "accept_rate": totals["accepted"] / totals["draws"],
        }

    return (update,)

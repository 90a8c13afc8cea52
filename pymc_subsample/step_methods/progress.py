"""Progress-bar columns of the subsampling steps: rows per draw, full-data share, acceptance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.progress import TextColumn
from rich.table import Column

__all__ = ["make_progressbar_updaters", "progressbar_config"]


def progressbar_config(n_chains: int = 1) -> tuple[list[TextColumn], dict[str, list[float]]]:
    """Columns "Rows/draw", "Full data" and "Accept": running means so far, pooled over chains."""
    columns = [
        TextColumn("{task.fields[rows_per_draw]:,.0f}", table_column=Column("Rows/draw", ratio=1)),
        TextColumn("{task.fields[full_data_share]:.1%}", table_column=Column("Full data", ratio=1)),
        TextColumn("{task.fields[accept_rate]:0.2f}", table_column=Column("Accept", ratio=1)),
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

"""PyMC's progress bar with the subsampling steps' columns fits the terminal (issue 37, item 2).

The bar is built as ``pm.sample`` builds it (PyMC's ``MCMCProgressBarManager`` asks the step
for its columns, with the terminal width rich measures from ``COLUMNS``), fed the widest
values a run shows (five-digit draw counts and speeds, six-digit rows per draw), and printed
into a rich console of that width.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

import pymc_subsample as pms
from pymc_subsample.step_methods.progress import WIDE_TERMINAL, compact_count

progress_module = pytest.importorskip("pymc.progress_bar.progress")

BAR = "━"


class NoColumns:
    """A step with no progress columns: PyMC's own bar, the baseline."""

    @staticmethod
    def _progressbar_config(n_chains: int = 1) -> tuple[list[Any], dict[str, list[float]]]:
        return [], {}

    @staticmethod
    def _make_progressbar_update_functions() -> tuple[Any, ...]:
        return (lambda stats: {},)


def render(step: Any, width: int, monkeypatch: pytest.MonkeyPatch, rows: float) -> str:
    """Render PyMC's bar for two chains at ``width`` columns after realistic updates."""
    monkeypatch.setenv("COLUMNS", str(width))
    manager = progress_module.MCMCProgressBarManager(
        step_method=step, chains=2, draws=5_000, tune=5_000, progressbar=True
    )
    backend = manager._backend
    backend._initialize_tasks()
    for chain in range(2):
        for draw in range(3):
            stats = [{"n_data": int(rows), "full_data": True, "accepted": True}]
            manager.update(chain_idx=chain, is_last=False, draw=draw, tuning=False, stats=stats)
    progress = backend._progress
    for task_id in progress.task_ids:  # the widest values a run shows
        progress.update(task_id, completed=10_000, draw=10_000, sampling_speed=12_345.67)
    file = io.StringIO()
    console = Console(file=file, width=width, color_system=None, legacy_windows=False)
    console.print(progress.get_renderable())
    return file.getvalue()


def headers(step: Any, width: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each line of every column header of the bar PyMC builds for ``step``."""
    monkeypatch.setenv("COLUMNS", str(width))
    manager = progress_module.MCMCProgressBarManager(
        step_method=step, chains=2, draws=5_000, tune=5_000, progressbar=True
    )
    columns = manager._backend._progress.columns
    return [
        line
        for column in columns
        for line in str(column.get_table_column().header).splitlines()
        if line
    ]


def cut_headers(text: str, names: list[str]) -> set[str]:
    """The header lines that do not appear whole in the rendered table."""
    lines = text.splitlines()
    return {name for name in names if not any(name in line for line in lines)}


def bar_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if BAR in line]


@pytest.mark.parametrize("rows", [140.0, 999_999.0, 12_345_678.0])
def test_bar_fits_80_columns(monkeypatch: pytest.MonkeyPatch, rows: float) -> None:
    text = render(pms.AusterityMH, 80, monkeypatch, rows)
    names = headers(pms.AusterityMH, 80, monkeypatch)
    assert max(cell_len(line) for line in text.splitlines()) <= 80, text
    # One line per chain: the speed does not wrap, no cell is cut.
    chains = bar_rows(text)
    assert len(chains) == 2, text
    for line in chains:
        assert "…" not in line, text
        assert "10000" in line and "12345.67 draws/s" in line, text
        assert f" {compact_count(rows)} " in line, text
    # No header cut, except what PyMC's own bar cuts at this width with no step columns
    # (PyMC 6 shares the width out by ratios and cuts "Remaining" at 80 columns by itself).
    baseline = render(NoColumns, 80, monkeypatch, rows)
    assert bar_rows(baseline) and all("…" not in line for line in bar_rows(baseline))
    own_cuts = cut_headers(baseline, headers(NoColumns, 80, monkeypatch))
    assert cut_headers(text, names) <= own_cuts, text
    assert "per draw" in names  # rows per draw, the package's key number, stays on the bar


def test_wide_terminal_shows_every_column_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    text = render(pms.AusterityMH, WIDE_TERMINAL, monkeypatch, 999_999.0)
    names = headers(pms.AusterityMH, WIDE_TERMINAL, monkeypatch)
    assert {"per draw", "data", "Accept", "Remaining"} <= set(names)
    assert cut_headers(text, names) == set(), text
    assert "…" not in text, text
    chains = bar_rows(text)
    assert len(chains) == 2 and all("100.0%" in line and "1.00" in line for line in chains), text


def test_compact_count_is_at_most_eight_characters() -> None:
    values = [0.0, 0.4, 999.5, 999_999.4, 999_999.5, 54_321_000.0, 999_949_999.0, 1e9, 9.99e11]
    assert [compact_count(value) for value in values] == [
        "0",
        "0",
        "1,000",
        "999,999",
        "1.0M",
        "54.3M",
        "999.9M",
        "1.0G",
        "999.0G",
    ]
    assert max(len(compact_count(value)) for value in values) <= 8

"""Plots of what the subsampling steps cost: rows per draw and full-data fallbacks."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_data_usage"]


def plot_data_usage(
    idata: Any,
    *,
    n_rows: int | None = None,
    axes: Any = None,
    bins: int | str = "auto",
    figsize: tuple[float, float] = (10.0, 3.5),
) -> np.ndarray:
    """Plot the rows each draw read, over the draws and as a histogram.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
        What ``pm.sample`` returned with a ``pymc_subsample`` step: its ``sample_stats`` must
        have ``n_data``. Draws whose test used all rows (stat ``full_data``) are marked. In a
        compound step with several ``pymc_subsample`` steps, each draw's rows are the sum over
        the steps, and a draw is marked when any of them used all rows.
    n_rows : int, optional
        Number of rows N: drawn as a reference line and used for the share in the title.
    axes : sequence of two matplotlib Axes, optional
        Where to draw; new axes in a new figure by default.
    bins : int or str, default "auto"
        Histogram bins, as for :func:`numpy.histogram`.
    figsize : tuple, default (10, 3.5)
        Size of a new figure.

    Returns
    -------
    numpy.ndarray of matplotlib.axes.Axes
        The trace axis (rows per draw against draw, one line per chain) and the histogram axis.

    Raises
    ------
    ValueError
        If ``sample_stats`` has no ``n_data`` (the run used no pymc_subsample step).

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import numpy as np, xarray as xr
    >>> dims = ("chain", "draw")
    >>> stats = xr.Dataset(
    ...     {"n_data": (dims, [[100, 200, 1000]]), "full_data": (dims, [[False, False, True]])}
    ... )
    >>> axes = plot_data_usage({"sample_stats": stats}, n_rows=1000)
    >>> axes[0].get_ylabel()
    'rows read per draw'
    """
    import matplotlib.pyplot as plt

    stats = idata["sample_stats"] if "sample_stats" in idata else None
    if stats is None or "n_data" not in stats:
        raise ValueError(
            "idata.sample_stats has no 'n_data': plot_data_usage needs the result of pm.sample "
            "with a pymc_subsample step (AusterityMH, MinibatchBarkerMH or SGFS)."
        )
    n_data = _per_draw(stats["n_data"].values).sum(axis=-1)
    full = (
        _per_draw(stats["full_data"].values).astype(bool).any(axis=-1)
        if "full_data" in stats
        else np.zeros(n_data.shape, dtype=bool)
    )
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=figsize, width_ratios=(2, 1))
    trace_ax, hist_ax = axes
    draws = np.arange(n_data.shape[1])
    for chain, (rows, fallback) in enumerate(zip(n_data, full, strict=True)):
        (line,) = trace_ax.plot(draws, rows, lw=0.6, alpha=0.8, label=f"chain {chain}")
        if fallback.any():
            trace_ax.plot(draws[fallback], rows[fallback], "x", color=line.get_color(), ms=4)
    if n_rows is not None:
        trace_ax.axhline(n_rows, color="k", ls="--", lw=0.8, label=f"N = {n_rows:,}")
    trace_ax.set_xlabel("draw")
    trace_ax.set_ylabel("rows read per draw")
    if full.any():
        trace_ax.plot([], [], "x", color="0.3", label="all rows (full_data)")
    trace_ax.legend(loc="upper right", fontsize="small")
    hist_ax.hist(n_data.ravel(), bins=bins, color="C0", alpha=0.8)
    hist_ax.set_xlabel("rows read per draw")
    hist_ax.set_ylabel("draws")
    mean = float(n_data.mean())
    share = f" ({mean / n_rows:.1%} of N)" if n_rows else ""
    hist_ax.set_title(
        f"mean {mean:,.0f}{share}; full data in {full.mean():.1%} of draws", fontsize="small"
    )
    return np.asarray(axes)


def _per_draw(values: Any) -> np.ndarray:
    """Stat values as (chain, draw, step): a compound step's stats carry a last step axis."""
    array = np.asarray(values)
    if array.ndim <= 2:
        return array.reshape(-1, array.shape[-1], 1)
    return array.reshape(array.shape[0], array.shape[1], -1)

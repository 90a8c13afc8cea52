"""Flatten draws to Stan-style names and summarise them (mean, sd, ESS of the mean)."""

from __future__ import annotations

from typing import Any

import arviz as az
import numpy as np


def stan_names(posterior: Any) -> dict[str, np.ndarray]:
    """Draws ``(chain, draw)`` per scalar, named like Stan: ``beta`` -> ``beta[1]``, ..."""
    out: dict[str, np.ndarray] = {}
    for name in posterior.data_vars:
        values = np.asarray(posterior[name].values, dtype="float64")
        flat = values.reshape(values.shape[0], values.shape[1], -1)
        if values.ndim == 2:
            out[str(name)] = flat[:, :, 0]
            continue
        for i in range(flat.shape[2]):
            index = ",".join(str(j + 1) for j in np.unravel_index(i, values.shape[2:]))
            out[f"{name}[{index}]"] = flat[:, :, i]
    return out


def ess_mean(draws: np.ndarray) -> float:
    """ESS of the mean of ``draws (chain, draw)``, as ArviZ computes it."""
    return float(az.ess(np.asarray(draws, dtype="float64"), method="mean"))


def summarise(posterior: Any) -> dict[str, dict[str, float]]:
    """Mean, sd and ESS of the mean of every scalar in ``posterior``."""
    return {
        name: {
            "mean": float(x.mean()),
            "sd": float(x.std(ddof=1)),
            "ess_bulk": ess_mean(x),
        }
        for name, x in stan_names(posterior).items()
    }

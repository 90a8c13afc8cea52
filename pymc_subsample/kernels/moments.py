"""Running sample moments of per-row log-ratios, merged batch by batch without cancellation."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["RunningMoments", "add_batch"]


class RunningMoments(NamedTuple):
    """Number, mean and sum of squared deviations (M2) of the values seen so far."""

    n_values: int
    mean: float
    sum_sq_dev: float


EMPTY = RunningMoments(0, 0.0, 0.0)


def add_batch(moments: RunningMoments, values: np.ndarray) -> RunningMoments:
    """Merge a batch into running moments (Chan, Golub and LeVeque's pairwise update).

    Examples
    --------
    >>> m = add_batch(add_batch(EMPTY, np.array([1.0, 2.0])), np.array([3.0, 4.0]))
    >>> m.n_values, m.mean, m.sum_sq_dev
    (4, 2.5, 5.0)

    """
    n_batch = values.size
    if n_batch == 0:
        return moments
    batch_mean = float(values.sum()) / n_batch
    n_values = moments.n_values + n_batch
    if not math.isfinite(batch_mean):  # a NaN or infinite value: the caller rejects
        return RunningMoments(n_values, batch_mean, math.nan)
    batch_sq_dev = float(np.square(values - batch_mean).sum())
    delta = batch_mean - moments.mean
    mean = moments.mean + delta * n_batch / n_values
    sum_sq_dev = (
        moments.sum_sq_dev + batch_sq_dev + delta**2 * moments.n_values * n_batch / n_values
    )
    return RunningMoments(n_values, mean, sum_sq_dev)

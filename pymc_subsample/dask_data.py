"""``pms.dask_data``: a model's row data held by Dask (or Zarr), never loaded into the model.

``docs/data_beyond_ram.md``, "Data on Dask", for how to use it; ``model/dask_rows.py`` and
``model/dask_pass.py`` for how the steps read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
from pytensor.compile.sharedvalue import SharedVariable

__all__ = ["PLACEHOLDER_ROWS", "dask_data"]

#: Rows of the Dask array the model itself holds: PyMC needs values of the data's shape to
#: build the model; the steps read every row from Dask.
PLACEHOLDER_ROWS = 1_000


def dask_data(name: str, values: Any, *, dims: Sequence[str] | str | None = None) -> SharedVariable:
    """Register row data held by Dask in the model, as ``pm.Data`` does for arrays in memory.

    The model holds the first :data:`PLACEHOLDER_ROWS` rows (PyMC builds the model on them);
    the steps of this package read every row from Dask: their passes over every row run as
    Dask tasks on the cluster that holds the chunks, and the draws' rows are fetched ahead of
    the draws. Every row-aligned array of the model (covariates and observed values) must be
    given this way. Sample with ``cores=1``: the chains share the process and its fetches,
    and the cluster shares the passes.

    Parameters
    ----------
    name : str
        The data's name in the model.
    values : dask.array.Array, zarr.Array or array-like
        The rows, on the first axis. A Zarr (or HDF5) array is wrapped with
        ``dask.array.from_array`` on its own chunks; a Dask DataFrame's column
        (``df["x"]``) or frame is converted with ``to_dask_array(lengths=True)``.
    dims : str or sequence of str, optional
        The data's dims, as for ``pm.Data``; the first is the rows'. Do not give that dim
        coordinates of all N rows in the model's ``coords``.

    Returns
    -------
    SharedVariable
        The model's data variable (holding the placeholder's rows); use it in the model as
        a ``pm.Data`` variable.

    Raises
    ------
    ImportError
        If Dask is not installed (``pip install "pymc-subsample[dask]"``).
    ValueError
        If the array's chunk sizes are unknown, or it has no rows.

    Notes
    -----
    What reads the model's own data sees the placeholder's rows: the ``observed_data``
    group of the result, ``pm.sample_posterior_predictive``, and ``pm.sample``'s samplers
    other than this package's steps. ``pm.set_data`` cannot replace data on Dask; build the
    model again instead.

    Examples
    --------
    >>> import dask.array as da
    >>> import pymc as pm
    >>> import pymc_subsample as pms
    >>> X = da.random.default_rng(0).normal(size=(20_000, 3), chunks=(5_000, 3))
    >>> y = (X.sum(axis=1) > 0).astype("int8")
    >>> with pm.Model() as model:
    ...     X_rows = pms.dask_data("X", X)
    ...     y_rows = pms.dask_data("y", y)
    ...     beta = pm.Normal("beta", 0, 1, shape=3)
    ...     _ = pm.Bernoulli("obs", logit_p=X_rows @ beta, observed=y_rows)
    >>> X_rows.get_value().shape
    (1000, 3)
    """
    array = _as_dask_array(values, name)
    n_rows = array.shape[0]
    if n_rows == 0:
        raise ValueError(f"pms.dask_data({name!r}, ...) has no rows.")
    placeholder = np.ascontiguousarray(array[: min(n_rows, PLACEHOLDER_ROWS)].compute())
    data = pm.Data(name, placeholder, dims=dims)
    held = data.get_value(borrow=True)
    # The Dask array is kept in its own dtype: where the model holds another (PyMC casts
    # float32 covariates to float64; PyMC 5 keeps integers as int32) the rows are cast where
    # they are read (model/dask_rows.py), so that fetches send the stored bytes and a
    # persisted array's chunks stay the tasks' inputs.
    data.tag.dask_rows = array
    # The object the model holds: a pm.set_data would replace it (dask_rows.py checks).
    data.tag.dask_placeholder = held
    return data


def _as_dask_array(values: Any, name: str) -> Any:
    try:
        import dask.array as da
    except ImportError as error:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            'pms.dask_data needs Dask: pip install "pymc-subsample[dask]".'
        ) from error
    if hasattr(values, "to_dask_array"):  # a Dask DataFrame or Series
        values = values.to_dask_array(lengths=True)
    if not isinstance(values, da.Array):
        values = da.from_array(values, chunks=getattr(values, "chunks", None) or "auto")
    if values.ndim == 0:
        raise ValueError(
            f"pms.dask_data({name!r}, ...) needs rows on the first axis; got a scalar."
        )
    if any(np.isnan(size) for size in values.shape):
        raise ValueError(
            f"The Dask array given to pms.dask_data({name!r}, ...) has unknown chunk sizes "
            f"(shape {values.shape}), so its rows cannot be counted or drawn. Call "
            "array.compute_chunk_sizes() first, or convert a Dask DataFrame with "
            "df.to_dask_array(lengths=True)."
        )
    return values

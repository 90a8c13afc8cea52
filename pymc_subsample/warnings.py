"""The package's own warning class."""

from __future__ import annotations

__all__ = ["SubsampleWarning"]


class SubsampleWarning(UserWarning):
    """Warning about subsampled inference: cost, bias or a model that defeats subsampling.

    Filter it like any warning, for example
    ``warnings.simplefilter("error", pymc_subsample.SubsampleWarning)`` in tests.
    """

"""Pure NumPy/SciPy kernels: no PyMC or PyTensor import here (a test enforces it)."""

from pymc_subsample.kernels.austerity import (
    AusterityDecision,
    exact_mh_test,
    mean_standard_error,
    sequential_mh_test,
    t_test_error,
)
from pymc_subsample.kernels.moments import RunningMoments, add_batch
from pymc_subsample.kernels.row_sampler import RowSampler

__all__ = [
    "AusterityDecision",
    "RowSampler",
    "RunningMoments",
    "add_batch",
    "exact_mh_test",
    "mean_standard_error",
    "sequential_mh_test",
    "t_test_error",
]

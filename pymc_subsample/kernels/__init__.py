"""Pure NumPy/SciPy kernels: no PyMC or PyTensor import here (a test enforces it)."""

from pymc_subsample.kernels.austerity import (
    AusterityDecision,
    StageStatistics,
    exact_mh_test,
    sequential_mh_test,
    stage_statistics,
)
from pymc_subsample.kernels.proposals import RandomWalkProposal
from pymc_subsample.kernels.row_sampler import RowSampler

__all__ = [
    "AusterityDecision",
    "RandomWalkProposal",
    "RowSampler",
    "StageStatistics",
    "exact_mh_test",
    "sequential_mh_test",
    "stage_statistics",
]

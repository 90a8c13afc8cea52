"""Pure NumPy/SciPy kernels: no PyMC or PyTensor import here (a test enforces it)."""

from pymc_subsample.kernels.austerity import (
    AusterityDecision,
    exact_mh_test,
    sequential_mh_test,
)
from pymc_subsample.kernels.correction import (
    CorrectionDistribution,
    build_correction,
    correction_distribution,
    sample_correction,
)
from pymc_subsample.kernels.proposals import (
    IndependentProposal,
    LangevinProposal,
    RandomWalkProposal,
)
from pymc_subsample.kernels.row_sampler import RowSampler
from pymc_subsample.kernels.stages import (
    StageOutcome,
    StageStatistics,
    run_stages,
    stage_statistics,
)
from pymc_subsample.kernels.trajectory import HamiltonianProposal, leapfrog
from pymc_subsample.kernels.user_proposal import ProposalFunction, UserProposal

__all__ = [
    "AusterityDecision",
    "CorrectionDistribution",
    "HamiltonianProposal",
    "IndependentProposal",
    "LangevinProposal",
    "ProposalFunction",
    "RandomWalkProposal",
    "RowSampler",
    "StageOutcome",
    "StageStatistics",
    "UserProposal",
    "build_correction",
    "correction_distribution",
    "exact_mh_test",
    "leapfrog",
    "run_stages",
    "sample_correction",
    "sequential_mh_test",
    "stage_statistics",
]

"""Subsampling MCMC step methods for PyMC models of tall data.

Use a step with ``pm.sample``::

    import pymc as pm
    import pymc_subsample as pms

    with model:
        idata = pm.sample(step=pms.AusterityMH(error_tolerance=0.01, batch_size=500))
"""

from pymc_subsample.dask_data import dask_data
from pymc_subsample.kernels.design_programme import acceptance_error, operating_characteristics
from pymc_subsample.kernels.design_search import design_test
from pymc_subsample.kernels.test_design import (
    DesignChoice,
    OptimalDesign,
    ProposalSample,
    SequentialDesign,
)
from pymc_subsample.kernels.user_proposal import ProposalFunction
from pymc_subsample.plots import plot_data_usage
from pymc_subsample.reference import ReferencePoint, find_reference_point
from pymc_subsample.step_methods import (
    SGFS,
    AusterityGibbs,
    AusterityMH,
    GroupEffectsMH,
    MinibatchBarkerMH,
    PolynomialStepSize,
    ReversibleJumpMH,
)
from pymc_subsample.step_methods.acceptance_tests import AcceptanceTest
from pymc_subsample.step_methods.base import SubsampleMH
from pymc_subsample.step_methods.proposal_parts import ProposalPart, register_proposal
from pymc_subsample.warnings import SubsampleWarning

__version__ = "0.1.0"

__all__ = [
    "SGFS",
    "AcceptanceTest",
    "AusterityGibbs",
    "AusterityMH",
    "DesignChoice",
    "GroupEffectsMH",
    "MinibatchBarkerMH",
    "OptimalDesign",
    "PolynomialStepSize",
    "ProposalFunction",
    "ProposalPart",
    "ProposalSample",
    "ReferencePoint",
    "ReversibleJumpMH",
    "SequentialDesign",
    "SubsampleMH",
    "SubsampleWarning",
    "__version__",
    "acceptance_error",
    "dask_data",
    "design_test",
    "find_reference_point",
    "operating_characteristics",
    "plot_data_usage",
    "register_proposal",
]

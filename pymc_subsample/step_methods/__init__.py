"""PyMC step methods: argument checks, per-chain state and stats around the kernels."""

from pymc_subsample.step_methods.austerity import AusterityMH
from pymc_subsample.step_methods.barker import MinibatchBarkerMH
from pymc_subsample.step_methods.gibbs import AusterityGibbs
from pymc_subsample.step_methods.group_effects import GroupEffectsMH
from pymc_subsample.step_methods.reversible_jump import ReversibleJumpMH
from pymc_subsample.step_methods.sgfs import SGFS, PolynomialStepSize

__all__ = [
    "SGFS",
    "AusterityGibbs",
    "AusterityMH",
    "GroupEffectsMH",
    "MinibatchBarkerMH",
    "PolynomialStepSize",
    "ReversibleJumpMH",
]

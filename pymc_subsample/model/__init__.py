"""Model adapter: everything that touches PyMC and PyTensor graphs lives here."""

from pymc_subsample.model.oracle_builder import build_oracles
from pymc_subsample.model.oracles import ModelOracles
from pymc_subsample.model.rows import RowLayout, find_row_layout

__all__ = ["ModelOracles", "RowLayout", "build_oracles", "find_row_layout"]

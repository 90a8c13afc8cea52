"""Sphinx configuration: MyST notebooks executed at build time, numpydoc API reference."""

from __future__ import annotations

import pymc_subsample

project = "pymc-subsample"
author = "pymc-subsample developers"
copyright = "2026, pymc-subsample developers"
version = release = pymc_subsample.__version__

extensions = [
    "myst_nb",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
]
exclude_patterns = ["_build", "jupyter_execute", ".jupyter_cache"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

# Notebooks run at every build (CI builds with -W, so a failing cell fails the build).
nb_execution_mode = "force"
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_merge_streams = True

autosummary_generate = True
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = "pymc-subsample"
html_theme_options = {"navigation_with_keys": False}
suppress_warnings = ["mystnb.unknown_mime_type"]

"""A first run prints no warning the user cannot act on (issue 37, item 2).

The quickstart's model and call (``examples/quickstart.py``: ``pm.sample(step=
pms.AusterityMH())``, progress bar on), on fewer rows and draws, runs in a fresh Python with
``-W default`` and empty Numba caches (PyTensor's and this package's): the Numba functions are
compiled, not loaded, as on a user's first run. PyTensor's C modules come from its usual cache,
which only saves time (nothing compiled in C warned).

Before the fix, on Python 3.11 + PyMC 5 (pip install, no BLAS), stderr had PyTensor's "could not
link to a BLAS installation" warning (from the step's set-up) and Numba's "np.dot() is faster on
contiguous arrays" (from compiling the fused draw, after the set-up had dropped PyTensor's own
filter of it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytensor

#: A line as the warnings module prints it: "path:line: SomeWarning: message".
WARNING_LINE = re.compile(r":\d+: \w*Warning\b")

SCRIPT = textwrap.dedent(
    """
    import warnings

    # ArviZ's once-a-day notice of its coming refactor, printed by "import arviz" (PyMC
    # imports it) for every PyMC user: not this package's.
    warnings.filterwarnings("ignore", message=r"\\s*ArviZ is undergoing", category=FutureWarning)

    import numpy as np
    import pymc as pm

    import pymc_subsample as pms

    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(5_000), rng.normal(size=(5_000, 3))])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.array([-0.5, 1.0, -0.7, 0.3]))))
    with pm.Model():
        beta = pm.Normal("beta", 0.0, 2.0, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=X @ beta, observed=y)
        step = pms.AusterityMH()
        idata = pm.sample(draws=300, tune=300, chains=2, step=step, random_seed=1)
    print("draw path:", step.draw_path)
    print("rows per draw:", float(idata.sample_stats["n_data"].mean()))
    """
)


def test_quickstart_model_prints_no_warning(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "COLUMNS": "80",
        # Empty Numba caches: PyTensor's (under base_compiledir) and this package's kernels'.
        "PYTENSOR_FLAGS": f"base_compiledir={tmp_path / 'pytensor'},"
        f"compiledir={pytensor.config.compiledir}",
        "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
    }
    result = _run_fresh(SCRIPT, env)
    assert "draw path: fused" in result.stdout, result.stdout  # the quickstart's path
    assert (tmp_path / "pytensor" / "numba").is_dir()  # PyTensor's Numba cache was the new one
    warning_lines = [line for line in result.stderr.splitlines() if WARNING_LINE.search(line)]
    assert warning_lines == [], result.stderr


def _run_fresh(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh Python with ``-W default`` (``PYTHONWARNINGS`` unset)."""
    env = {key: value for key, value in env.items() if key != "PYTHONWARNINGS"}
    result = subprocess.run(
        [sys.executable, "-W", "default", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


HIERARCHY_SCRIPT = textwrap.dedent(
    """
    import warnings

    warnings.filterwarnings("ignore", message=r"\\s*ArviZ is undergoing", category=FutureWarning)

    import numpy as np
    import pymc as pm

    import pymc_subsample as pms

    rng = np.random.default_rng(6)
    group = rng.integers(0, 20, 4_000)
    x = rng.normal(size=4_000)
    y = rng.poisson(rng.gamma(2.0, np.exp(rng.normal(1.0, 0.5, 20)[group] + 0.4 * x) / 2.0))
    with pm.Model(coords={"group": np.arange(20)}):
        g = pm.Data("group_idx", group)
        covariate = pm.Data("x", x)
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        sigma_a = pm.HalfNormal("sigma_a", 1.0)
        a = pm.Normal("a", mu_a, sigma_a, dims="group")
        beta = pm.Normal("beta", 0.0, 1.0)
        alpha = pm.Exponential("alpha", 0.5)
        mu = pm.math.exp(a[g] + beta * covariate)
        pm.NegativeBinomial("y", mu=mu, alpha=alpha, observed=y)
        step = pms.AusterityMH()
    print("step:", type(step).__name__)
    """
)


def test_a_negative_binomial_hierarchy_builds_without_a_warning() -> None:
    # PyTensor looks for a BLAS the first time anything reads its flags, and prints a notice
    # on a pip install; in this model's set-up the first read was a sparse rewrite's
    # constraint while the rows' graph was simplified (outside the package's compiles). That
    # rewrite now runs with the notice silenced, as the compiles do; without it (tried,
    # PyMC 6) stderr has the notice. Caches as found: the notice does not depend on them.
    result = _run_fresh(HIERARCHY_SCRIPT, {**os.environ, "COLUMNS": "80"})
    assert "step: GroupEffectsMH" in result.stdout, result.stdout
    warning_lines = [line for line in result.stderr.splitlines() if WARNING_LINE.search(line)]
    assert warning_lines == [], result.stderr

"""What the package's helper processes share: when one may run, its environment, its end.

Two helpers compile ahead on another core while a step is built: ``kernels/warm_up.py`` the
package's own Numba kernels, ``model/compile_helper.py`` the set-up's PyTensor functions
(``docs/architecture.md``). Both run this package's code in a fresh interpreter, only where
this process has a second core, and are stopped and reaped at exit. Standard library only:
the kernel helper imports this module without the package's ``__init__``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["available_cores", "helper_command", "helper_environment", "stop_process"]

#: This package (the top of this module's name).
_PACKAGE = __name__.partition(".")[0]
#: Run first in a helper: this package importable without its ``__init__``, which imports
#: PyMC, the step methods and Dask's adapter (1.3 s of a helper's 2.2 s start), and the current
#: folder (``-c``'s first entry on the path) off the path, where a module's name could shadow
#: one the helper imports.
_WITHOUT_PACKAGE_INIT = f"""
import importlib.machinery, importlib.util, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
_package = importlib.util.module_from_spec(
    importlib.machinery.ModuleSpec({_PACKAGE!r}, None, is_package=True)
)
_package.__path__ = [{str(Path(__file__).resolve().parent)!r}]
sys.modules[{_PACKAGE!r}] = _package
"""


def available_cores() -> int:
    """Count the cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def helper_command(statement: str) -> list[str]:
    """Return the command that runs ``statement`` in a fresh interpreter, as a helper.

    ``statement`` imports what it runs from this package's modules, which the helper imports
    without the package's ``__init__``: a module it names runs its package's own
    ``__init__`` (``pymc_subsample.model``'s, say), not the top one.
    """
    return [sys.executable, "-c", _WITHOUT_PACKAGE_INIT + statement]


def helper_environment() -> dict[str, str]:
    """Return this process's environment with this package importable first.

    The helper is a fresh interpreter: this package's folder leads its ``PYTHONPATH``, so that
    it runs the same code as this process (an uninstalled checkout included), with the same
    PyTensor and Numba cache settings.
    """
    package_parent = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (package_parent, env.get("PYTHONPATH", "")) if part
    )
    return env


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Stop a helper process if it still runs, and reap it.

    Numba writes each cache file whole, under a temporary name first, so a stopped helper
    leaves none half written.
    """
    if process.poll() is None:
        process.kill()
    process.wait()

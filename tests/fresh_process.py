"""Run test code in a fresh interpreter on caches of its own (the compile caches' tests).

The compile helpers' and kernel warm-up's tests check what a first build on a machine
compiles, loads and leaves in the caches: each runs its code in a new process, with PyTensor's
compile directory and Numba's cache in a folder of the test's own, this checkout and the tests
folder importable first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def run_fresh(code: str, caches: Path, *options: str, timeout: float = 900) -> tuple[dict, str]:
    """Run ``code`` with ``python *options -c``; return its last line's JSON and its stderr.

    The run must succeed (its stderr's end is shown otherwise).
    """
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = str(caches / "numba")
    env["PYTENSOR_FLAGS"] = f"base_compiledir={caches / 'pytensor'}"
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPOSITORY), str(TESTS), env.get("PYTHONPATH")])
    )
    done = subprocess.run(
        [sys.executable, *options, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

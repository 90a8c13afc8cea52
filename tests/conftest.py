"""Shared fixtures: small PyMC models with exact posteriors."""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import numpy as np
import pymc as pm
import pytest

sys.path.insert(0, str(Path(__file__).parent))

EXAMPLES = Path(__file__).parents[1] / "examples"

T = TypeVar("T")


def example_module(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` once per process (importing it registers what it adds)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def linear_regression_data(n_rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=n_rows)
    return X, y


def linear_regression_posterior(X: np.ndarray, y: np.ndarray, prior_sd: float):
    """Exact posterior of beta for y ~ N(X beta, 1), beta ~ N(0, prior_sd^2 I)."""
    precision = X.T @ X + np.eye(X.shape[1]) / prior_sd**2
    cov = np.linalg.inv(precision)
    return cov @ X.T @ y, np.sqrt(np.diag(cov))


def linear_regression_model(X: np.ndarray, y: np.ndarray, prior_sd: float = 10.0) -> pm.Model:
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, prior_sd, shape=X.shape[1])
        pm.Normal("y", X @ beta, 1.0, observed=y)
    return model


@pytest.fixture(scope="session")
def small_regression():
    X, y = linear_regression_data(400, seed=1)
    return linear_regression_model(X, y), X, y


def computed_once_per_session(
    tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], T]
) -> T:
    """``compute()`` once per test session, shared by pytest-xdist's workers through a pickle.

    A module-scoped fixture is built once per worker, so two tests that read one long run would
    each make it when ``-n 2`` sends them to different workers. The first worker to ask computes
    it (holding a lock, so the other waits for it rather than computing it too) and saves it in
    the session's base temporary directory; the others load it. Without xdist, or without
    ``fcntl`` (Windows), each process computes its own.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return compute()
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' base temporary directories share this one
    saved = root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if saved.exists():
                return pickle.loads(saved.read_bytes())
            value = compute()
            saved.write_bytes(pickle.dumps(value))
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _no_compile_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the tests without the set-up's compile helper (``model/compile_helper.py``).

    The helper compiles on another core, where the test machine runs other work, and one
    helper for a whole session would keep every model's compiled code. Nothing a step
    computes depends on it (``test_compile_helper.py`` checks that, with the helper on).
    """
    from pymc_subsample.model import compile_helper

    monkeypatch.setattr(compile_helper, "_unavailable", True)

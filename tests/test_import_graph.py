"""The package's import graph: the step methods' parts read the step through its contracts.

``docs/architecture.md`` ("Contracts"): a step module (a step class) imports its parts, and a
part (a proposal, a test, the control variate, the fused draw, ...) reads the step only
through ``step_methods/contracts.py``, never through a step module, not even for type hints.
The graph is read from the source with ``ast``: imports at module level, those under
``if TYPE_CHECKING:`` included. Imports inside a function run when it is called, once every
module is loaded (the proposal parts' registration), and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "pymc_subsample"
STEP_METHODS = "pymc_subsample.step_methods"

#: Modules that define step classes (or a piece of one: ``control_choice``'s and
#: ``proposal_choice``'s base classes of ``SubsampleMH``; ``group_route``, which builds the
#: group step for ``SubsampleMH``): they may import any part.
STEPS = frozenset(
    f"{STEP_METHODS}.{name}"
    for name in (
        "base",
        "step_base",
        "control_choice",
        "proposal_choice",
        "austerity",
        "barker",
        "gibbs",
        "group_effects",
        "group_route",
        "reversible_jump",
        "sgfs",
    )
)
#: Modules (and packages, with every module inside them) that a step is made of: they may
#: import each other and ``contracts``, never a step module.
PARTS = frozenset(
    f"{STEP_METHODS}.{name}"
    for name in (
        "acceptance_tests",
        "arguments",
        "constructor",
        "contracts",
        "control",
        "defaults",
        "diagnostics",
        "fused_group_path",
        "fused_hyper_walk",
        "fused_path",
        "group_compiled",
        "group_expansion",
        "group_moves",
        "group_recentring",
        "group_sweep_drivers",
        "progress",
        "proposal_parts",
        "sgfs_checks",
        "sgfs_start",
        "stratification",
        "warning_relay",
    )
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run when the module is imported: into ``if``/``try``/``with``, not ``def``."""
    statements = []
    for node in body:
        statements.append(node)
        if isinstance(node, ast.If | ast.With):
            statements += _module_level(node.body + getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            statements += _module_level(node.body + handlers + node.orelse + node.finalbody)
    return statements


def imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports at module level (TYPE_CHECKING included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_in(path.read_text(), module, package)


def _imports_in(source: str, module: str, package: str) -> set[str]:
    found = set()
    for node in _module_level(ast.parse(source).body):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                # ``from package import module`` imports the module; else the name's module.
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


def _is_part(module: str) -> bool:
    return any(module == part or module.startswith(f"{part}.") for part in PARTS)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_every_step_methods_module_is_a_step_or_a_part():
    """A new module under step_methods/ is classified here, so the rules below cover it."""
    modules = {name for name in MODULES if name.startswith(f"{STEP_METHODS}.")}
    unclassified = sorted(name for name in modules if name not in STEPS and not _is_part(name))
    assert not unclassified, f"add to STEPS or PARTS: {unclassified}"
    assert STEPS <= modules
    assert PARTS <= modules


@pytest.mark.parametrize("part", sorted(name for name in MODULES if _is_part(name)))
def test_parts_import_no_step_module(part):
    assert not imports(part) & STEPS, (
        f"{part} imports {sorted(imports(part) & STEPS)}: annotate the step with "
        "step_methods/contracts.py's StepView instead"
    )


def test_import_graph_has_no_cycle():
    graph = {module: imports(module) for module in MODULES}
    assert not _cycles(graph), f"modules that import each other in a circle: {_cycles(graph)}"


def test_the_reader_finds_every_module_level_import():
    """``if TYPE_CHECKING:`` (what the circle was made of), relative and ``try`` imports; not
    an import inside a function."""
    source = """
from typing import TYPE_CHECKING
from . import control
from .proposal_parts import random_walk, ProposalPart
try:
    from ..warnings import warn_user
except ImportError:
    pass
if TYPE_CHECKING:
    from pymc_subsample.step_methods.base import SubsampleMH

def later():
    from pymc_subsample.step_methods import gibbs
"""
    found = _imports_in(source, f"{STEP_METHODS}.example", STEP_METHODS)
    assert found == {
        f"{STEP_METHODS}.control",
        f"{STEP_METHODS}.proposal_parts.random_walk",
        f"{STEP_METHODS}.proposal_parts",
        "pymc_subsample.warnings",
        f"{STEP_METHODS}.base",
    }

"""Imports point down the layers (docs/development.md, "Layers"): a package
imports only from the layers below it, never from one beside it or above it.
The one exception is the simulator's reference to the GNN cost model by name,
an import inside `cost_models.make_cost_model`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "disco_xla"

# Package -> layer; packages of one layer sit beside each other.
LAYERS = {
    "hlo": 1,
    "plan": 2,
    "hlo_passes": 3,
    "simulator": 3,
    "search": 4,
    "runtime": 4,
    "costmodel": 4,
    "profiling": 5,
    "plan_cache": 5,
    # What the public API's entry points share: the plan (cache, pipeline)
    # and the checked rewrite (runtime and search).
    "planning": 6,
    "checked_rewrite": 6,
}
# (file, package it may name though above it): imports inside a function only.
BY_NAME = {("simulator/cost_models.py", "costmodel")}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """The disco_xla packages `path` imports, each with whether the import is
    inside a function."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.ImportFrom) and child.module:
                names = [child.module]
                if child.module == "disco_xla":
                    names = [f"disco_xla.{alias.name}" for alias in child.names]
            elif isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            else:
                names = []
            for name in names:
                parts = name.split(".")
                if parts[0] == "disco_xla" and len(parts) > 1:
                    found.append((parts[1], inside))
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def test_imports_point_down_the_layers():
    wrong = []
    for package, layer in LAYERS.items():
        root = PACKAGE / package
        paths = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
        for path in paths:
            relative = path.relative_to(PACKAGE).as_posix()
            for imported, in_function in _imports(path):
                if imported == package or imported not in LAYERS:
                    continue
                if LAYERS[imported] < layer:
                    continue
                if (relative, imported) in BY_NAME and in_function:
                    continue
                wrong.append(f"{relative} imports disco_xla.{imported}")
    assert not wrong, "\n".join(wrong)


def test_the_simulator_names_the_cost_model_only_inside_a_function():
    imports = _imports(PACKAGE / "simulator" / "cost_models.py")
    assert ("costmodel", True) in imports
    assert ("costmodel", False) not in imports

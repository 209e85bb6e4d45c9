"""Imports point down the layers (docs/development.md, "Layers"): a package
imports only from the layers below it, never from one beside it or above it;
each layer is a folder, and the package root holds only the public API and
its leaves.
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
    # What the entry points share: the plan (cache, pipeline) and the measuring
    # of its candidates (runtime and search).
    "driver": 6,
    # Where users meet it: jit, tf_function and the env hook; the CLI beside them.
    "frontends": 7,
    "cli": 7,
}
# The package root: the public API, errors and settings, and the leaf modules
# every layer may use (capture, timing), and the demo. Everything else lives in
# its layer's folder.
ROOT_MODULES = {
    "__init__.py",
    "capture.py",
    "demo.py",
    "errors.py",
    "settings.py",
    "timing.py",
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


def test_the_root_holds_only_the_public_api_and_the_leaves():
    found = {path.name for path in PACKAGE.glob("*.py")}
    assert found == ROOT_MODULES
    assert len(found) <= 8
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    assert {"driver", "frontends", "cli"} <= folders


def test_no_module_is_over_500_lines_and_no_function_over_60():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        relative = path.relative_to(PACKAGE).as_posix()
        if text.count("\n") > 500:
            too_long.append(f"{relative}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    too_long.append(f"{relative}: {node.name} has {length} lines")
    assert not too_long, "\n".join(too_long)

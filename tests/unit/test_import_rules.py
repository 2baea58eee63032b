"""The project's own modules are imported at the top of a module, where a reader sees what it
depends on and import-linter (.importlinter) holds the layers; an import inside a function says
on its line, or the line above, why it waits (an optional dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = ("broker", "inside_job", "klique")


def _own(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in OWN
    return any(alias.name.split(".")[0] in OWN for alias in node.names)


def unexplained_imports(source: str) -> list[int]:
    """Lines of imports of the project's modules inside functions with no comment saying why."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and _own(node):
                said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith(
                    "#"
                )
                if not said:
                    found.append(node.lineno)
    return sorted(set(found))


def test_the_check_sees_an_unexplained_import_and_passes_an_explained_one() -> None:
    source = (
        "def a():\n    from broker import domain\n"
        "def b():\n    from broker import server  # the server extra is optional\n"
        "def c():\n    import json\n"
    )
    assert unexplained_imports(source) == [2]


def test_no_module_imports_the_project_inside_a_function_without_saying_why() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in OWN
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in unexplained_imports(path.read_text())
    ]
    assert found == [], "move these imports to the top of their module, or say why they wait"

"""The client (`pip install klique`: the CLI's user commands and the SDK) loads none of the
server extra's packages and keeps to what Python 3.8 runs. tests/integration/test_slim_client.py
runs it on a real 3.8 where the machine has one; these checks hold without one."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli.server_extra import SERVER_PACKAGES, missing_server

ROOT = Path(__file__).resolve().parents[2]

# What `klique` loads to start, asked of a fresh interpreter: the modules of the project and the
# top-level packages of everything else.
LOADED = """
import json, sys
before = set(sys.modules)
import broker.console
loaded = sorted(set(sys.modules) - before)
print(json.dumps({
    "own": [m for m in loaded if m.split(".")[0] in ("broker", "klique", "inside_job")],
    "packages": sorted({m.split(".")[0] for m in loaded}),
}))
"""

# Names that came after Python 3.8: attributes and call keywords the client must not use.
NEWER_ATTRIBUTES = {
    "removeprefix": "3.9",
    "removesuffix": "3.9",
    "is_relative_to": "3.9",
    "with_stem": "3.9",
    "to_thread": "3.9",
    "StrEnum": "3.11",
    "pairwise": "3.10",
    "bit_count": "3.10",
    "file_digest": "3.11",
    "batched": "3.12",
    "UTC": "3.11",
}
NEWER_KEYWORDS = {"strict": "3.10 (zip)", "kw_only": "3.10", "slots": "3.10"}
NEWER_MODULES = {"zoneinfo": "3.9", "graphlib": "3.9", "tomllib": "3.11"}
BUILTIN_GENERICS = {"dict", "list", "tuple", "set", "frozenset", "type"}
TYPE_NAMES = BUILTIN_GENERICS | {"int", "float", "str", "bytes", "bool", "None"}


def loaded_by_the_cli() -> dict[str, list[str]]:
    found = subprocess.run(
        [sys.executable, "-c", LOADED], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(found.stdout)  # type: ignore[no-any-return]


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of nodes inside annotations, which `from __future__ import annotations` leaves
    as text on every Python."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        notes: list[ast.expr | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            notes = [node.returns, *(a.annotation for a in every)]
        elif isinstance(node, ast.AnnAssign):
            notes = [node.annotation]
        for note in notes:
            if note is not None:
                inside.update(id(sub) for sub in ast.walk(note))
    return inside


def _guarded(tree: ast.AST) -> set[int]:
    """The ids of nodes in `try` bodies that catch ImportError: a fallback for older Pythons."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "AttributeError")
            for h in node.handlers
        ):
            for statement in node.body:
                inside.update(id(sub) for sub in ast.walk(statement))
    return inside


def newer_than_38(source: str, name: str = "<source>") -> list[str]:
    """What in `source` Python 3.8 cannot parse or run: one line each, LINE: what (since)."""
    try:
        tree = ast.parse(source, name, feature_version=(3, 8))
    except SyntaxError as exc:
        return [f"{exc.lineno}: syntax Python 3.8 cannot parse ({exc.msg})"]
    in_annotation, guarded = _annotations(tree), _guarded(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in in_annotation or id(node) in guarded:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and node.attr in NEWER_ATTRIBUTES:
            found.append(f"{line}: .{node.attr} (Python {NEWER_ATTRIBUTES[node.attr]})")
        elif isinstance(node, ast.keyword) and node.arg in NEWER_KEYWORDS:
            found.append(f"{line}: {node.arg}= (Python {NEWER_KEYWORDS[node.arg]})")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for module in names:
                top = module.split(".")[0]
                if top in NEWER_MODULES:
                    found.append(f"{line}: import {top} (Python {NEWER_MODULES[top]})")
                elif top in NEWER_ATTRIBUTES:
                    found.append(f"{line}: import {top} (Python {NEWER_ATTRIBUTES[top]})")
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in BUILTIN_GENERICS
        ):
            found.append(f"{line}: {node.value.id}[...] at run time (Python 3.9)")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            sides = (node.left, node.right)
            if any(_type_name(side) for side in sides):
                found.append(f"{line}: X | Y of types at run time (Python 3.10)")
    return sorted(found, key=lambda problem: int(problem.split(":")[0]))


def _type_name(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    return isinstance(node, ast.Name) and node.id in TYPE_NAMES


def test_the_check_finds_what_python_38_cannot_run_and_passes_what_it_can() -> None:
    newer = (
        "import enum\nclass S(enum.StrEnum): pass\n"  # 2
        "Params = dict[str, int]\n"  # 3
        "x = 'a'.removeprefix('b')\n"  # 4
        "y = list(zip([1], [2], strict=True))\n"  # 5
        "ok = isinstance(1, int | float)\n"  # 6
        "import tomllib\n"  # 7
        "match x:\n    case _: pass\n"  # 8, 9
    )
    assert newer_than_38(newer) == [
        "9: syntax Python 3.8 cannot parse (Pattern matching is only supported in Python 3.10 "
        "and greater)"
    ]
    found = newer_than_38(newer.split("match")[0])
    assert [line.split(":")[0] for line in found] == ["2", "3", "4", "5", "6", "7"], found
    older = (
        "from __future__ import annotations\nfrom typing import Dict\n"
        "try:\n    from enum import StrEnum\nexcept ImportError:\n    StrEnum = str\n"
        "def f(a: dict[str, int] | None, *b: list[int]) -> tuple[int, ...] | None:\n"
        "    value: int | None = None\n    return None\n"
        "Params = Dict[str, int]\nflags = 1 | 2\n"
    )
    assert newer_than_38(older) == []


def test_klique_starts_without_the_server_extra() -> None:
    loaded = loaded_by_the_cli()
    server_side = sorted(set(loaded["packages"]) & SERVER_PACKAGES)
    assert server_side == [], f"`klique` loads the server extra's {server_side}"
    server_modules = [
        m
        for m in loaded["own"]
        if m.startswith(("broker.estate", "broker.units", "broker.server", "broker.store"))
    ]
    assert server_modules == []


def test_every_module_the_client_loads_runs_on_python_38() -> None:
    own = [*loaded_by_the_cli()["own"], "broker.cli.server_extra", "broker.identity.device"]
    problems = []
    for module in sorted(set(own)):
        path = ROOT / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for problem in newer_than_38(path.read_text(), str(path)):
            problems.append(f"{path.relative_to(ROOT)}:{problem}")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("package", ["pydantic", "sqlalchemy.orm", "fastapi", "yaml"])
def test_a_missing_package_of_the_server_extra_is_one_line_naming_the_fix(package: str) -> None:
    hint = missing_server(ModuleNotFoundError(f"No module named {package!r}", name=package), "db")
    assert hint is not None and "\n" not in hint
    assert hint.startswith("`klique db` runs the server's side")
    assert "pip install 'klique[server]'" in hint


def test_any_other_error_keeps_its_traceback() -> None:
    numpy = ModuleNotFoundError("No module named 'numpy'", name="numpy")
    assert missing_server(numpy, "server") is None
    assert missing_server(ImportError("cannot import name 'x'"), "server") is None
    assert missing_server(ModuleNotFoundError("no name"), "server") is None

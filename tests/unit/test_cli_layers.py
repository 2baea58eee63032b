"""The CLI's layers: `klique` and every command's --help load none of the server stack (the
client will run without it), and the CLI never imports the demo, which drives it from above."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Imports broker.cli, asks for the help of the group and of every command in it, and prints
# which modules that loaded.
HELP_EVERYWHERE = """
import json, sys
import click
import broker.cli

def paths(group, path):
    yield path
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from paths(command, [*path, name])
        else:
            yield [*path, name]

for path in paths(broker.cli.main, []):
    try:
        broker.cli.main([*path, "--help"], prog_name="klique")
    except SystemExit as exc:
        assert exc.code == 0, (path, exc.code)
print(json.dumps(sorted(sys.modules)))
"""

SERVER_STACK = ("fastapi", "sqlalchemy", "uvicorn", "starlette", "alembic")
SERVER_MODULES = ("broker.store", "broker.api", "broker.server", "broker.pools", "broker.estate")


def loaded_by(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return modules


def within(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def test_help_loads_none_of_the_server_stack() -> None:
    modules = loaded_by(HELP_EVERYWHERE)
    assert "broker.cli.submit" in modules and "broker.cli.platform" in modules  # it ran
    assert within(modules, SERVER_STACK) == []
    assert within(modules, SERVER_MODULES) == []
    assert within(modules, ("broker.demo", "broker.console")) == []


def imported_by(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code (functions' imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_cli_never_imports_the_demo() -> None:
    files = sorted((ROOT / "broker" / "cli").glob("*.py"))
    assert files
    for path in files:
        found = within(sorted(imported_by(path)), ("broker.demo", "broker.console"))
        assert found == [], path


def test_the_client_side_modules_import_no_server_module() -> None:
    """Only the platform's commands run the server stack, and load it when they run."""
    client_side = ["broker/client.py", "broker/config.py"] + [
        f"broker/cli/{name}.py"
        for name in ("__init__", "submit", "tasks", "apps", "sdk", "login", "output", "tokens")
    ]
    for name in client_side:
        names = sorted(imported_by(ROOT / name))
        assert within(names, SERVER_STACK + SERVER_MODULES) == [], name


def test_the_console_command_adds_the_demo() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker", "demo", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Start a local server if none runs" in done.stdout
    assert "--stop" in done.stdout

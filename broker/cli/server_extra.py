"""Whether the server stack is installed: `pip install klique` gives the client (the user
commands and the SDK), `pip install 'klique[server]'` adds what the platform commands load when
they run. One run without it ends in one line that names the fix, not in a traceback."""

from __future__ import annotations

import sys

# The import names of the server extra's packages (pyproject.toml's `server`) and of what they
# bring with them that the server's modules import themselves.
SERVER_PACKAGES = frozenset(
    {
        "alembic",
        "asyncssh",
        "authlib",
        "fastapi",
        "fsspec",
        "httptools",
        "jinja2",
        "joserfc",
        "jsonschema",
        "ldap3",
        "lightkube",
        "mcp",
        "multipart",
        "pydantic",
        "pydantic_core",
        "python_multipart",
        "sqlalchemy",
        "starlette",
        "uvicorn",
        "websockets",
        "yaml",
    }
)
SERVER_PYTHON = (3, 11)  # the server's own modules use what came with Python 3.11
# The commands that run the server's side here; on an older Python they cannot even import it.
SERVER_COMMANDS = frozenset({"server", "agent", "estate", "template", "policy", "db", "demo"})
# How the server's modules fail to load: a missing package, or an older Python's import,
# syntax or typing error.
LOAD_ERRORS = (ImportError, SyntaxError, TypeError)


def missing_server(exc: Exception, command: str | None) -> str | None:
    """The one line to print when `exc` says the server's side is not installed (a package of
    the server extra is missing, or a server command ran on a Python older than 3.11), else
    None: any other error is a fault, and keeps its traceback."""
    old_python = sys.version_info < SERVER_PYTHON
    if not (_server_package_missing(exc) or (old_python and command in SERVER_COMMANDS)):
        return None
    what = f"`klique {command}`" if command else "this command"
    fix = "pip install 'klique[server]'"
    if old_python:
        running = ".".join(str(part) for part in sys.version_info[:2])
        fix = f"on Python 3.11 or newer (this is {running}), {fix}"
    return f"{what} runs the server's side, which is not installed here; fix: {fix}"


def _server_package_missing(exc: Exception) -> bool:
    return (
        isinstance(exc, ModuleNotFoundError)
        and bool(exc.name)
        and str(exc.name).partition(".")[0] in SERVER_PACKAGES
    )

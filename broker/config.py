"""Where Klique keeps its files, and which API the CLI talks to."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT = 8765


def home() -> Path:
    """`$KLIQUE_HOME`, default `~/.klique`."""
    return Path(os.environ.get("KLIQUE_HOME") or "~/.klique").expanduser()


def api_url() -> str:
    return (os.environ.get("KLIQUE_API") or f"http://127.0.0.1:{DEFAULT_PORT}").rstrip("/")


def store_url() -> str:
    """`$KLIQUE_DB` (a SQLAlchemy URL, postgresql:// accepted), default SQLite in the home."""
    return os.environ.get("KLIQUE_DB") or f"sqlite:///{home() / 'klique.db'}"


def write_private(path: Path, text: str) -> None:
    """Write a file readable by this account only, private from its first byte (created with
    mode 600 under a temporary name, then renamed: no chmod after the write)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)

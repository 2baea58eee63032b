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

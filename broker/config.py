"""Where Klique keeps its files, and which API the CLI talks to."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from broker.errors import KliqueError

DEFAULT_PORT = 8765


def home() -> Path:
    """`$KLIQUE_HOME`, default `~/.klique`."""
    return Path(os.environ.get("KLIQUE_HOME") or "~/.klique").expanduser()


DEFAULT_PROFILE = "default"
_chosen_profile: str | None = None  # `klique --profile NAME`


def use_profile(name: str | None) -> None:
    """Make `name` this process's profile (`klique --profile`), over $KLIQUE_PROFILE."""
    global _chosen_profile
    _chosen_profile = name


def chosen_profile() -> str | None:
    """The profile asked for by name (--profile, else $KLIQUE_PROFILE), or None."""
    return _chosen_profile or os.environ.get("KLIQUE_PROFILE") or None


def profile() -> str:
    return chosen_profile() or DEFAULT_PROFILE


def credentials_path() -> Path:
    return home() / "credentials.json"


def saved_credentials() -> dict[str, Any]:
    """The credentials file: tokens by server URL, and `profiles`, each profile's server (a
    file from before profiles has tokens alone and reads the same)."""
    try:
        saved = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def profile_server(name: str) -> str | None:
    """The server `klique login` kept for profile `name`."""
    profiles = saved_credentials().get("profiles")
    url = profiles.get(name) if isinstance(profiles, dict) else None
    return url if isinstance(url, str) else None


def api_url() -> str:
    """Which server the CLI talks to: a profile asked for by name, else $KLIQUE_API, else the
    default profile's server (the last `klique login`), else the local server."""
    named = chosen_profile()
    if named is not None:
        url = profile_server(named)
        if url is None:
            raise KliqueError(
                f"profile {named} has no server yet; fix: klique --profile {named} login --api URL"
            )
        return url.rstrip("/")
    url = os.environ.get("KLIQUE_API") or profile_server(DEFAULT_PROFILE)
    return (url or f"http://127.0.0.1:{DEFAULT_PORT}").rstrip("/")


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

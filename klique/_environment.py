"""Where a run comes from: its script and arguments, its code (git checkout, or folder) and
the packages installed in its interpreter."""

from __future__ import annotations

import json
import os
import sys

from klique import _capture

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

PYTHON = "python3"  # what runs the script in a job: the environment's, or the node's
# Installed with the interpreter, or by Klique itself in every job: never sent as requirements.
_NOT_SENT = {"pip", "klique", "setuptools", "wheel", "distribute"}


def script() -> Optional[str]:
    """The script this process runs, or None (an interactive session, `python -c`)."""
    path = sys.argv[0] if sys.argv else ""
    return os.path.abspath(path) if path and os.path.isfile(path) else None


def origin(path: Optional[str] = None) -> Dict[str, Any]:
    """{name, command, code} of the script `path` (default: this process's): the command runs
    in the folder the code lands in, as it would here."""
    path = path or script()
    if path is None:
        return {"name": "interactive", "command": None, "code": None}
    folder = os.path.dirname(path)
    cwd = os.getcwd()
    top = _capture.top_level(folder)
    inside = top is not None and _within(cwd, top)
    base = cwd if inside or top is None and _within(path, cwd) else folder
    code = _capture.capture(base) if top is not None else {"workdir": base, "subdir": ""}
    command = [PYTHON, os.path.relpath(path, base), *sys.argv[1:]]
    return {"name": os.path.basename(path), "command": command, "code": code}


def _within(path: str, folder: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip("/") + "/")


def installed_packages() -> List[str]:
    """name==version of every distribution this interpreter sees."""
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.add(f"{name}=={dist.version}")
    return sorted(found, key=str.lower)


def requirements_to_send() -> List[str]:
    """What a remote run installs: a virtual environment's own packages (those a package index
    serves: not editable or local ones, nor Klique), or nothing for a system interpreter,
    whose packages are the node's own."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return []
    from importlib import metadata

    sent = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or name.lower() in _NOT_SENT or _installed_from_a_folder(dist):
            continue
        sent.add(f"{name}=={dist.version}")
    return sorted(sent, key=str.lower)


def _installed_from_a_folder(dist: Any) -> bool:
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return False
    return isinstance(direct, dict) and str(direct.get("url", "")).startswith("file:")

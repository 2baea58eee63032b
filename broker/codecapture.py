"""Capture the code a task runs from the user's git checkout (see klique/_capture.py, which
the SDK shares): remote, commit, uncommitted diff."""

from __future__ import annotations

from pathlib import Path

from broker.domain import CodeSpec
from broker.errors import KliqueError
from klique import _capture
from klique._api import KliqueError as SDKError


def capture(cwd: Path) -> CodeSpec | None:
    """The checkout around `cwd`, or None when `cwd` is not in a git repository."""
    try:
        found = _capture.capture(str(cwd))
    except SDKError as exc:
        raise KliqueError(str(exc)) from None
    return CodeSpec(**found) if found is not None else None


def remote_commit(repo: str, ref: str) -> str:
    try:
        return _capture.remote_commit(repo, ref)
    except SDKError as exc:
        raise KliqueError(str(exc)) from None

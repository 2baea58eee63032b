"""Capture the code a task runs from the user's git checkout: remote, commit, uncommitted diff."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from broker.domain import CodeSpec
from broker.errors import KliqueError


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise KliqueError(f"git {args[0]} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout


def capture(cwd: Path) -> CodeSpec | None:
    """The checkout around `cwd`, or None when `cwd` is not in a git repository.

    The diff holds staged, unstaged and untracked (not ignored) changes against HEAD; it is
    taken through a scratch index so the user's own index is left as it was.
    """
    probe = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return None
    top = Path(probe.stdout.strip())
    try:
        commit = _git(top, "rev-parse", "HEAD").strip()
    except KliqueError:
        raise KliqueError(
            f"the git repository at {top} has no commit yet; commit once, or submit with --no-code"
        ) from None
    remote = subprocess.run(
        ["git", "remote", "get-url", "origin"], cwd=top, capture_output=True, text=True, check=False
    )
    repo = remote.stdout.strip() if remote.returncode == 0 else str(top)
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        _git(top, "read-tree", "HEAD", env=env)
        _git(top, "add", "-A", env=env)
        diff = _git(top, "diff", "--cached", "--binary", "HEAD", env=env)
    subdir = os.path.relpath(cwd.resolve(), top.resolve())
    return CodeSpec(repo=repo, commit=commit, diff=diff, subdir="" if subdir == "." else subdir)

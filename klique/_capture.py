"""The code a run uses, from the git checkout around it: the remote (or the checkout's path),
the commit, and the uncommitted changes as one binary diff taken through a scratch index (the
user's own index is left alone). `klique submit` and `Task.init` capture the same way."""

from __future__ import annotations

import os
import subprocess
import tempfile

from klique._api import KliqueError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional


def _git(cwd: str, *args: str, env: Optional[Dict[str, str]] = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise KliqueError(f"git {args[0]} failed in {cwd}: {done.stderr.strip()}")
    return done.stdout


def top_level(cwd: str) -> Optional[str]:
    """The checkout's top folder, or None when cwd is not in a git repository."""
    probe = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def capture(cwd: str) -> Optional[Dict[str, Any]]:
    """{repo, commit, diff, workdir, subdir} of the checkout around cwd; None outside one."""
    top = top_level(cwd)
    if top is None:
        return None
    try:
        commit = _git(top, "rev-parse", "HEAD").strip()
    except KliqueError:
        raise KliqueError(
            f"the git repository at {top} has no commit yet; commit once, or submit with --no-code"
        ) from None
    remote = subprocess.run(
        ["git", "remote", "get-url", "origin"], cwd=top, capture_output=True, text=True, check=False
    )
    repo = remote.stdout.strip() if remote.returncode == 0 else top
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, GIT_INDEX_FILE=os.path.join(scratch, "index"))
        _git(top, "read-tree", "HEAD", env=env)
        _git(top, "add", "-A", env=env)
        diff = _git(top, "diff", "--cached", "--binary", "HEAD", env=env)
    subdir = os.path.relpath(os.path.realpath(cwd), os.path.realpath(top))
    return {
        "repo": repo,
        "commit": commit,
        "diff": diff,
        "workdir": None,
        "subdir": "" if subdir == "." else subdir,
    }


def remote_commit(repo: str, ref: str) -> str:
    """The commit a branch (or tag, or HEAD) of a repository that is not checked out names."""
    out = _git(os.getcwd(), "ls-remote", "--", repo, ref)
    for line in out.splitlines():
        commit, _, name = line.partition("\t")
        if name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}"):
            return commit
    raise KliqueError(f"{repo} has no branch or tag {ref!r}; fix: check --branch")

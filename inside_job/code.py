"""The task's code: its folder, or a clone at a commit (through a cached mirror) plus a diff."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess

from inside_job.errors import SetupFailed, telling_line
from inside_job.locks import FileLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from inside_job.jobfiles import Console
    from inside_job.spec import CodeSpec

CLONE_DIR = "code"
_FILE_ERRORS = re.compile(
    r"^(?:error: patch failed: (?P<failed>.+):\d+"
    r"|error: (?P<named>.+?): (?:patch does not apply|does not exist in index"
    r"|No such file or directory|already exists in (?:working directory|index)"
    r"|does not match index|wrong type)"
    r"|U (?P<conflict>.+))$",
    re.MULTILINE,
)


def materialise(
    code: CodeSpec | None, job_dir: str, cache_dir: str, console: Console, name: str = CLONE_DIR
) -> str:
    """Make the code ready in job_dir/name and return the folder the task runs in (each node
    of a task on several nodes checks out its own: `code.rankN`)."""
    if code is None:
        return job_dir
    if code.workdir is not None:
        if not os.path.isdir(code.workdir):
            raise SetupFailed(f"workdir does not exist: {code.workdir}")
        return code.workdir
    assert code.repo is not None and code.commit is not None
    mirror, how = update_mirror(code.repo, code.commit, cache_dir)
    console.say(f"code {code.repo} at {code.commit[:12]} (mirror {how})")
    dest = os.path.join(job_dir, name)
    checkout(mirror, code.commit, dest)
    if code.diff.strip():
        apply_diff(dest, code.diff, code.commit, dest + ".diff")
    return _subdir(dest, code.subdir)


def mirror_path(repo: str, cache_dir: str) -> str:
    digest = hashlib.sha256(repo.encode("utf-8")).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(repo.rstrip("/")))[:40]
    return os.path.join(cache_dir, "git", f"{name}-{digest}.git")


def update_mirror(repo: str, commit: str, cache_dir: str) -> tuple[str, str]:
    """Ensure the mirror holds commit; returns (mirror, 'cloned' | 'fetched' | 'cached')."""
    mirror = mirror_path(repo, cache_dir)
    os.makedirs(os.path.dirname(mirror), exist_ok=True)
    with FileLock(mirror + ".lock"):
        if not os.path.isdir(mirror):
            _clone_mirror(repo, mirror)
            how = "cloned"
        elif _has_commit(mirror, commit):
            return mirror, "cached"
        else:
            _git(["fetch", "--quiet", "origin"], mirror, f"fetching {repo}")
            how = "fetched"
        if not _has_commit(mirror, commit):
            _try_fetch_commit(mirror, commit)
        if not _has_commit(mirror, commit):
            raise SetupFailed(f"commit {commit} not found in {repo}")
    return mirror, how


def checkout(mirror: str, commit: str, dest: str) -> None:
    """A working clone at commit that borrows the mirror's objects (git clone --shared)."""
    if os.path.exists(dest):
        shutil.rmtree(dest)  # a requeued job starts from a clean clone
    _git(["clone", "--quiet", "--shared", "--no-checkout", "--", mirror, dest], None, "cloning")
    _git(
        ["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit],
        dest,
        f"checking out {commit}",
    )


def apply_diff(dest: str, diff: str, commit: str, patch: str) -> None:
    """Apply the diff (written to `patch`) with a three-way merge (git falls back to a plain
    apply by itself)."""
    with open(patch, "w", encoding="utf-8") as f:
        f.write(diff if diff.endswith("\n") else diff + "\n")
    result = _run_git(["apply", "--3way", "--whitespace=nowarn", patch], dest)
    if result.returncode == 0:
        return
    _run_git(["reset", "--quiet", "--hard", commit], dest)
    files = failed_files(result.stdout + result.stderr)
    what = ", ".join(files) if files else telling_line(result.stderr)
    raise SetupFailed(f"the diff does not apply to {commit[:12]}: {what}")


def failed_files(output: str) -> list[str]:
    """The files named in git apply's complaints, in order, once each."""
    files: list[str] = []
    for match in _FILE_ERRORS.finditer(output):
        name = match.group("failed") or match.group("named") or match.group("conflict")
        if name and name not in files:
            files.append(name)
    return files


def _subdir(dest: str, subdir: str) -> str:
    path = os.path.realpath(os.path.join(dest, subdir))
    root = os.path.realpath(dest)
    if path != root and not path.startswith(root + os.sep):
        raise SetupFailed(f"code.subdir {subdir!r} leaves the repository")
    if not os.path.isdir(path):
        raise SetupFailed(f"code.subdir {subdir!r} does not exist at this commit")
    return path


def _clone_mirror(repo: str, mirror: str) -> None:
    tmp = f"{mirror}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    _git(["clone", "--quiet", "--bare", "--", repo, tmp], None, f"cloning {repo}")
    # Keep every fetched ref up to date, and never prune objects a running job may borrow.
    _git(["config", "remote.origin.fetch", "+refs/heads/*:refs/heads/*"], tmp, "configuring")
    _git(["config", "--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*"], tmp, "configuring")
    _git(["config", "gc.pruneExpire", "never"], tmp, "configuring")
    os.rename(tmp, mirror)


def _has_commit(mirror: str, commit: str) -> bool:
    return _run_git(["cat-file", "-e", f"{commit}^{{commit}}"], mirror).returncode == 0


def _try_fetch_commit(mirror: str, commit: str) -> None:
    # Servers that allow fetching a reachable commit by id (uploadpack.allowReachableSHA1InWant).
    _run_git(["fetch", "--quiet", "origin", commit], mirror)


def _git(args: list[str], cwd: str | None, doing: str) -> None:
    result = _run_git(args, cwd)
    if result.returncode != 0:
        raise SetupFailed(f"git failed {doing}: {telling_line(result.stderr)}")


def _run_git(args: list[str], cwd: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="true", LC_ALL="C")
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SetupFailed("git is not installed on this node (the task's code needs it)") from exc

"""Node-local folders for container runtimes: one shared cache per runtime, and one workspace
per run (unpacked containers, temporary sandboxes, mount points) that is removed when the run
ends, or by the next run on the node when the runner was killed before it could remove it.

A workspace is in use while its runner holds the lock beside it, or while a process still has
its root or working folder inside it (a task that outlived a killed runner).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat

from inside_job.locks import FileLock

_PREFIX = "run-"


def root(configured: str | None) -> str:
    """The estate's `container_scratch` (a private folder per account in it), else
    /var/tmp/klique-<uid>/containers (node-local: unpacked images on a shared home folder fill
    its quota and are slow). Never a folder another account could have made first."""
    # on its path only: every job starts the runner
    from inside_job.private import account, private_dir

    if configured:
        return private_dir(os.path.join(configured, account()))
    return os.path.join(private_dir(f"/var/tmp/klique-{os.getuid()}"), "containers")


def cache(scratch: str, runtime: str) -> str:
    path = os.path.join(scratch, "cache", runtime)
    os.makedirs(path, exist_ok=True)
    return path


class Workspace:
    """A folder for one run, locked while the run lasts."""

    def __init__(self, scratch: str, name: str) -> None:
        self.path = os.path.join(scratch, _PREFIX + name)
        os.makedirs(scratch, exist_ok=True)
        self.lock = FileLock(self.path + ".lock")
        self.lock.exclusive()
        os.makedirs(self.path, exist_ok=True)

    def remove(self) -> None:
        remove_tree(self.path)
        _unlink(self.path + ".lock")
        self.lock.close()


def sweep(scratch: str, before_removal: object = None) -> list[str]:
    """Remove the workspaces that no live run holds; returns their paths.

    before_removal(path), when given, runs first (a runtime's own removal command)."""
    removed: list[str] = []
    try:
        names = os.listdir(scratch)
    except OSError:
        return removed
    for name in sorted(names):
        if not (name.startswith(_PREFIX) and name.endswith(".lock")):
            continue
        path = os.path.join(scratch, name[: -len(".lock")])
        lock = FileLock(os.path.join(scratch, name))
        try:
            if not lock.try_exclusive() or in_use(path):
                continue
            if callable(before_removal) and os.path.isdir(path):
                before_removal(path)
            remove_tree(path)
            _unlink(path + ".lock")
            removed.append(path)
        finally:
            lock.close()
    return removed


def in_use(path: str) -> bool:
    """Whether a process of this account has its root or working folder under path."""
    prefix = os.path.realpath(path)
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        for link in ("root", "cwd"):
            try:
                target = os.readlink(f"/proc/{pid}/{link}")
            except OSError:
                continue
            if target == prefix or target.startswith(prefix + os.sep):
                return True
    return False


def remove_tree(path: str) -> None:
    """rm -rf that also removes read-only folders (images unpack with the image's modes)."""

    def allow(func: object, failed: str, exc: object) -> None:
        parent = os.path.dirname(failed)
        try:
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, os.stat(failed).st_mode | stat.S_IRWXU)
                shutil.rmtree(failed, onerror=allow)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=allow)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

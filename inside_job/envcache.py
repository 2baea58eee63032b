"""The environment cache's housekeeping: sizes, partial builds, least-recently-used eviction."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil

from inside_job.locks import FileLock

MARKER = "klique-env.json"


def evict(envs: str, budget: int, keep: str = "") -> list[str]:
    """Remove least recently used environments until the cache fits budget; returns their keys.

    An environment whose use lock anyone holds (a running task, a build) is never removed.
    """
    entries = sorted(_entries(envs))
    total = sum(size for _, _, size in entries)
    evicted: list[str] = []
    for _used, key, size in entries:
        if total <= budget:
            break
        if key == keep:
            continue
        if _remove_unused(envs, key):
            total -= size
            evicted.append(key)
    return evicted


def _entries(envs: str) -> list[tuple[float, str, int]]:
    found = []
    for key in os.listdir(envs):
        marker = os.path.join(envs, key, MARKER)
        try:
            used = os.stat(marker).st_mtime
            with open(marker, encoding="utf-8") as f:
                size = int(json.load(f).get("bytes", 0))
        except (OSError, ValueError, AttributeError):
            continue
        found.append((used, key, size))
    return found


def _remove_unused(envs: str, key: str) -> bool:
    lock = FileLock(os.path.join(envs, key + ".lock"))
    try:
        if not lock.try_exclusive():
            return False
        path = os.path.join(envs, key)
        if not os.path.exists(os.path.join(path, MARKER)):
            return False
        trash = f"{path}.trash-{os.getpid()}"
        os.rename(path, trash)  # gone from the cache at once; deleting may take a while
        shutil.rmtree(trash, ignore_errors=True)
        return True
    finally:
        lock.close()


def remove_partial(path: str) -> None:
    """Drop what a crashed build of this key left; the caller holds the key's build lock."""
    pattern = glob.escape(path)
    for leftover in glob.glob(pattern + ".tmp-*") + glob.glob(pattern + ".trash-*"):
        if os.path.isdir(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            os.unlink(leftover)
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def tree_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total

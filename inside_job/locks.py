"""File locks (fcntl.flock) that work across processes on one node and, on NFS, across nodes."""

from __future__ import annotations

import fcntl
import os


class FileLock:
    """A lock file; shared and exclusive modes; released by close() or by the process ending."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def shared(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def exclusive(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def try_exclusive(self) -> bool:
        """Take the exclusive lock if nobody holds any lock on it; never waits."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> FileLock:
        self.exclusive()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

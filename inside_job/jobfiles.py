"""The files the runner writes in the job directory: status.json, exit.json and console.log."""

from __future__ import annotations

import contextlib
import json
import os
import time

STATUS_FILE = "status.json"
EXIT_FILE = "exit.json"
CONSOLE_FILE = "console.log"
SCALARS_FILE = "scalars.jsonl"
PREEMPTED_MARKER = "preempted"

_HOST = os.uname().nodename


def write_json(path: str, obj: dict) -> None:
    """Write obj to path atomically: a unique temporary name in the same folder, then rename."""
    tmp = f"{path}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    data = json.dumps(obj, sort_keys=True).encode("utf-8") + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def status(state: str, pid: int | None = None) -> dict:
    """A status.json object."""
    return {"state": state, "time": time.time(), "host": _HOST, "pid": pid}


def write_status(job_dir: str, state: dict) -> None:
    write_json(os.path.join(job_dir, STATUS_FILE), state)


def write_exit(job_dir: str, result: dict) -> None:
    write_json(os.path.join(job_dir, EXIT_FILE), result)


def forget_outcome(job_dir: str) -> None:
    """A run that starts again in the same folder (the scheduler requeued its job after a node
    failure or a preemption) must not leave the earlier run's ending to be read as its own."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(job_dir, EXIT_FILE))


def above_stdio(fd: int) -> int:
    """fd itself, or a copy numbered 3 or more when a closed stdin/stdout/stderr made it 0-2."""
    if fd > 2:
        return fd
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


class Console:
    """console.log, opened for appending; the task writes to the same file through its fd."""

    def __init__(self, job_dir: str) -> None:
        self.path = os.path.join(job_dir, CONSOLE_FILE)
        self.fd = above_stdio(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))

    def say(self, line: str) -> None:
        """Append one 'klique: ...' progress line."""
        os.write(self.fd, f"klique: {line}\n".encode("utf-8", "replace"))

    def write(self, data: bytes) -> None:
        if data:
            os.write(self.fd, data)

    def close(self) -> None:
        os.close(self.fd)

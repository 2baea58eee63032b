"""The files the runner writes in the job directory: status.json, exit.json and console.log
(and, for a task on several nodes, each rank's exit.rankN.json and console.rankN.log, rank 0's
console being console.log)."""

from __future__ import annotations

import contextlib
import json
import os
import time

STATUS_FILE = "status.json"
EXIT_FILE = "exit.json"
CONSOLE_FILE = "console.log"
SCALARS_FILE = "scalars.jsonl"
REPORTS_FILE = "reports.jsonl"  # beyond scalars: tables, images, plots... (klique/logger.py)
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


def write_exit(job_dir: str, result: dict, name: str = EXIT_FILE) -> None:
    write_json(os.path.join(job_dir, name), result)


def rank_exit_file(rank: int) -> str:
    """Where one rank of a task on several nodes writes how it ended."""
    return f"exit.rank{rank}.json"


def rank_console_file(rank: int) -> str:
    """One rank's console: rank 0's is the task's console.log."""
    return f"console.rank{rank}.log" if rank else CONSOLE_FILE


def forget_outcome(job_dir: str, rank: int | None = None) -> None:
    """A run that starts again in the same folder (the scheduler requeued its job after a node
    failure or a preemption) must not leave the earlier run's ending to be read as its own
    (each rank of a task on several nodes forgets its own, and exit.json)."""
    names = [EXIT_FILE] if rank is None else [EXIT_FILE, rank_exit_file(rank)]
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(job_dir, name))


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

    def __init__(self, job_dir: str, name: str = CONSOLE_FILE) -> None:
        self.path = os.path.join(job_dir, name)
        self.fd = above_stdio(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))

    def say(self, line: str) -> None:
        """Append one 'klique: ...' progress line."""
        os.write(self.fd, f"klique: {line}\n".encode("utf-8", "replace"))

    def write(self, data: bytes) -> None:
        if data:
            os.write(self.fd, data)

    def close(self) -> None:
        os.close(self.fd)

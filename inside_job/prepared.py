"""What preparing a task gives the command's start: its argv, environment and folder, the
environment's in-use lock, an app's port, and what to undo once the task has ended."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from inside_job.locks import FileLock


class AppRun:
    """An app's run on this node: the port it serves, and what its route's tunnel sends it."""

    def __init__(self, port: int, upstream_headers: dict[str, str], ready_path: str) -> None:
        self.port = port
        self.upstream_headers = upstream_headers
        self.ready_path = ready_path


class Prepared:
    """What to start, with which environment, where; and the environment's in-use lock."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.env_lock: FileLock | None = None
        self.env_info: dict | None = None
        self.app: AppRun | None = None
        self.cleanup: list[Callable[[], None]] = []  # what to undo once the task has ended

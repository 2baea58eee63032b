"""The runner's errors; each one ends the task as setup_failed with a reason a user can act on.

SetupFailed             the task could not be started (exit code 125 unless said otherwise)
├── SpecError           task.json is missing, unreadable or has a field of the wrong shape
└── CommandNotFound     the command does not exist (127) or cannot be executed (126)
"""

from __future__ import annotations


class SetupFailed(Exception):
    """Raised with the one-line reason that exit.json carries."""

    exit_code = 125

    def __init__(self, reason: str, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if exit_code is not None:
            self.exit_code = exit_code


class SpecError(SetupFailed):
    """task.json is missing, unreadable or has a field of the wrong shape."""


class CommandNotFound(SetupFailed):
    """The task's command is not on PATH (127) or is not executable (126)."""

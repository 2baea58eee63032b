"""The runner's errors; each one ends the task as setup_failed with a reason a user can act on.

SetupFailed             the task could not be started (exit code 125 unless said otherwise)
├── SpecError           task.json is missing, unreadable or has a field of the wrong shape
└── CommandNotFound     the command does not exist (127) or cannot be executed (126)
"""

from __future__ import annotations

import re

# A line where a tool says what went wrong: git's "fatal:"/"error:", pip's "ERROR:", uv's
# "error:" and "×", apptainer's "FATAL:", podman's "Error:", ch-run's "ch-run[42]: error: ...".
_SAYS_WHAT = re.compile(r"^(?:[\w.-]+\[\d+\]:\s*)?(?:(?:fatal|error)\b|×)", re.IGNORECASE)
_DECORATION = " \t│╰─▶×"  # uv draws its explanation as a tree


def telling_line(output: str, fallback: str = "no message") -> str:
    """The line of a tool's output that says what went wrong, as one line.

    Tools end with advice ("and the repository exists.", "Please make sure ..."), so the last
    line seldom names the fault: the first line marked as an error does. A marked line that ends
    with ':' is followed by its explanation (uv's "× No solution found ...:" then "╰─▶ Because
    ..."). Without a marked line, the last line, as before."""
    lines = [line.strip() for line in output.splitlines() if line.strip(_DECORATION)]
    for i, line in enumerate(lines):
        if _SAYS_WHAT.match(line):
            said = line.lstrip(_DECORATION)
            if said.endswith(":") and i + 1 < len(lines):
                said = f"{said} {lines[i + 1].strip(_DECORATION)}"
            return said
    return lines[-1] if lines else fallback


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

"""A run outside any pool: its console (this process's stdout and stderr, as Python writes
them) and scalars go to a private folder, which the runner's reporter sends to the task."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
import threading

from inside_job.reporter import Reporter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TextIO

CONSOLE_FILE = "console.log"


class _Tee:
    """A text stream that writes to the original stream and appends to the console file."""

    def __init__(self, stream: TextIO, fd: int, lock: threading.Lock) -> None:
        self._stream = stream
        self._fd = fd
        self._lock = lock

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        with self._lock, contextlib.suppress(OSError):
            os.write(self._fd, text.encode("utf-8", "replace"))
        return written

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class LocalRun:
    """Captures the console, reports it with the scalars, and ends the task at exit."""

    def __init__(self, url: str, token: str, task_id: int, on_exit: Callable[[str, str], None]):
        self.folder = tempfile.mkdtemp(prefix=f"klique-local-{task_id}-")
        self._fd = os.open(
            os.path.join(self.folder, CONSOLE_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        lock = threading.Lock()
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, self._fd, lock)
        sys.stderr = _Tee(sys.stderr, self._fd, lock)
        self.reporter: Optional[Reporter] = Reporter(url, token, str(task_id), self.folder)
        self._on_exit = on_exit
        self._failure: Optional[str] = None
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self.finish)

    def _excepthook(self, kind: Any, value: Any, trace: Any) -> None:
        self._failure = f"{kind.__name__}: {value}"
        self._previous_hook(kind, value, trace)

    def stop(self) -> None:
        """Send what is left and stop capturing (the run was handed over, or it ended)."""
        if self.reporter is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = self._streams
        sys.excepthook = self._previous_hook
        self.reporter.close(None)
        self.reporter = None
        os.close(self._fd)

    def finish(self, handed_over: bool = False) -> None:
        """At exit: the run completed, or failed with the exception that ended it."""
        if self.reporter is None:
            return
        failure = self._failure
        self.stop()
        if not handed_over:
            self._on_exit("failed" if failure else "completed", failure or "")

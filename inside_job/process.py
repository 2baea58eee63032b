"""Start the task in its own process group, forward the scheduler's signals to it, and wait."""

from __future__ import annotations

import contextlib
import os
import signal

from inside_job.errors import CommandNotFound
from inside_job.jobfiles import above_stdio

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from typing import Callable

_CHECKPOINT = (signal.SIGUSR1, signal.SIGUSR2)  # sbatch --signal=B:USR1@N, and the like
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)
# Reset in the task: Python ignores SIGPIPE and SIGXFSZ, and a shell that started the runner in
# the background may have ignored SIGINT and SIGQUIT.
_RESET_IN_TASK = FORWARDED + (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT, signal.SIGHUP)


class Terminated(Exception):
    """A forwarded signal arrived before the task was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalForwarder:
    """Catches the forwarded signals from the start; before the task runs, they abort setup,
    but a checkpoint signal (USR1, USR2 that is not a stop) is dropped: there is nothing to save
    yet, and the task's default action would end it. `stops` are the signals that end the run
    (the scheduler's warning joins them where it has one: LSF's run limit); each calls
    on_stop."""

    def __init__(self, on_stop: Callable[[int], None] | None = None) -> None:
        self.pgid: int | None = None
        self.received: list[int] = []
        self.on_stop = on_stop
        self.stops: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
        for signum in FORWARDED:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if signum != signal.SIGCONT:
            self.received.append(signum)
        if self.pgid is None:
            if signum == signal.SIGCONT or signum in _CHECKPOINT and signum not in self.stops:
                return
            raise Terminated(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signum)
        if self.on_stop is not None and signum in self.stops:
            self.on_stop(signum)

    def stop_signal(self) -> int | None:
        """The first of the stop signals received, if any."""
        for signum in self.received:
            if signum in self.stops:
                return signum
        return None


def resolve(command: str, env: dict[str, str], cwd: str) -> str:
    """The path that exec would run for command under env's PATH; CommandNotFound otherwise."""
    if "/" in command:
        candidates = [os.path.join(cwd, command)]
    else:
        dirs = env.get("PATH", os.defpath).split(":")
        candidates = [os.path.join(cwd, d, command) for d in dirs]
    found_unexecutable = False
    for path in candidates:
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            found_unexecutable = True
    if found_unexecutable:
        raise CommandNotFound(f"command not executable: {command}", 126)
    raise CommandNotFound(f"command not found: {command}", 127)


def spawn(
    forwarder: SignalForwarder, argv: list[str], env: dict[str, str], cwd: str, fd: int
) -> int:
    """Start argv in a new process group, stdout and stderr appended to fd; forward to it."""
    path = resolve(argv[0], env, cwd)
    null = above_stdio(os.open(os.devnull, os.O_RDONLY))
    actions = [
        (os.POSIX_SPAWN_DUP2, null, 0),
        (os.POSIX_SPAWN_DUP2, fd, 1),
        (os.POSIX_SPAWN_DUP2, fd, 2),
    ]
    here = os.open(".", os.O_RDONLY)
    # Signals wait until the forwarder knows the task's group.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        os.chdir(cwd)
        pid = os.posix_spawn(
            path,
            argv,
            env,
            file_actions=actions,
            setpgroup=0,
            setsigmask=(),
            setsigdef=_RESET_IN_TASK,
        )
        forwarder.pgid = pid
        return pid
    finally:
        os.fchdir(here)
        os.close(here)
        os.close(null)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)


def start_without_signals(thread: threading.Thread) -> None:
    """Start a helper thread (and, by inheritance, the threads it starts) with the forwarded
    signals blocked. The kernel hands a signal sent to the process to any one thread that does
    not block it, as when the main thread still has the SIGCONT that Slurm sends just before a
    warning; Python runs the handler in the main thread only once that thread wakes, and the
    runner's main thread sleeps in waitpid until the task ends: the warning would reach the task
    at its walltime kill."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def wait(pid: int) -> int:
    """Wait for pid; returns its raw wait status (signal handlers run while waiting)."""
    while True:
        done, status = os.waitpid(pid, 0)
        if done == pid:
            return status

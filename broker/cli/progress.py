"""Progress for the CLI's long operations, drawn with tqdm on standard error while it is a
terminal: bytes of an upload or a download, a sweep's finished tasks with counts by state, and
the stage of a task whose console is followed. When standard error is not a terminal (piped,
logged, run by a program) nothing is drawn: the output stays plain lines, with no carriage
returns or escape codes. A sweep's counts and a task's stage are only what the server
reported."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import click

# A transfer smaller than this ends before a bar would tell anyone anything.
MIN_BAR_BYTES = 1 << 20
CHUNK_BYTES = 64 * 1024
# The runner's own console lines (inside_job/jobfiles.py, Console.say) begin so; until the
# task's command starts, every line of the console is the runner's.
RUNNER_PREFIX = "klique: "
# The states of a task that has not started on a node (broker/domain.py, TaskState).
WAITING = frozenset({"created", "queued", "held", "placed", "submitted", "pending"})
SPINNER = "|/-\\"
# A bar drawn only with its first news (an explicit refresh), not empty when it is made.
LATER = 0.2


def on_terminal(stream: IO[str] | None = None) -> bool:
    """Whether `stream` (standard error) is a terminal that draws: not piped, not TERM=dumb."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


class Quiet:
    """What a bar is off a terminal: it counts nothing and draws nothing."""

    disable = True
    n = 0
    total: int | None = None

    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...
    def set_description_str(self, desc: str = "", refresh: bool = True) -> None: ...
    def clear(self) -> None: ...
    def refresh(self) -> None: ...
    def close(self) -> None: ...


def bar(shown: bool, **options: Any) -> Any:
    """A tqdm bar on standard error, or a Quiet one where it is not `shown` (tqdm is loaded
    only then: a piped command does not pay for it)."""
    if not shown:
        return Quiet()
    from tqdm import tqdm

    size = shutil.get_terminal_size()
    shape = (
        {"dynamic_ncols": True}
        if sized_terminal()
        else {"ncols": size.columns, "nrows": size.lines}
    )
    return tqdm(file=sys.stderr, leave=False, **shape, **options)


def sized_terminal() -> bool:
    """Whether standard error's terminal says its size (follow it as it is resized); one that
    says 0 (a pseudo-terminal nobody sized) would hide every line: then COLUMNS and LINES, or
    80 by 24."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError, AttributeError):
        return False


def byte_bar(total: int, what: str) -> Any:
    """A bar of bytes for a transfer of `total` bytes; a no-op one off a terminal, or for a
    transfer too small to need one."""
    shown = total >= MIN_BAR_BYTES and on_terminal()
    return bar(shown, total=total, desc=what, unit="B", unit_scale=True, unit_divisor=1024)


class Upload:
    """A request body sent in chunks, counted on a bar as they go (one that says `what`).
    Iterable again from its start: a request retried (a renewed single sign-on token) sends
    the whole body again."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.what = what

    def __iter__(self) -> Iterator[bytes]:
        counter = byte_bar(len(self.data), self.what)
        try:
            for start in range(0, len(self.data), CHUNK_BYTES):
                chunk = self.data[start : start + CHUNK_BYTES]
                yield chunk
                counter.update(len(chunk))
        finally:
            counter.close()


def sending(what: str) -> Callable[[bytes], Upload]:
    """How a request body goes up under a bar that says `what` (Client.post's `sending`)."""
    return lambda data: Upload(data, f"sending {what}")


# A sweep's wait: finished tasks of all, and how many are in each state.


def sweep_bar(sweep: int) -> Any:
    """A bar of the sweep's finished tasks (its total comes with the first counts)."""
    return bar(
        on_terminal(),
        total=0,
        desc=f"sweep {sweep}",
        unit="task",
        bar_format="{desc}: {bar} {n_fmt}/{total_fmt} finished [{elapsed}] {postfix}",
        delay=LATER,
    )


def by_state(states: Mapping[str, int]) -> str:
    """`2 completed, 3 running`: the counts the server gave, by state name."""
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items()))


def show_sweep(counter: Any, states: Mapping[str, int], final: frozenset[str]) -> None:
    """The sweep's latest counts on its bar."""
    counter.total = sum(states.values())
    counter.n = sum(n for state, n in states.items() if state in final)
    counter.set_postfix_str(by_state(states), refresh=False)
    counter.refresh()


# A followed task's stage: one line under its console, from its state and the runner's words.


def stage(state: str, runner_said: str | None, final: frozenset[str]) -> str:
    """What a followed task is doing, in words, from what the server reports: its state and the
    runner's last line in its console (None before the runner has said anything)."""
    if state in final:
        return state
    if runner_said is not None and runner_said.startswith("building environment"):
        return "building the environment"
    if state == "running":
        return "running"
    if state in WAITING and runner_said is None:
        return f"waiting ({state})"
    return "setting up"  # the runner has started on its node; the pool may not say so yet


class RunnerLines:
    """The runner's last progress line in a console read in chunks (lines may span them)."""

    def __init__(self) -> None:
        self.partial = ""
        self.last: str | None = None

    def feed(self, text: str) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        for line in lines:
            if line.startswith(RUNNER_PREFIX):
                self.last = line[len(RUNNER_PREFIX) :].strip()


class StageLine:
    """A spinner line on standard error that says the followed task's stage, drawn between the
    console's lines (never in the middle of one); nothing off a terminal."""

    def __init__(self, task_id: int, shown: bool | None = None) -> None:
        self.task_id = task_id
        self.spin = itertools.cycle(SPINNER)
        shown = on_terminal() if shown is None else shown
        self.bar = bar(shown, total=None, bar_format="{desc} [{elapsed}]", delay=LATER)
        self.drawn = True  # at the start of a line: the console has said nothing yet

    @classmethod
    def quiet(cls, task_id: int) -> StageLine:
        """One that never draws: a console printed once, not followed."""
        return cls(task_id, shown=False)

    @property
    def shown(self) -> bool:
        return not self.bar.disable

    def say(self, words: str) -> None:
        self.bar.set_description_str(f"{next(self.spin)} task {self.task_id}: {words}", False)
        if self.drawn:
            self.bar.refresh()

    def echo(self, text: str) -> None:
        """Print console `text` on standard output with the line cleared meanwhile; draw it
        again once the console is at the start of a line."""
        self.bar.clear()
        click.echo(text, nl=False)
        self.drawn = text.endswith("\n")
        if self.drawn:
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()

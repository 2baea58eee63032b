"""A task's console: read from its job folder as the task's own account (by its pool's
driver), else from the copy its runner reported over HTTP, which the server keeps in its own
home. The server never opens a file in a folder a user can write."""

from __future__ import annotations

from pathlib import Path

from broker.bounds import report_problem
from broker.domain import Task
from broker.errors import KliqueError, TooLarge
from broker.tasks.control import TaskControl
from broker.tasks.schemas import LogChunk, Report
from inside_job.reporter import decode_prefix

LOG_CHUNK = 1 << 20  # bytes of console one read answers, at most


def console_copy(loop: TaskControl, task: Task) -> Path:
    """The console as the runner reported it over HTTP, kept in the server's own home."""
    return loop.home / "console" / f"{task.id}.log"


def checked_rank(loop: TaskControl, task: Task, rank: int) -> int:
    """A rank of a task on several nodes whose console is asked for: one it has."""
    resource = loop.estate.resources.get(task.resource)
    nodes = resource.profile.nodes if resource is not None else 1
    if rank >= nodes:
        raise KliqueError(
            f"task {task.id} runs on {nodes} node(s): ranks 0 to {nodes - 1} have consoles"
        )
    return rank


async def read_console(loop: TaskControl, task: Task, offset: int, rank: int = 0) -> bytes:
    """From the job folder, read as the task's own account by its pool; else the reported copy
    (rank 0's: the other ranks of a task on several nodes are read from the job folder only)."""
    driver = loop.drivers.get(task.pool or "")
    if driver is not None and task.job_dir:
        try:
            data = await driver.read_console(task, offset, LOG_CHUNK, rank)
        except KliqueError:
            data = None
        if data is not None:
            return data
    if rank:
        return b""
    try:
        with console_copy(loop, task).open("rb") as f:
            f.seek(offset)
            return f.read(LOG_CHUNK)
    except OSError:
        return b""


def log_chunk(task: Task, offset: int, data: bytes) -> LogChunk:
    """What was read, as text: a character split at the chunk's end waits for the next read,
    unless this is the end."""
    text, used = decode_prefix(data, task.state.final and len(data) < LOG_CHUNK)
    return LogChunk(id=task.id, offset=offset + used, text=text, final=task.state.final)


def check_report_bounds(loop: TaskControl, task: Task, body: Report) -> None:
    """TooLarge, naming the estate's limit, for a report that would pass one of the task's
    bounds."""
    console = body.console
    console_end = None if console is None else console.offset + len(console.text.encode())
    adding = len(body.scalars or [])
    kept = loop.store.scalar_count(task.id) if adding else 0
    problem = report_problem(loop.estate.limits, task.id, console_end, kept, adding)
    if problem:
        raise TooLarge(problem)


def save_console(loop: TaskControl, task: Task, offset: int, text: str) -> None:
    """Append what the runner sent from `offset`; resends of what is there already are
    skipped."""
    path = console_copy(loop, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    with path.open("ab") as f:
        size = f.tell()
        if offset <= size < offset + len(data):
            f.write(data[size - offset :])

"""Cancelling a task and the steps it made (a pipeline's): the service's cancel, a sweep's and
the web UI's all end here."""

from __future__ import annotations

import asyncio

from broker.domain import Task
from broker.tasks.control import TaskControl


async def cancel_task(loop: TaskControl, task: Task) -> Task:
    """Cancel a task that has not ended, and the steps it made (a pipeline's)."""
    if task.state.final:
        return task
    task = await loop.cancel(task)
    await cancel_steps(loop, task.id)
    return task


async def cancel_steps(loop: TaskControl, parent: int) -> None:
    """Cancelling a task cancels the tasks it made (a pipeline's steps) that have not ended."""
    steps = await asyncio.to_thread(loop.store.children, parent)
    await asyncio.gather(*(loop.cancel(s) for s in steps if not s.state.final))

"""The operations on tasks, one place for every adapter: create, list, show, why, logs, cancel,
and what a task's runner reports. Each takes the caller and asks broker/authz.py whether they
may; each raises Klique's own errors (broker/errors.py), which the adapters answer their way."""

from __future__ import annotations

import asyncio
from typing import Any

from broker import authz
from broker.authz import Action
from broker.domain import Task, TaskState
from broker.errors import Conflict, KliqueError
from broker.identity.resolve import Caller
from broker.tasks.console import (
    check_report_bounds,
    checked_rank,
    log_chunk,
    read_console,
    save_console,
)
from broker.tasks.control import ControlLoop
from broker.tasks.create import queue_task, spec_of
from broker.tasks.creations import Creations
from broker.tasks.schemas import LogChunk, Report, SubmitRequest, TaskOut, WhyOut
from broker.tasks.views import task_out, why_out


class TaskService:
    """The task service over one control loop (its store, its estate, its reasons)."""

    def __init__(self, loop: ControlLoop) -> None:
        self.loop = loop
        self.store = loop.store
        self.creations = Creations(loop.store)

    def out(self, task: Task, detail: bool = False) -> TaskOut:
        return task_out(task, self.loop, detail)

    def find(self, who: Caller, task_id: int, action: Action = Action.READ_TASK) -> Task:
        """The caller's own task (any task for an admin), if authz lets them do `action` to
        it; NotFound for anyone else's."""
        return authz.find_task(self.store.get, who, action, task_id)

    async def submit(self, who: Caller, body: SubmitRequest) -> TaskOut:
        """One task, `klique submit`'s: checked, then written with the creates of other
        requests waiting at the same moment."""
        spec = spec_of(body, self.loop.estate.default_resource or "")
        return self.out(await queue_task(self.loop, self.creations, who, spec))

    def listing(
        self,
        who: Caller,
        states: str | None = None,
        all_users: bool = False,
        limit: int = 200,
        before: int | None = None,
        project: str | None = None,
    ) -> list[TaskOut]:
        """The newest tasks first, a page at a time: pass the last id seen as `before`."""
        tasks = self.store.tasks(
            owner=authz.owner_filter(who, None if all_users else who.user),
            states=parse_states(states),
            limit=limit,
            newest_first=True,
            before=before,
            with_diff=False,
            project=project,
        )
        return [self.out(t) for t in tasks]

    def show(self, who: Caller, task_id: int) -> TaskOut:
        return self.out(self.find(who, task_id), detail=True)

    def why(self, who: Caller, task_id: int) -> WhyOut:
        return why_out(self.loop, self.find(who, task_id))

    async def logs(self, who: Caller, task_id: int, offset: int = 0, rank: int = 0) -> LogChunk:
        task = await asyncio.to_thread(self.find, who, task_id)
        data = await read_console(self.loop, task, offset, checked_rank(self.loop, task, rank))
        return log_chunk(task, offset, data)

    async def cancel(self, who: Caller, task_id: int) -> TaskOut:
        task = await asyncio.to_thread(self.find, who, task_id, Action.CANCEL)
        return await asyncio.to_thread(self.out, await cancel_task(self.loop, task))

    def report(self, task: Task, body: Report) -> None:
        """What a task's runner says: state, console, scalars, its end. The end is a claim:
        the task becomes final only when its pool sees the job gone (see SECURITY.md). The
        caller has checked that `task` is the one whose report token spoke; Conflict once
        the task's attempt is over."""
        refusal = authz.report_refusal(task)
        if refusal:
            raise Conflict(refusal)
        check_report_bounds(self.loop, task, body)
        if body.console is not None:
            save_console(self.loop, task, body.console.offset, body.console.text)
        if body.scalars:
            self.store.add_scalars(task.id, [s.model_dump() for s in body.scalars])
        # One write at most: the start and the claimed end together, where both are news.
        claim: dict[str, Any] = {}
        if body.exit is not None and not task.state.final:
            claim["claim"] = body.exit.model_dump()
        starting = (TaskState.SUBMITTED, TaskState.PENDING)
        started = body.state is not None and body.state.state in ("running", "done")
        moved = None
        if started and task.state in starting:
            moved = self.store.change_state(task.id, TaskState.RUNNING, only_from=starting, **claim)
        if claim and moved is None:  # already running (or moved on meanwhile)
            self.store.update(task.id, **claim)
        if claim:
            self.loop.wake_pool(task.pool)  # the pool confirms at its next look


async def cancel_task(loop: ControlLoop, task: Task) -> Task:
    """Cancel a task that has not ended, and the steps it made (a pipeline's)."""
    if task.state.final:
        return task
    task = await loop.cancel(task)
    await cancel_steps(loop, task.id)
    return task


async def cancel_steps(loop: ControlLoop, parent: int) -> None:
    """Cancelling a task cancels the tasks it made (a pipeline's steps) that have not ended."""
    steps = await asyncio.to_thread(loop.store.children, parent)
    await asyncio.gather(*(loop.cancel(s) for s in steps if not s.state.final))


def parse_states(text: str | None) -> list[TaskState] | None:
    """`running,queued` as states; None (every state) for nothing."""
    if not text:
        return None
    known = {s.value for s in TaskState}
    unknown = [s for s in text.split(",") if s not in known]
    if unknown:
        raise KliqueError(
            f"unknown states {', '.join(unknown)}; use any of {', '.join(sorted(known))}"
        )
    return [TaskState(s) for s in text.split(",")]

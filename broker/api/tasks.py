"""The REST API's task endpoints (/tasks...): thin, over the task service (broker/tasks/)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request

from broker.http.callers import Auth, bearer, reporting_task
from broker.http.paths import API, TaskId
from broker.tasks.schemas import LogChunk, Report, SubmitRequest, TaskOut, WhyOut
from broker.tasks.service import TaskService


def service_of(request: Request) -> TaskService:
    """The app's task service (set where the app is composed)."""
    tasks: TaskService = request.app.state.tasks
    return tasks


Tasks = Annotated[TaskService, Depends(service_of)]


def tasks_router(tasks: TaskService) -> APIRouter:
    router = APIRouter(prefix=API)

    @router.post("/tasks", status_code=201)
    async def submit(body: SubmitRequest, who: Auth) -> TaskOut:
        return await tasks.submit(who, body)

    @router.get("/tasks")
    def list_tasks(
        who: Auth,
        state: Annotated[str | None, Query(max_length=200)] = None,
        all_users: bool = False,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
        before: Annotated[int | None, Query(ge=1, lt=2**63)] = None,
        project: Annotated[str | None, Query(max_length=200)] = None,
        tag: Annotated[str | None, Query(max_length=64, description="Only tasks with it.")] = None,
        archived: Annotated[bool, Query(description="The archived tasks instead.")] = False,
        team: Annotated[bool, Query(description="Your team's tasks, yours too.")] = False,
    ) -> list[TaskOut]:
        """The newest tasks first, a page at a time: pass the last id seen as `before`."""
        return tasks.listing(who, state, all_users, limit, before, project, tag, archived, team)

    @router.get("/tasks/{task_id}")
    def show(task_id: TaskId, who: Auth) -> TaskOut:
        return tasks.show(who, task_id)

    @router.get("/tasks/{task_id}/why")
    def why(task_id: TaskId, who: Auth) -> WhyOut:
        return tasks.why(who, task_id)

    @router.get("/tasks/{task_id}/logs")
    async def logs(
        task_id: TaskId,
        who: Auth,
        offset: Annotated[int, Query(ge=0, lt=2**62)] = 0,
        rank: Annotated[int, Query(ge=0, le=4095)] = 0,
    ) -> LogChunk:
        return await tasks.logs(who, task_id, offset, rank)

    @router.post("/tasks/{task_id}/cancel")
    async def cancel(task_id: TaskId, who: Auth) -> TaskOut:
        return await tasks.cancel(who, task_id)

    @router.post("/tasks/{task_id}/report")
    def report(
        task_id: TaskId, body: Report, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, bool]:
        """What a task's runner says: state, console, scalars, its end. The end is a claim: the
        task becomes final only when its pool sees the job gone (see SECURITY.md)."""
        task = reporting_task(tasks.store, task_id, bearer(authorization))
        if task is None:  # a wrong token, or a superseded attempt's: the attempt is over
            raise HTTPException(401, "not a valid report token for this task")
        tasks.report(task, body)
        return {"ok": True}

    return router

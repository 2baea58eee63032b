"""What is kept of a run: its tags (`klique tag`), whether it is archived (`klique archive`),
and its deletion (`klique delete`). Thin over the task service (broker/tasks/keeping.py has the
rules)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from broker.api.tasks import Tasks
from broker.http.callers import ActorAuth
from broker.http.paths import API, TaskId
from broker.tasks.keeping import TagsIn
from broker.tasks.schemas import TaskOut

router = APIRouter(prefix=API)


@router.post("/tasks/{task_id}/tags")
def tag(task_id: TaskId, body: TagsIn, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    """Add and remove tags: the task's owner, an admin, or the task's own report token."""
    return tasks.tag(actor, task_id, body)


@router.post("/tasks/{task_id}/archive")
def archive(task_id: TaskId, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    """Hide an ended task from the default listings (`klique ls --archived` shows it)."""
    return tasks.archive(actor, task_id, True)


@router.post("/tasks/{task_id}/unarchive")
def unarchive(task_id: TaskId, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    """Take a task out of the archive."""
    return tasks.archive(actor, task_id, False)


@router.delete("/tasks/{task_id}")
def delete(task_id: TaskId, request: Request, tasks: Tasks, actor: ActorAuth) -> dict[str, int]:
    """Delete an ended task with its reports, scalars, console and artifacts (its owner or an
    admin); what the usage ledger counted of it stays."""
    tasks.delete(actor, task_id, request.app.state.artifacts)
    return {"deleted": task_id}

"""A task's artifacts: who may read and write them, and the room a task has left (the
estate's artifacts.max_size for one, limits.max_artifacts for a task's share). The bytes
themselves stream through broker/artifacts.py's store; the adapters move them."""

from __future__ import annotations

from typing import Any

from broker import authz
from broker.artifacts import too_large
from broker.bounds import artifacts_problem
from broker.domain import Task
from broker.errors import NotFound, TooLarge
from broker.identity.resolve import Caller
from broker.tasks.control import TaskControl
from broker.tasks.records import find, reads
from broker.tasks.schemas import ArtifactOut


def writable(loop: TaskControl, actor: Caller, task_id: int) -> Task:
    """The task whose artifacts the caller may write: its owner's, or its own report token's."""
    return find(loop, task_id, actor, authz.acts_on)


def room_for(loop: TaskControl, task: Task, name: str, declared: int | None, most: int) -> int:
    """Bytes the task may still store as `name` (one of that name is replaced, so it does not
    count); TooLarge at once when the declared size is over the store's `most` or the room."""
    limits = loop.estate.limits
    kept = sum(a["size"] for a in loop.store.artifacts(task.id) if a["name"] != name)
    if declared is not None:
        if declared > most:
            raise TooLarge(too_large(declared, most))
        problem = artifacts_problem(limits, task.id, kept, declared)
        if problem:
            raise TooLarge(problem)
    return limits.max_artifact_bytes - kept


def stored(
    loop: TaskControl, task: Task, name: str, kind: str, filename: str, digest: str, size: int
) -> ArtifactOut:
    """The artifact, once its bytes are in the store, on the task's record."""
    found = loop.store.add_artifact(
        task.id, name=name, kind=kind, filename=filename, digest=digest, size=size
    )
    return ArtifactOut(**found)


def listing(loop: TaskControl, actor: Caller, task_id: int) -> list[ArtifactOut]:
    task = find(loop, task_id, actor, lambda a, t: reads(loop, a, t, None))
    return [ArtifactOut(**a) for a in loop.store.artifacts(task.id)]


def readable(loop: TaskControl, actor: Caller, task_id: int, name: str) -> dict[str, Any]:
    """The artifact's record (digest, size), if the caller may read it."""
    task = find(loop, task_id, actor, lambda a, t: reads(loop, a, t, name))
    found = loop.store.artifact(task.id, name)
    if found is None:
        raise NotFound(f"task {task.id} has no artifact {name!r}; `klique artifacts {task.id}`")
    return found

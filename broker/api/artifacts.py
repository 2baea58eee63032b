"""Artifacts over HTTP: uploads stream into the artifact store (never whole in memory), with
the estate's size limit and the task's share (limits.max_artifacts); downloads stream out. Only
the task's owner (and admins) read them, and a task's own report token, for its task, its steps
and the inputs it was made to read."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse

from broker.api.auth import ActorAuth, scheduler_of
from broker.api.schemas import ArtifactOut
from broker.api.sdk import TaskId, acts_on, find, reads
from broker.artifacts import ArtifactStore, TooLarge, too_large
from broker.asgi import Scope
from broker.bounds import OverBound, artifacts_problem
from broker.domain import Limits
from broker.errors import NotFound
from broker.names import ARTIFACT, FILENAME

router = APIRouter(prefix="/api/v1")
Name = Annotated[str, PathParam(pattern=ARTIFACT, description="The artifact's name.")]
# The one route whose body the request-size limit leaves alone: it streams and has its own.
STREAMED = re.compile(r"^/api/v1/tasks/[0-9]+/artifacts/[^/]+$")
_BINARY = {
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
}


def streams_itself(scope: Scope) -> bool:
    return scope.get("method") == "PUT" and bool(STREAMED.match(scope.get("path", "")))


def store_of(request: Request) -> ArtifactStore:
    store: ArtifactStore = request.app.state.artifacts
    return store


@router.put(
    "/tasks/{task_id}/artifacts/{name}",
    status_code=201,
    openapi_extra={"requestBody": {"required": False, **_BINARY}},
)
async def upload(
    task_id: TaskId,
    name: Name,
    request: Request,
    actor: ActorAuth,
    kind: Literal["file", "object"] = "file",
    filename: Annotated[str | None, Query(pattern=FILENAME)] = None,
) -> ArtifactOut:
    """Store the body as the task's artifact `name` (replacing one of that name)."""
    scheduler = scheduler_of(request)
    task = find(scheduler, task_id, actor, acts_on)
    store = store_of(request)
    limits = scheduler.estate.limits
    # The task's other artifacts (one of this name is replaced) count against its share.
    kept = sum(a["size"] for a in scheduler.store.artifacts(task.id) if a["name"] != name)
    content_length = request.headers.get("content-length")
    if content_length is not None:
        if not content_length.isdigit():
            raise HTTPException(400, "the Content-Length header is not a number")
        if int(content_length) > store.max_bytes:
            raise HTTPException(413, too_large(int(content_length), store.max_bytes))
        problem = artifacts_problem(limits, task.id, kept, int(content_length))
        if problem:
            raise HTTPException(413, problem)
    room = limits.max_artifact_bytes - kept
    try:
        digest, size = await store.put(_body(request, task.id, room, limits))
    except (TooLarge, OverBound) as exc:
        raise HTTPException(413, str(exc)) from None
    found = scheduler.store.add_artifact(
        task.id, name=name, kind=kind, filename=filename or name, digest=digest, size=size
    )
    return ArtifactOut(**found)


async def _body(request: Request, task_id: int, room: int, limits: Limits) -> AsyncIterator[bytes]:
    """The upload's chunks; OverBound past the task's room (the store keeps nothing of it)."""
    size = 0
    async for chunk in request.stream():
        if chunk:
            size += len(chunk)
            if size > room:
                raise OverBound(
                    artifacts_problem(limits, task_id, limits.max_artifact_bytes - room, size)
                )
            yield chunk


@router.get("/tasks/{task_id}/artifacts")
def listing(task_id: TaskId, request: Request, actor: ActorAuth) -> list[ArtifactOut]:
    scheduler = scheduler_of(request)
    task = find(scheduler, task_id, actor, lambda a, t: reads(scheduler, a, t, None))
    return [ArtifactOut(**a) for a in scheduler.store.artifacts(task.id)]


@router.get(
    "/tasks/{task_id}/artifacts/{name}",
    response_class=StreamingResponse,
    responses={200: _BINARY},
)
def download(task_id: TaskId, name: Name, request: Request, actor: ActorAuth) -> StreamingResponse:
    scheduler = scheduler_of(request)
    task = find(scheduler, task_id, actor, lambda a, t: reads(scheduler, a, t, name))
    found = scheduler.store.artifact(task.id, name)
    if found is None:
        raise NotFound(f"task {task.id} has no artifact {name!r}; `klique artifacts {task.id}`")
    return StreamingResponse(
        store_of(request).read(found["digest"]),
        media_type="application/octet-stream",
        headers={"Content-Length": str(found["size"]), "X-Klique-Digest": found["digest"]},
    )

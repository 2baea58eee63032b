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

from broker.api.tasks import Tasks
from broker.artifacts import ArtifactStore
from broker.bounds import OverBound, artifacts_problem
from broker.domain import Limits
from broker.errors import TooLarge
from broker.http.asgi import Scope
from broker.http.callers import ActorAuth
from broker.http.paths import API, BINARY, TaskId
from broker.names import ARTIFACT, FILENAME
from broker.tasks.schemas import ArtifactOut

router = APIRouter(prefix=API)
Name = Annotated[str, PathParam(pattern=ARTIFACT, description="The artifact's name.")]
# The routes whose body the request-size limit leaves alone: they stream and have their own
# (artifacts here, dataset blobs in broker/api/datasets.py).
STREAMED = re.compile(r"^/api/v1/(tasks/[0-9]+/artifacts/[^/]+|datasets/blobs/[0-9a-f]{64})$")


def streams_itself(scope: Scope) -> bool:
    return scope.get("method") == "PUT" and bool(STREAMED.match(scope.get("path", "")))


def store_of(request: Request) -> ArtifactStore:
    store: ArtifactStore = request.app.state.artifacts
    return store


@router.put(
    "/tasks/{task_id}/artifacts/{name}",
    status_code=201,
    openapi_extra={"requestBody": {"required": False, **BINARY}},
)
async def upload(
    task_id: TaskId,
    name: Name,
    request: Request,
    tasks: Tasks,
    actor: ActorAuth,
    kind: Literal["file", "folder", "object"] = "file",
    filename: Annotated[str | None, Query(pattern=FILENAME)] = None,
) -> ArtifactOut:
    """Store the body as the task's artifact `name` (replacing one of that name)."""
    task = tasks.artifact_writable(actor, task_id)
    store = store_of(request)
    content_length = request.headers.get("content-length")
    if content_length is not None and not content_length.isdigit():
        raise HTTPException(400, "the Content-Length header is not a number")
    declared = None if content_length is None else int(content_length)
    room = tasks.artifact_room(task, name, declared, store.max_bytes)
    try:
        digest, size = await store.put(_body(request, task.id, room, tasks.limits))
    except OverBound as exc:
        raise TooLarge(str(exc)) from None
    return tasks.artifact_stored(task, name, kind, filename or name, digest, size)


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
def listing(task_id: TaskId, tasks: Tasks, actor: ActorAuth) -> list[ArtifactOut]:
    return tasks.artifact_list(actor, task_id)


@router.get(
    "/tasks/{task_id}/artifacts/{name}",
    response_class=StreamingResponse,
    responses={200: BINARY},
)
def download(
    task_id: TaskId, name: Name, request: Request, tasks: Tasks, actor: ActorAuth
) -> StreamingResponse:
    found = tasks.artifact(actor, task_id, name)
    return StreamingResponse(
        store_of(request).read(found["digest"]),
        media_type="application/octet-stream",
        headers={"Content-Length": str(found["size"]), "X-Klique-Digest": found["digest"]},
    )

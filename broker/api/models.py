"""The model registry over HTTP (/models...): thin over broker/tasks/models.py. A run registers
a version (its files uploaded first as the run's artifacts); users read the models of their
team, change stages, and download files; a job's report token reads only the versions its
app's launch resolved."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse

from broker.api.artifacts import store_of
from broker.http.callers import ActorAuth, Auth
from broker.http.paths import API, BINARY
from broker.models.rules import MODEL_NAME
from broker.tasks.model_schemas import ModelDetailOut, ModelIn, ModelOut, StageIn, VersionOut
from broker.tasks.models import ModelService

router = APIRouter(prefix=API)
Name = Annotated[str, PathParam(pattern=MODEL_NAME, description="The model's name.")]
Version = Annotated[int, PathParam(ge=1, lt=2**31, description="A version number.")]
Ref = Annotated[
    str,
    PathParam(
        pattern=r"^([1-9][0-9]{0,8}|production|staging|latest)$",
        description="A version number, production, staging or latest.",
    ),
]


def service_of(request: Request) -> ModelService:
    """The app's model service (set where the API is mounted)."""
    models: ModelService = request.app.state.models
    return models


Models = Annotated[ModelService, Depends(service_of)]


@router.post("/models", status_code=201)
def register(body: ModelIn, models: Models, actor: ActorAuth) -> VersionOut:
    """A new version of a model, made by a run (the caller's, or the report token's task)."""
    return models.register(actor, body)


@router.get("/models")
def listing(models: Models, who: Auth) -> list[ModelOut]:
    return models.listing(who)


@router.get("/models/{name}")
def show(name: Name, models: Models, who: Auth) -> ModelDetailOut:
    """A model, its versions, and the apps serving them."""
    return models.show(who, name)


@router.get("/models/{name}/versions/{ref}")
def version(name: Name, ref: Ref, models: Models, actor: ActorAuth) -> VersionOut:
    return models.version(actor, name, ref)


@router.post("/models/{name}/versions/{version}/stage")
def stage(name: Name, version: Version, body: StageIn, models: Models, who: Auth) -> VersionOut:
    """Move a version to a stage; to production, the version there before is archived."""
    return models.set_stage(who, name, version, body.stage)


@router.get(
    "/models/{name}/versions/{version}/files/{index}",
    response_class=StreamingResponse,
    responses={200: BINARY},
)
def download(
    name: Name,
    version: Version,
    index: Annotated[int, PathParam(ge=0, lt=100_000)],
    request: Request,
    models: Models,
    actor: ActorAuth,
) -> StreamingResponse:
    found = models.file(actor, name, version, index)
    return StreamingResponse(
        store_of(request).read(found["digest"]),
        media_type="application/octet-stream",
        headers={"Content-Length": str(found["size"]), "X-Klique-Digest": found["digest"]},
    )

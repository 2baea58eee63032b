"""Datasets over HTTP (/datasets...): thin over broker/tasks/datasets.py. A new version is made
in three steps: ask which files' content the server lacks (`POST /datasets/blobs/missing`), send
only those (`PUT /datasets/blobs/DIGEST`, streamed into the dataset store with the artifact
store's size limit), then post the manifest (`POST /datasets/NAME/versions`). Reads stream a
version's files by digest; a run's report token reads as the run's owner, and the versions it
reads go on the run's record."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse

from broker.artifacts import too_large
from broker.bounds import OverBound
from broker.datasets.blobs import Blobs
from broker.datasets.manifest import DATASET_NAME, DIGEST
from broker.errors import TooLarge
from broker.http.callers import ActorAuth
from broker.http.paths import API, BINARY
from broker.tasks.dataset_schemas import (
    BlobOut,
    DatasetDetailOut,
    DatasetManifestOut,
    DatasetOut,
    DatasetVersionOut,
    DigestsIn,
    MissingOut,
    VersionIn,
)
from broker.tasks.datasets import DatasetService

router = APIRouter(prefix=API)
Name = Annotated[str, PathParam(pattern=DATASET_NAME, description="The dataset's name.")]
Digest = Annotated[str, PathParam(pattern=DIGEST, description="A file's SHA-256, 64 hex.")]
Version = Annotated[int, PathParam(ge=1, lt=2**31, description="A version number.")]
Ref = Annotated[
    str,
    PathParam(pattern=r"^([1-9][0-9]{0,8}|latest)$", description="A version number or latest."),
]


def service_of(request: Request) -> DatasetService:
    """The app's dataset service (set where the API is mounted)."""
    datasets: DatasetService = request.app.state.datasets
    return datasets


def blobs_of(request: Request) -> Blobs:
    blobs: Blobs = request.app.state.dataset_blobs
    return blobs


Datasets = Annotated[DatasetService, Depends(service_of)]


@router.post("/datasets/blobs/missing")
def missing(body: DigestsIn, datasets: Datasets, actor: ActorAuth) -> MissingOut:
    """Of these digests, the ones the caller has still to send."""
    return MissingOut(missing=datasets.missing(actor, body.digests))


@router.put(
    "/datasets/blobs/{digest}",
    status_code=201,
    openapi_extra={"requestBody": {"required": False, **BINARY}},
)
async def send(digest: Digest, request: Request, datasets: Datasets, actor: ActorAuth) -> BlobOut:
    """Store one file's content; its SHA-256 must be `digest`."""
    room = datasets.room(actor)  # a job's share; None for a user
    blobs = blobs_of(request)
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise HTTPException(400, "the Content-Length header is not a number")
    if declared is not None and int(declared) > blobs.max_bytes:
        raise TooLarge(too_large(int(declared), blobs.max_bytes))
    if declared is not None and room is not None and int(declared) > room:
        raise TooLarge(datasets.over_room(actor, room, int(declared)))
    try:
        found, size = await blobs.put(_body(request, room))
    except OverBound:
        raise TooLarge(datasets.over_room(actor, room or 0, (room or 0) + 1)) from None
    datasets.sent(actor, digest, found, size)
    return BlobOut(digest=found, size=size)


async def _body(request: Request, room: int | None) -> AsyncIterator[bytes]:
    """The upload's chunks; OverBound past a job's room (the store keeps nothing of it)."""
    size = 0
    async for chunk in request.stream():
        if chunk:
            size += len(chunk)
            if room is not None and size > room:
                raise OverBound("past the task's share")
            yield chunk


@router.post("/datasets/{name}/versions", status_code=201)
def create(name: Name, body: VersionIn, datasets: Datasets, actor: ActorAuth) -> DatasetVersionOut:
    """A new immutable version from its manifest (its files' content sent first)."""
    return datasets.create(actor, name, body)


@router.get("/datasets")
def listing(datasets: Datasets, actor: ActorAuth) -> list[DatasetOut]:
    return datasets.listing(actor)


@router.get("/datasets/{name}")
def show(name: Name, datasets: Datasets, actor: ActorAuth) -> DatasetDetailOut:
    """A dataset and its versions (without their manifests)."""
    return datasets.show(actor, name)


@router.get("/datasets/{name}/versions/{ref}")
def version(name: Name, ref: Ref, datasets: Datasets, actor: ActorAuth) -> DatasetManifestOut:
    """A version and its manifest."""
    return datasets.version(actor, name, ref)


@router.get(
    "/datasets/{name}/versions/{version}/blobs/{digest}",
    response_class=StreamingResponse,
    responses={200: BINARY},
)
def download(
    name: Name,
    version: Version,
    digest: Digest,
    request: Request,
    datasets: Datasets,
    actor: ActorAuth,
) -> StreamingResponse:
    size = datasets.blob(actor, name, version, digest)
    return StreamingResponse(
        blobs_of(request).read(digest),
        media_type="application/octet-stream",
        headers={"Content-Length": str(size), "X-Klique-Digest": digest},
    )

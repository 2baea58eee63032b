"""The request and response bodies of datasets (broker/api/datasets.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from broker.datasets.manifest import DATASET_NAME, DIGEST, MOST_FILES
from broker.names import PROJECT
from broker.tasks.schemas import _Body

DatasetName = Annotated[str, Field(pattern=DATASET_NAME)]
Digest = Annotated[str, Field(pattern=DIGEST)]
# Digests asked about at once (the SDK asks in batches of this many).
MOST_ASKED = 100_000
# Task ids listed for one version (a sweep of thousands reads one): the count says the rest.
MOST_READERS = 100


class FileEntry(_Body):
    """A file of a version: its content's SHA-256 and size (its path is the key above it)."""

    digest: Digest
    size: int = Field(ge=0, lt=2**63)


class VersionIn(_Body):
    """A new version of dataset `name`: its whole manifest (path -> digest, size), and the
    version it derives from. Every digest it names is its parent's, or a blob the caller sent
    (`PUT /datasets/blobs/DIGEST`), asked for first with `POST /datasets/blobs/missing`."""

    project: str = Field("default", pattern=PROJECT)
    parent: int | None = Field(None, ge=1, lt=2**31)
    files: dict[Annotated[str, Field(min_length=1, max_length=1024)], FileEntry] = Field(
        max_length=MOST_FILES
    )


class DigestsIn(_Body):
    digests: list[Digest] = Field(max_length=MOST_ASKED)


class MissingOut(BaseModel):
    missing: list[str]  # of the digests asked about, those the caller has not sent yet


class BlobOut(BaseModel):
    digest: str
    size: int


class DatasetVersionOut(BaseModel):
    name: str
    version: int
    id: str  # NAME@VERSION, what Dataset.get(dataset_id=) takes
    parent: int | None
    files: int
    size: int  # all its files
    new_size: int  # the content it added to its parent's
    created_by: str
    task_id: int | None  # the run that made it, where a run's token did
    created_at: float


class DatasetManifestOut(DatasetVersionOut):
    manifest: dict[str, FileEntry]


class DatasetVersionReadOut(DatasetVersionOut):
    """A version as a dataset's page lists it: with the tasks that read it."""

    reads: int  # how many tasks read it
    read_by: list[int]  # their ids, the first MOST_READERS of them


class DatasetOut(BaseModel):
    name: str
    owner: str
    team: str | None
    project: str
    latest: int
    files: int  # the newest version's
    size: int  # the newest version's bytes
    created_at: float


class DatasetDetailOut(DatasetOut):
    versions: list[DatasetVersionReadOut]


class DatasetReadOut(BaseModel):
    """A dataset version a task read: on the task's record."""

    name: str
    version: int
    time: float

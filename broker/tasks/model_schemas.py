"""The request and response bodies of the model registry (broker/api/models.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from broker.models.rules import MODEL_NAME, MOST_FILES
from broker.names import ARTIFACT, LINE
from broker.tasks.schemas import _Body

ModelName = Annotated[str, Field(pattern=MODEL_NAME)]
Stage = Literal["none", "staging", "production", "archived"]
Tag = Annotated[str, Field(min_length=1, max_length=100, pattern=LINE)]


class ModelFileIn(_Body):
    """A file of the new version: where it sits in the model, and the artifact of the run
    that holds its content (uploaded first, as any artifact, within the run's share)."""

    path: str = Field(min_length=1, max_length=1024)
    artifact: Annotated[str, Field(pattern=ARTIFACT)]


class ModelIn(_Body):
    """A new version of model `name`, made by run `task`."""

    name: ModelName
    task: int = Field(ge=1, lt=2**63)
    kind: Literal["file", "folder"] = "file"
    files: list[ModelFileIn] = Field(min_length=1, max_length=MOST_FILES)
    framework: str = Field("", max_length=64, pattern=LINE)
    metadata: dict[Annotated[str, Field(max_length=200)], Any] = Field({}, max_length=200)
    tags: list[Tag] = Field([], max_length=100)


class StageIn(_Body):
    stage: Stage


class ModelFileOut(BaseModel):
    path: str
    digest: str  # SHA-256 of the content
    size: int


class VersionOut(BaseModel):
    name: str
    version: int
    task_id: int  # the run that made it
    kind: Literal["file", "folder"]
    framework: str
    files: list[ModelFileOut]
    metadata: dict[str, Any]
    tags: list[str]
    metrics: dict[str, float]  # the run's last value of each scalar, at registration
    stage: Stage
    stage_by: str
    stage_at: float | None
    created_at: float


class ServingOut(BaseModel):
    """An app that serves a version (lineage: run -> model version -> endpoint)."""

    id: int
    app: str
    state: str
    route: str
    version: int
    ref: str  # the launch parameter it was resolved from (registry:NAME@production)


class ModelOut(BaseModel):
    name: str
    owner: str
    team: str | None
    project: str
    latest: int  # the highest version
    production: int | None  # the version in production, if any
    created_at: float


class ModelDetailOut(ModelOut):
    versions: list[VersionOut]
    serving: list[ServingOut]

"""The request and response bodies of the SDK's endpoints (broker/api/sdk.py, artifacts.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from broker.names import ARTIFACT, IMAGE, LINE, PROJECT
from broker.tasks.keeping import MAX_TAGS, Tag
from broker.tasks.schemas import Argument, CodeIn, Line, Name, RunIn, TaskOut, _Body

ArtifactName = Annotated[str, Field(pattern=ARTIFACT)]
ParamName = Annotated[str, Field(min_length=1, max_length=200, pattern=LINE)]
Parameters = Annotated[dict[ParamName, Any], Field(max_length=1000)]
TaskRef = Annotated[int, Field(ge=1, lt=2**63)]


class InputRef(_Body):
    """An artifact of another task that the new task is made to read (a pipeline step's input)."""

    task: TaskRef
    name: ArtifactName


class RecordIn(RunIn):
    """A task the SDK records: run locally (no resource: it runs where the SDK is), queued on a
    compute resource (a pipeline step), or reusing a completed task's outputs (`reuse`)."""

    name: str = Field("", max_length=200, pattern=LINE)
    project: str = Field("default", pattern=PROJECT)
    packages: list[Line] = Field([], max_length=10000)
    parameters: Parameters = {}
    parent: TaskRef | None = None
    inputs: list[InputRef] = Field([], max_length=1000)
    cache_key: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    reuse: TaskRef | None = None
    tags: list[Tag] = Field([], max_length=MAX_TAGS)


class StepsIn(_Body):
    """Pipeline steps to queue together (each with a resource, none reusing outputs)."""

    tasks: list[RecordIn] = Field(min_length=1, max_length=1_000_000)


class RemoteIn(_Body):
    """Where a task that runs locally goes, and what runs there (execute_remotely)."""

    resource: Name | None = None
    command: list[Argument] = Field(min_length=1, max_length=4096)
    code: CodeIn | None = None
    requirements: list[Line] = Field([], max_length=4096)
    image: str | None = Field(None, pattern=IMAGE)


class RecordOut(TaskOut):
    report_token: str | None = None  # a local run's token for its console and scalars, once


class ParametersIn(_Body):
    values: Parameters = {}
    overwrite: bool = True  # False: values already stored win (a remote run's edited values)


class ParametersOut(BaseModel):
    parameters: dict[str, Any]


class EndIn(_Body):
    outcome: Literal["completed", "failed"]
    exit_code: int | None = Field(None, ge=-(2**31), lt=2**31)
    reason: str = Field("", max_length=2000, pattern=LINE)


class CloneIn(_Body):
    parameters: Parameters = {}
    resource: Name | None = None
    name: str | None = Field(None, max_length=200, pattern=LINE)
    parent: TaskRef | None = None  # the pipeline it is a step of (a task the caller acts on)


class StepOut(BaseModel):
    id: int
    name: str
    state: str
    reason: str
    resource: str
    pool: str | None
    origin: str
    exit_code: int | None
    needs: list[int]  # the steps whose outputs it reads


class SettingsOut(BaseModel):
    pipeline_resource: str | None
    default_resource: str | None
    artifact_max_bytes: int

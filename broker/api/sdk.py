"""The SDK's endpoints: tasks recorded where they run (Task.init), their parameters, sending
one to a compute resource (execute_remotely), clones, pipeline steps and cached steps. Thin
over the task service (broker/tasks/records.py has the rules: who may do what, with a user's
credential or a task's report token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from broker.api.apps import Apps
from broker.api.tasks import Tasks
from broker.http.callers import ActorAuth, Auth
from broker.http.paths import API, TaskId
from broker.tasks.apps import clone_task
from broker.tasks.report_schemas import ReportKind, ReportOut
from broker.tasks.schemas import TaskOut
from broker.tasks.sdk_schemas import (
    CloneIn,
    EndIn,
    ParametersIn,
    ParametersOut,
    RecordIn,
    RecordOut,
    RemoteIn,
    SettingsOut,
    StepOut,
    StepsIn,
)

router = APIRouter(prefix=API)
ReportId = Annotated[int, Path(ge=1, lt=2**63, description="The report's id.")]


@router.get("/sdk/settings")
def settings(tasks: Tasks, actor: ActorAuth) -> SettingsOut:
    return tasks.sdk_settings()


@router.post("/sdk/tasks", status_code=201)
def record(body: RecordIn, tasks: Tasks, actor: ActorAuth) -> RecordOut:
    """Record a task: run here (no resource), queued on a resource, or reusing outputs."""
    return tasks.record(actor, body)


@router.post("/sdk/tasks/batch", status_code=201)
def record_steps(body: StepsIn, tasks: Tasks, actor: ActorAuth) -> list[TaskOut]:
    """Steps queued on compute resources, made together in one transaction: all, or none
    (the error names the first step that fails). A pipeline starts every ready step so."""
    return tasks.record_steps(actor, body)


@router.get("/sdk/tasks/{task_id}")
def get_record(task_id: TaskId, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    return tasks.get_record(actor, task_id)


@router.post("/sdk/tasks/{task_id}/parameters")
def parameters(
    task_id: TaskId, body: ParametersIn, tasks: Tasks, actor: ActorAuth
) -> ParametersOut:
    """Record parameters; with overwrite false, the values stored on the task win (a task
    cloned with edited values runs with them, whatever the script's defaults say)."""
    merged = tasks.merge_parameters(actor, task_id, body.values, body.overwrite)
    return ParametersOut(parameters=merged)


@router.post("/sdk/tasks/{task_id}/remote")
def execute_remotely(task_id: TaskId, body: RemoteIn, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    """A task running locally becomes the same task queued on a compute resource."""
    return tasks.send_remote(actor, task_id, body)


@router.post("/sdk/tasks/{task_id}/end")
def end(task_id: TaskId, body: EndIn, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    """A local run ends by its own word: no pool capacity was involved (SECURITY.md 7)."""
    return tasks.end(actor, task_id, body)


@router.post("/sdk/tasks/{task_id}/clone", status_code=201)
def clone(task_id: TaskId, body: CloneIn, tasks: Tasks, apps: Apps, actor: ActorAuth) -> TaskOut:
    """A new queued task with the same code, packages and parameters (edited)."""
    return clone_task(tasks, apps, actor, task_id, body)


@router.get("/sdk/tasks/{task_id}/steps")
def steps(task_id: TaskId, tasks: Tasks, actor: ActorAuth) -> list[StepOut]:
    """A pipeline's steps, each with the steps whose outputs it reads."""
    return tasks.steps(actor, task_id)


@router.post("/sdk/tasks/{task_id}/cancel")
async def cancel(task_id: TaskId, tasks: Tasks, actor: ActorAuth) -> TaskOut:
    """Cancel a task, or a pipeline's step with the pipeline's own token."""
    return await tasks.cancel_record(actor, task_id)


@router.get("/sdk/cached")
def cached(
    tasks: Tasks,
    actor: ActorAuth,
    key: Annotated[str, Query(pattern=r"^[0-9a-f]{64}$")],
) -> TaskOut:
    """The newest completed task of the caller with this cache key (same code and inputs);
    for a report token, the newest such step of its own pipeline run (reuse allows no other)."""
    return tasks.cached(actor, key)


@router.get("/tasks/{task_id}/reports")
def reports(
    task_id: TaskId,
    tasks: Tasks,
    who: Auth,
    kind: Annotated[ReportKind | None, Query(description="Only reports of this kind.")] = None,
) -> list[ReportOut]:
    """What the task reported beyond scalars (tables, images, plots, histograms, texts, single
    values, media), in order; an image's or media file's bytes are at its `file`."""
    return tasks.reports(who, task_id, kind)


@router.get("/tasks/{task_id}/reports/{report_id}/file", response_class=Response)
def report_file(task_id: TaskId, report_id: ReportId, tasks: Tasks, who: Auth) -> Response:
    """A report's file: a PNG or JPEG (known by its bytes) as an image, anything else as a
    download of opaque bytes, never as a page a browser would run (SECURITY.md)."""
    content, how = tasks.report_file(who, task_id, report_id)
    headers = {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": "private, max-age=3600",
    }
    if how.attachment:
        headers["Content-Disposition"] = f'attachment; filename="report-{report_id}.bin"'
    return Response(content, media_type=how.media_type, headers=headers)
